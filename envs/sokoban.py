"""Sokoban as a text environment (RAGEN's CoordSokoban, reference notes §4), with deterministic levels.

Levels follow gym-sokoban's recipe (reference notes §4.2), rewritten here as pure functions of
(configuration, seed): a random-walk room, the boxes placed on their targets, then *reverse play* (the
player may only pull boxes) explored depth-first to find the state that is hardest to undo, then a short
random walk of the player. Reversing a sequence of pulls is a sequence of pushes, and the final walk only
crosses free floor, so every generated level is solvable by construction.

Differences from the reference, on purpose:

- every random draw comes from a private ``random.Random`` seeded with a string derived from
  (seed, attempt) -- CPython seeds str via SHA-512, so levels never depend on ``PYTHONHASHSEED``, the global
  RNGs or the process (the reference's retry reseeds with ``hash(str(seed))``, flaw §7.4);
- failed attempts retry a bounded number of times and then raise, naming the seed and the configuration;
- the reverse search is iterative (no recursion limit for a large ``search_depth``);
- the instructions state the board's true coordinate range (flaw §7.2 of the FrozenLake port).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from numbers import Integral
from typing import Any, Iterable

from .base import TextEnv
from .registry import register_env

Cell = tuple[int, int]

# Action index -> (d_row, d_col); the order is SokobanEnv.action_names (Up, Down, Left, Right).
DIRECTIONS: tuple[Cell, ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))

STEP_REWARD, BOX_ON_REWARD, BOX_OFF_REWARD, SOLVED_REWARD = -0.1, 1.0, -1.0, 10.0  # gym-sokoban's values

WALL, EMPTY, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "√", "X", "P", "S"
OBSERVATION_FORMATS = ("grid", "coord", "grid_coord")
MIN_DIM = 5  # a 3x3 interior: the smallest room in which a box can be pulled off its target and back

# gym-sokoban's generation constants.
P_CHANGE_DIRECTION = 0.35
MAX_EXPLORED_STATES = 300_000
# The five floor masks of the random walk, as offsets from the walker (the 3x3 masks' ones).
_MASKS: tuple[tuple[Cell, ...], ...] = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)


@dataclass(frozen=True)
class Level:
    """An immutable Sokoban position: board size, walls, targets, boxes and the player, as (row, col) cells."""

    rows: int
    cols: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    def __post_init__(self) -> None:
        inside = lambda cell: 0 <= cell[0] < self.rows and 0 <= cell[1] < self.cols  # noqa: E731
        if not all(inside(c) for c in (*self.walls, *self.targets, *self.boxes, self.player)):
            raise ValueError("Level: every wall, target, box and the player must lie inside the board")
        if len(self.boxes) != len(self.targets) or not self.boxes:
            counts = f"{len(self.boxes)} boxes, {len(self.targets)} targets"
            raise ValueError(f"Level: needs as many boxes as targets, at least one (got {counts})")
        if (self.boxes | self.targets | {self.player}) & self.walls or self.player in self.boxes:
            raise ValueError("Level: boxes, targets and the player must be on free floor, the player not on a box")

    @classmethod
    def from_text(cls, text: str) -> Level:
        """Parse a grid drawn with the render symbols (``# _ O √ X P S``), one line per row (surrounding blank
        lines ignored); all rows must have the same length and there must be exactly one player."""
        lines = [line.strip() for line in text.strip("\n").splitlines()]
        if not lines or len({len(line) for line in lines}) != 1:
            raise ValueError("Level.from_text: give a non-empty rectangle of symbols, one line per row")
        cells: dict[str, set[Cell]] = {
            s: set() for s in (WALL, EMPTY, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET)
        }
        for r, line in enumerate(lines):
            for c, symbol in enumerate(line):
                if symbol not in cells:
                    raise ValueError(
                        f"Level.from_text: unknown symbol {symbol!r} at ({r}, {c}); use one of {''.join(cells)}"
                    )
                cells[symbol].add((r, c))
        players = cells[PLAYER] | cells[PLAYER_ON_TARGET]
        if len(players) != 1:
            raise ValueError(f"Level.from_text: exactly one player (P or S) is needed, found {len(players)}")
        return cls(
            rows=len(lines),
            cols=len(lines[0]),
            walls=frozenset(cells[WALL]),
            targets=frozenset(cells[TARGET] | cells[BOX_ON_TARGET] | cells[PLAYER_ON_TARGET]),
            boxes=frozenset(cells[BOX] | cells[BOX_ON_TARGET]),
            player=next(iter(players)),
        )


# --- level generation ------------------------------------------------------------------------------------


def _carve_room(rows: int, cols: int, num_steps: int, rng: random.Random) -> list[Cell]:
    """Floor cells of a random-walk room (sorted); the border always stays wall."""
    direction = rng.choice(DIRECTIONS)
    r, c = rng.randint(1, rows - 2), rng.randint(1, cols - 2)
    floor: set[Cell] = set()
    for _ in range(num_steps):
        if rng.random() < P_CHANGE_DIRECTION:
            direction = rng.choice(DIRECTIONS)
        # Clamped to the interior so the 3x3 mask never leaves the board.
        r = min(max(r + direction[0], 1), rows - 2)
        c = min(max(c + direction[1], 1), cols - 2)
        floor.update((r + dr, c + dc) for dr, dc in rng.choice(_MASKS))
    return sorted((fr, fc) for fr, fc in floor if 0 < fr < rows - 1 and 0 < fc < cols - 1)


def _reverse_play(
    cols: int, floor: set[int], player: int, targets: tuple[int, ...], search_depth: int
) -> tuple[int, tuple[int, ...], int]:
    """Depth-first reverse play from the solved position (flat cell indices r*cols+c): the player moves and
    pulls the box behind it. Each position is scored once, when first reached: box_swaps (how often the pulled
    box changed) x the boxes' Manhattan distance from their own targets, 0 while any box covers a target.
    Returns (player, boxes by identity, score) of the best position; score 0 means no box could be freed."""
    deltas = (-cols, cols, -1, 1)
    target_set = set(targets)
    best: tuple[int, tuple[int, ...], int] = (player, targets, 0)
    explored: set[tuple[int, tuple[int, ...]]] = set()
    # (player, boxes indexed like targets, box swaps, last pulled box, depth); children pushed in reverse so
    # they pop in action order, like the reference's recursion.
    stack = [(player, targets, 0, -1, 0)]
    while stack and len(explored) < MAX_EXPLORED_STATES:
        pos, boxes, swaps, last, depth = stack.pop()
        key = (pos, tuple(sorted(boxes)))
        if key in explored:
            continue
        explored.add(key)
        if swaps and not target_set.intersection(boxes):
            score = swaps * sum(abs(b // cols - t // cols) + abs(b % cols - t % cols) for b, t in zip(boxes, targets))
            if score > best[2]:
                best = (pos, boxes, score)
        if depth >= search_depth:
            continue
        for delta in reversed(deltas):
            nxt = pos + delta
            if nxt not in floor or nxt in boxes:
                continue
            behind = pos - delta
            if behind in boxes:  # pull: the box follows the player onto its old cell
                i = boxes.index(behind)
                pulled = boxes[:i] + (pos,) + boxes[i + 1 :]
                stack.append((nxt, pulled, swaps + (i != last), i, depth + 1))
            else:
                stack.append((nxt, boxes, swaps, last, depth + 1))
    return best


def _attempt(
    rows: int, cols: int, num_boxes: int, search_depth: int, num_gen_steps: int, rng: random.Random
) -> Level | None:
    """One generation attempt; None when the room is too small or no box could be pulled off its target."""
    floor_cells = _carve_room(rows, cols, num_gen_steps, rng)
    if len(floor_cells) <= num_boxes + 1:  # the player needs a free cell to start pulling
        return None
    player = rng.choice(floor_cells)
    targets = rng.sample([cell for cell in floor_cells if cell != player], num_boxes)
    flat = lambda cell: cell[0] * cols + cell[1]  # noqa: E731
    floor = {flat(cell) for cell in floor_cells}
    pos, boxes, score = _reverse_play(cols, floor, flat(player), tuple(flat(t) for t in targets), search_depth)
    if score <= 0:
        return None
    # RAGEN's final player walk: 1-3 non-revisiting steps over free floor (never a push), more likely when the
    # box moved a single cell (otherwise the player always starts right next to it).
    distance = sum(abs(b // cols - t[0]) + abs(b % cols - t[1]) for b, t in zip(boxes, targets))
    if rng.random() <= (0.8 if distance == 1 else 0.5):
        visited = {pos}
        for step in range(3):
            options = [
                n
                for n in (pos - cols, pos + cols, pos - 1, pos + 1)
                if n in floor and n not in boxes and n not in visited
            ]
            if not options:
                break
            pos = rng.choice(options)
            visited.add(pos)
            if step == 2 or rng.random() > 0.5:
                break
    floor_set = set(floor_cells)
    return Level(
        rows=rows,
        cols=cols,
        walls=frozenset((r, c) for r in range(rows) for c in range(cols) if (r, c) not in floor_set),
        targets=frozenset(targets),
        boxes=frozenset(divmod(b, cols) for b in boxes),
        player=divmod(pos, cols),
    )


@functools.lru_cache(maxsize=4096)
def _generate_cached(
    dim_room: Cell, num_boxes: int, search_depth: int, num_gen_steps: int, seed: int, max_attempts: int
) -> Level:
    rows, cols = dim_room
    for attempt in range(max_attempts):
        # str seeds go through SHA-512 in CPython: stable across processes, unlike hash() (flaw §7.4).
        rng = random.Random(f"sokoban:{seed}:{attempt}")
        level = _attempt(rows, cols, num_boxes, search_depth, num_gen_steps, rng)
        if level is not None:
            return level
    raise RuntimeError(
        f"no solvable Sokoban level for seed={seed} with dim_room={dim_room}, num_boxes={num_boxes}, "
        f"search_depth={search_depth}, num_gen_steps={num_gen_steps} after {max_attempts} attempts; "
        "use a larger room or num_gen_steps, fewer boxes, or a larger search_depth"
    )


def generate_level(
    dim_room: Iterable[int],
    num_boxes: int,
    search_depth: int,
    num_gen_steps: int | None,
    seed: int,
    max_attempts: int = 100,
) -> Level:
    """The level for ``seed`` under this configuration: a pure, cached function of its arguments (a group of
    episodes sharing a seed generates once). ``num_gen_steps`` None -> int(1.7 * (rows + cols)). Raises
    RuntimeError when ``max_attempts`` attempts all fail."""
    rows, cols = (int(d) for d in dim_room)
    steps = int(1.7 * (rows + cols)) if num_gen_steps is None else int(num_gen_steps)
    return _generate_cached((rows, cols), int(num_boxes), int(search_depth), steps, int(seed), int(max_attempts))


# --- the environment -------------------------------------------------------------------------------------


def _check_int(name: str, value: Any, minimum: int, example: str, maximum: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, Integral)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be an integer {bound} (got {value!r}); e.g. {name}={example}")
    return int(value)


def _cells(cells: Iterable[Cell]) -> str:
    return ", ".join(f"({r}, {c})" for r, c in sorted(cells))


@register_env("sokoban")
class SokobanEnv(TextEnv):
    """Push every box onto a target (gym-sokoban dynamics and rewards; see the module docstring).

    ``dim_room``: (rows, cols), border walls included, each >= 5; ``num_boxes``; ``search_depth``: the most
    reverse-play moves from the solved position; ``max_steps``: the environment's own move limit (done when
    reached); ``num_gen_steps``: random-walk steps (None: int(1.7 * (rows + cols))); ``observation_format``:
    "grid", "coord" or "grid_coord"; ``max_generation_attempts``: tries per seed before reset raises."""

    action_names = ("Up", "Down", "Left", "Right")
    ragen_name = "sokoban"  # envs/prompts.py: upstream's SimpleSokoban / CoordSokoban instruction texts

    def __init__(
        self,
        dim_room: tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = 300,
        max_steps: int = 100,
        num_gen_steps: int | None = None,
        observation_format: str = "grid_coord",
        max_generation_attempts: int = 100,
    ) -> None:
        if not isinstance(dim_room, (tuple, list)) or len(dim_room) != 2:
            raise ValueError(f"dim_room must be a (rows, cols) pair (got {dim_room!r}); e.g. dim_room=(6, 6)")
        if any(isinstance(d, bool) or not isinstance(d, Integral) or d < MIN_DIM for d in dim_room):
            raise ValueError(
                f"dim_room must be two integers >= {MIN_DIM} (rows, cols) (got {dim_room!r}); e.g. dim_room=(6, 6)"
            )
        rows, cols = self.dim_room = (int(dim_room[0]), int(dim_room[1]))
        interior = (rows - 2) * (cols - 2)
        # Leave at least one interior cell besides the boxes and the player (the walk rarely carves them all).
        self.num_boxes = _check_int("num_boxes", num_boxes, 1, "1", maximum=interior - 2)
        self.search_depth = _check_int("search_depth", search_depth, 1, "300")
        self.max_steps = _check_int("max_steps", max_steps, 1, "100")
        if num_gen_steps is not None:
            num_gen_steps = _check_int("num_gen_steps", num_gen_steps, 1, "None (1.7 x (rows + cols))")
        self.num_gen_steps = num_gen_steps
        if observation_format not in OBSERVATION_FORMATS:
            raise ValueError(
                f"observation_format must be one of {OBSERVATION_FORMATS} (got {observation_format!r}); "
                "e.g. observation_format='grid_coord'"
            )
        self.observation_format = observation_format
        self.max_generation_attempts = _check_int(
            "max_generation_attempts", max_generation_attempts, 1, "100", maximum=10_000
        )
        self._level: Level | None = None
        self._player: Cell = (0, 0)
        self._boxes: set[Cell] = set()
        self._steps = 0

    # --- episode ---------------------------------------------------------------------------------

    def reset(self, seed: int) -> str:
        """Start the generated level for ``seed``; return the observation."""
        level = generate_level(
            self.dim_room, self.num_boxes, self.search_depth, self.num_gen_steps, seed, self.max_generation_attempts
        )
        return self.load_level(level)

    def load_level(self, level: Level) -> str:
        """Start an episode on a given (e.g. hand-made) level; return the observation."""
        self._level = level
        self._player, self._boxes, self._steps = level.player, set(level.boxes), 0
        return self.render()

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, cols) of the board (the loaded level's, else ``dim_room``)."""
        return (self._level.rows, self._level.cols) if self._level is not None else self.dim_room

    @property
    def level(self) -> Level | None:
        """The level the current episode started from (None before the first reset)."""
        return self._level

    @property
    def steps(self) -> int:
        """Primitive moves made in this episode (wall bumps included)."""
        return self._steps

    @property
    def success(self) -> bool:
        """Every box is on a target."""
        return self._level is not None and self._boxes == self._level.targets

    @property
    def done(self) -> bool:
        """Solved, or ``max_steps`` moves made; also True before any level is loaded (nothing to play)."""
        return self._level is None or self.success or self._steps >= self.max_steps

    def _free(self, cell: Cell) -> bool:
        """Inside the board and not a wall (hand-made levels need no border of walls)."""
        level = self._level
        return 0 <= cell[0] < level.rows and 0 <= cell[1] < level.cols and cell not in level.walls

    def _move(self, index: int) -> tuple[float, bool, bool]:
        """Walk or push one cell; -0.1 per move, +1/-1 per box onto/off a target, +10 when all are on."""
        if self.done or not 0 <= index < len(DIRECTIONS):
            return 0.0, self.done, False
        self._steps += 1
        reward, changed = STEP_REWARD, False
        (dr, dc), (r, c) = DIRECTIONS[index], self._player
        nxt, beyond = (r + dr, c + dc), (r + 2 * dr, c + 2 * dc)
        if self._free(nxt) and nxt not in self._boxes:
            self._player, changed = nxt, True
        elif nxt in self._boxes and self._free(beyond) and beyond not in self._boxes:
            targets = self._level.targets
            self._boxes.remove(nxt)
            self._boxes.add(beyond)
            reward += BOX_ON_REWARD * (beyond in targets) + BOX_OFF_REWARD * (nxt in targets)
            self._player, changed = nxt, True
        if self.success:
            reward += SOLVED_REWARD
        return reward, self.done, changed

    # --- text ------------------------------------------------------------------------------------

    def _symbol(self, cell: Cell) -> str:
        on_target = cell in self._level.targets
        if cell in self._level.walls:
            return WALL
        if cell in self._boxes:
            return BOX_ON_TARGET if on_target else BOX
        if cell == self._player:
            return PLAYER_ON_TARGET if on_target else PLAYER
        return TARGET if on_target else EMPTY

    def _grid(self) -> str:
        level = self._level
        return "\n".join("".join(self._symbol((r, c)) for c in range(level.cols)) for r in range(level.rows))

    def _coordinates(self, with_walls: bool) -> str:
        level = self._level
        rows, cols = level.rows, level.cols
        lines = [f"Board size: {rows} rows x {cols} cols (zero-indexed)."]  # upstream utils.py:47-69
        player_key = "Player on target" if self._player in level.targets else "Player"
        # Targets lists every target (covered or not, as the reference does); Boxes only those off a target.
        entries = [
            ("Walls", level.walls if with_walls else ()),
            ("Targets", level.targets),
            ("Boxes", self._boxes - level.targets),
            ("Boxes on target", self._boxes & level.targets),
            (player_key, (self._player,)),
        ]
        lines += [f"{name}: {_cells(cells)}" for name, cells in entries if cells]
        return "\n".join(lines)

    def render(self) -> str:
        """The state in ``observation_format``: the symbol grid, the coordinate list, or both."""
        if self._level is None:
            return "(no level loaded: call reset(seed) first)"
        if self.observation_format == "grid":
            return self._grid()
        if self.observation_format == "coord":
            return self._coordinates(with_walls=True)
        # upstream env.py:75-77 (walls left out of the coordinates, as upstream's collect_entity_coordinates does)
        return "Coordinates: \n" + self._coordinates(with_walls=False) + "\n" + "Grid Map: \n" + self._grid()

    def instructions(self) -> str:
        """The rules, the symbols and the coordinate range of this board."""
        rows, cols = (self._level.rows, self._level.cols) if self._level is not None else self.dim_room
        shown = {
            "grid": "You see the board as a grid of symbols, one line per row.",
            "coord": "You see the board as lists of (row, column) coordinates of walls, targets, boxes and "
            "the player.",
            "grid_coord": "You see the coordinates of the targets, boxes and player, then the board as a grid of "
            "symbols, one line per row.",
        }[self.observation_format]
        return (
            "You are solving a Sokoban puzzle. You are the player, and your goal is to push every box onto a target; "
            "the puzzle is solved when all boxes are on targets.\n"
            f"{shown}\n"
            f"Symbols: {WALL} wall, {EMPTY} empty floor, {TARGET} target, {BOX} box, {BOX_ON_TARGET} box on a target, "
            f"{PLAYER} player, {PLAYER_ON_TARGET} player standing on a target.\n"
            f"Coordinates are zero-indexed (row, column): this board has {rows} rows and {cols} columns, so rows run "
            f"from 0 (top) to {rows - 1} (bottom) and columns from 0 (left) to {cols - 1} (right). "
            "Up decreases the row, Down increases it, Left decreases the column, Right increases it.\n"
            "Rules: moving into a box pushes it one cell in the same direction, but only if the cell behind it is "
            "free floor or a target (not a wall, not another box). You can never pull a box, and walls block both "
            "you and the boxes, so a box pushed into a corner can never be moved again.\n"
            "Answer with your moves in order, for example: <answer>Right || Up</answer>\n"
        )
