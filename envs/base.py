"""The contract every text environment implements: gymnasium-style, text in and text out.

An environment is a game whose state the model sees as text and whose moves the model names in words
("Up", "left", ...). :class:`TextEnv` fixes the small surface the multi-turn rollout (trainer/rollout/multi_turn.py)
and the episode bookkeeping (envs/episode.py) rely on:

- ``reset(seed) -> observation``: the level is a pure function of (constructor arguments, seed) -- no global
  RNG, no ``hash()`` -- so every process, every ``PYTHONHASHSEED`` and every resumed run sees the same level;
- ``step(actions) -> StepResult``: executes the *names* it recognises, in order, until the episode ends;
  names it does not recognise are skipped and counted, never raised on (model output is arbitrary text);
- ``action_names``, :meth:`instructions` (the rules, for the system prompt) and :meth:`render` (the state).

Subclasses implement ``reset``, ``_move`` (one primitive action), ``render``, ``instructions`` and
``success``; :meth:`step` and the case-insensitive name lookup live here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True)
class StepResult:
    """What :meth:`TextEnv.step` returns (gymnasium's tuple, with the observation as text)."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class TextEnv(ABC):
    """Base class of the text environments (see the module docstring for the contract)."""

    #: Canonical action names, in the order of their internal indices; matched case-insensitively.
    action_names: tuple[str, ...] = ()

    def action_index(self, name: str) -> int | None:
        """Internal index of an action name (case and surrounding whitespace ignored), None if unknown."""
        if not isinstance(name, str):
            return None
        key = name.strip().lower()
        for index, known in enumerate(self.action_names):
            if known.lower() == key:
                return index
        return None

    def step(self, actions: Sequence[str]) -> StepResult:
        """Execute the recognised action names in order; stop as soon as the episode is done.

        ``info``: ``success`` (bool), ``executed`` (primitive moves made), ``effective`` (moves that changed
        the state), ``unknown`` (names not recognised, skipped). Rewards of the executed moves are summed."""
        reward, done = 0.0, self.done
        executed = effective = unknown = 0
        for name in actions:
            if done:
                break
            index = self.action_index(name)
            if index is None:
                unknown += 1
                continue
            move_reward, done, changed = self._move(index)
            reward += move_reward
            executed += 1
            effective += int(changed)
        info = {"success": self.success, "executed": executed, "effective": effective, "unknown": unknown}
        return StepResult(self.render(), reward, done, info)

    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start the level for ``seed`` (a pure function of the constructor arguments and ``seed``); return the
        observation text."""

    @abstractmethod
    def _move(self, index: int) -> tuple[float, bool, bool]:
        """Apply one primitive action; return (reward, done, whether the state changed)."""

    @abstractmethod
    def render(self) -> str:
        """The current state as the text the model sees."""

    @abstractmethod
    def instructions(self) -> str:
        """The rules of the game for the system prompt (what the symbols mean, what the goal is)."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """Whether the episode has ended (solved, failed, or the environment's own step limit)."""

    @property
    @abstractmethod
    def success(self) -> bool:
        """Whether the episode ended in the goal state."""
