"""``Line``: the smallest text environment (envs/base.py's ``TextEnv``), shared by the episode-rule and rollout
tests."""

from __future__ import annotations

from envs.base import TextEnv


class Line(TextEnv):
    """A 1-D walk: start at cell 0 of 4, goal at 3; each move -0.1, +1 on reaching the goal."""

    action_names = ("Left", "Right")

    def reset(self, seed: int) -> str:
        self.pos, self.moves = 0, 0
        return self.render()

    def _move(self, index: int):
        old = self.pos
        self.pos = min(3, max(0, self.pos + (1 if index == 1 else -1)))
        self.moves += 1
        return (-0.1 + (1.0 if self.success else 0.0)), self.done, old != self.pos

    def render(self) -> str:
        return "".join("P" if k == self.pos else "_" for k in range(4))

    def instructions(self) -> str:
        return "Walk to the right end."

    @property
    def done(self) -> bool:
        return self.success

    @property
    def success(self) -> bool:
        return self.pos == 3
