"""A breadth-first Sokoban solver for the tests, written independently of the environment's own move code so
that replaying its solutions through ``SokobanEnv.step`` cross-checks the dynamics."""

from __future__ import annotations

from collections import deque

# Same order and names as SokobanEnv.action_names.
MOVES = (("Up", -1, 0), ("Down", 1, 0), ("Left", 0, -1), ("Right", 0, 1))


def solve(level, max_states: int = 2_000_000) -> list[str] | None:
    """Shortest list of action names (fewest primitive moves) that puts every box of ``level`` (an
    ``envs.sokoban.Level``) on a target; ``[]`` if already solved; None if unsolvable or more than
    ``max_states`` positions would have to be explored."""
    rows, cols, walls, targets = level.rows, level.cols, level.walls, frozenset(level.targets)

    def open_cell(r: int, c: int) -> bool:
        return 0 <= r < rows and 0 <= c < cols and (r, c) not in walls

    start = (level.player, frozenset(level.boxes))
    if start[1] == targets:
        return []
    parents: dict = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        (pr, pc), boxes = state
        for name, dr, dc in MOVES:
            nr, nc = pr + dr, pc + dc
            if not open_cell(nr, nc):
                continue
            if (nr, nc) in boxes:
                br, bc = nr + dr, nc + dc
                if not open_cell(br, bc) or (br, bc) in boxes:
                    continue
                new_boxes = (boxes - {(nr, nc)}) | {(br, bc)}
            else:
                new_boxes = boxes
            new_state = ((nr, nc), new_boxes)
            if new_state in parents:
                continue
            parents[new_state] = (state, name)
            if new_boxes == targets:
                path = []
                while parents[new_state] is not None:
                    new_state, move = parents[new_state]
                    path.append(move)
                return path[::-1]
            if len(parents) > max_states:
                return None
            queue.append(new_state)
    return None
