"""Sokoban with the player standing on a target, as RAGEN scores and shows it (issue 20 item 7).

The oracle is upstream's code ported onto its numeric room arrays (wall 0, floor 1, target 2, box on target 3,
box 4, player 5): the dynamics and reward of gym-sokoban's ``SokobanEnv`` that mll-lab-nu/RAGEN@20daedc
ragen/env/sokoban/env.py:51 calls (``_push``/``_move``; ``_calc_reward``: -0.1 per step, the box count
``num_boxes - #(empty targets | targets under the player)`` compared with the previous count for +1/-1, +10 when no
target is empty or hidden by the player), RAGEN's own ``boxes_on_target = 0`` at reset (env.py:42) and
``success = boxes_on_target == num_boxes`` (env.py:54), and its text rendering: the grid with a player on a target
drawn 'S' (env.py:70-71, config.py:10) and the coordinate list of utils.py:22-68 (walls left out in grid_coord).
A hand-made two-box level walks the player onto and off targets, pushes a box off a target so that the player
lands on it, and solves the level; after every move the observation string, reward, done and success must be
upstream's."""

from __future__ import annotations

import numpy as np
import pytest

from envs.sokoban import Level, SokobanEnv

LOOKUP = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}  # config.py:10
CHANGE = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}  # gym-sokoban CHANGE_COORDINATES


class UpstreamSokoban:
    """gym-sokoban's step and reward with RAGEN's reset counter, success flag and text rendering."""

    def __init__(self, level: Level):
        self.fixed = np.ones((level.rows, level.cols), dtype=int)
        for cell in level.walls:
            self.fixed[cell] = 0
        for cell in level.targets:
            self.fixed[cell] = 2
        self.state = self.fixed.copy()
        for cell in level.boxes:
            self.state[cell] = 3 if self.fixed[cell] == 2 else 4
        self.state[level.player] = 5
        self.player = np.array(level.player)
        self.num_boxes, self.boxes_on_target, self.steps, self.max_steps = len(level.boxes), 0, 0, 100

    def _move(self, change):
        new = self.player + change
        if self.state[tuple(new)] in (1, 2):
            self.state[tuple(new)] = 5
            self.state[tuple(self.player)] = self.fixed[tuple(self.player)]
            self.player = new
            return True
        return False

    def _push(self, change):
        new = self.player + change
        beyond = new + change
        if beyond[0] >= self.state.shape[0] or beyond[1] >= self.state.shape[1]:
            return False
        if self.state[tuple(new)] in (3, 4) and self.state[tuple(beyond)] in (1, 2):
            self.state[tuple(beyond)] = 3 if self.fixed[tuple(beyond)] == 2 else 4
            self.state[tuple(new)] = 5
            self.state[tuple(self.player)] = self.fixed[tuple(self.player)]
            self.player = new
            return True
        return self._move(change)

    def _all_on_target(self):
        hidden = (self.fixed == 2) & (self.state == 5)
        return not np.any((self.state == 2) | hidden)

    def step(self, name: str):
        self.steps += 1
        self._push(np.array(CHANGE[name]))
        reward = -0.1
        hidden = (self.fixed == 2) & (self.state == 5)
        current = self.num_boxes - int(np.count_nonzero((self.state == 2) | hidden))
        if current > self.boxes_on_target:
            reward += 1.0
        elif current < self.boxes_on_target:
            reward -= 1.0
        if self._all_on_target():
            reward += 10.0
        self.boxes_on_target = current
        done = self._all_on_target() or self.steps == self.max_steps
        return reward, done, self.boxes_on_target == self.num_boxes

    def grid(self) -> str:
        room = np.where((self.state == 5) & (self.fixed == 2), 6, self.state)
        return "\n".join("".join(LOOKUP[int(v)] for v in row) for row in room)

    def grid_coord(self) -> str:
        cells = lambda mask: [(int(r), int(c)) for r, c in np.argwhere(mask)]  # noqa: E731
        on = (self.state == 5) & (self.fixed == 2)
        entries = [("Targets", cells(self.fixed == 2)), ("Boxes", cells(self.state == 4)),
                   ("Boxes on target", cells(self.state == 3)), ("Player", cells((self.state == 5) & ~on)),
                   ("Player on target", cells(on))]
        lines = [f"Board size: {self.state.shape[0]} rows x {self.state.shape[1]} cols (zero-indexed)."]
        lines += [f"{label}: " + ", ".join(f"({r}, {c})" for r, c in found) for label, found in entries if found]
        return "Coordinates: \n" + "\n".join(lines) + "\n" + "Grid Map: \n" + self.grid()


LEVEL = """
#######
#__O__#
#__X__#
#_P_XO#
#_____#
#######
"""
# walk, push onto a target, bump, walk onto a target (S) and off, push a box off its target so the player stands on
# it (S, -1.1), push it back (+0.9), then solve (+10.9)
MOVES = ["Right", "Right", "Right", "Up", "Left", "Up", "Down",
         "Down", "Down", "Right", "Right", "Up",
         "Left", "Up", "Up", "Right", "Down",
         "Left", "Left", "Down", "Left", "Up", "Left", "Up", "Right"]


@pytest.mark.parametrize("fmt", ["grid", "grid_coord"])
def test_player_on_target_moves_match_upstream(fmt):
    level = Level.from_text(LEVEL)
    ours, upstream = SokobanEnv(dim_room=(6, 7), observation_format=fmt), UpstreamSokoban(level)
    first = ours.load_level(level)
    assert first == (upstream.grid() if fmt == "grid" else upstream.grid_coord())
    seen_on_target, rewards = 0, []
    for name in MOVES:
        result = ours.step([name])
        reward, done, success = upstream.step(name)
        expected = upstream.grid() if fmt == "grid" else upstream.grid_coord()
        assert result.observation == expected, name
        assert result.reward == pytest.approx(reward, abs=1e-12) and result.done == done
        assert result.info["success"] == success
        seen_on_target += "S" in expected
        rewards.append(round(result.reward, 6))
    assert seen_on_target >= 2 and done and success
    assert rewards.count(-1.1) == 1 and rewards[-1] == 10.9  # pushed off a target onto which the player steps; solved
    if fmt == "grid_coord":
        assert "Player on target" not in ours.render()
