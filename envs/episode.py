"""One multi-turn episode's bookkeeping: prompts in RAGEN's layout, parsing, penalties, return, success.

Pure Python (no tokens, no model): the rollout (trainer/rollout/multi_turn.py) asks an :class:`Episode` for the
messages to show, hands it each sampled response text, and reads back whether the episode goes on.
Rules (reference notes §3.3-3.5):

- a turn's actions are parsed from ``<think>…</think><answer>a1 || a2</answer>`` (envs/parsing.py), at most
  ``max_actions_per_turn`` of them, and at most the actions left of ``max_actions_per_episode``;
- a turn gets ``format_penalty`` (−0.1) when it has no action or one of its (truncated) actions is a name the
  environment does not know -- names past the truncation are never looked at, as in RAGEN; the known ones still
  run, in order, until the environment is done; after a turn without any valid action the next observation says so
  and the state is unchanged;
- the episode ends when the environment is done, the action budget is spent or ``max_turns`` turns were
  played; ``episode_return`` = Σ environment rewards + Σ format penalties; ``success`` is the
  environment's own success flag (logged separately, never mixed into the return).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import TextEnv
from .parsing import parse_turn
from .prompts import PROMPT_STYLES, ragen_system_message

SYSTEM_PREFIX = "You're a helpful assistant. "
NO_ACTION_WARNING = "No valid action provided previously. Environment state remains the same. Please try again.\n"


@dataclass(frozen=True)
class EpisodeSettings:
    """Turn and action limits of an episode (RAGEN's defaults for Sokoban and FrozenLake)."""

    max_turns: int = 5
    max_actions_per_turn: int = 2
    max_actions_per_episode: int = 10
    format_penalty: float = -0.1
    require_think: bool = True
    max_tokens_hint: int = 120  # the length stated in the prompt (RAGEN's max_tokens); the real cap is the rollout's
    prompt_style: str = "ragen"  # "ragen": upstream's instruction texts (envs/prompts.py); "detailed": ours

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_actions_per_turn", "max_actions_per_episode", "max_tokens_hint"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.format_penalty > 0:
            raise ValueError(f"format_penalty is a penalty: use a value <= 0 (got {self.format_penalty})")
        if self.prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {PROMPT_STYLES} (got {self.prompt_style!r})")


@dataclass
class TurnRecord:
    """What happened in one turn."""

    actions: tuple[str, ...]  # parsed names (after truncation)
    valid: int  # names the environment recognised
    executed: int  # primitive moves made
    reward: float  # environment reward of the turn
    penalty: float  # format penalty of the turn (0 or settings.format_penalty)


@dataclass
class Episode:
    """One environment instance played turn by turn."""

    env: TextEnv
    seed: int
    settings: EpisodeSettings = field(default_factory=EpisodeSettings)
    turns: list[TurnRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.observation = self.env.reset(self.seed)
        self.actions_left = self.settings.max_actions_per_episode
        self._warn = False

    # --- prompts ---------------------------------------------------------------------------------

    def system_message(self) -> str:
        """The rules, the action vocabulary and the answer format: RAGEN's (envs/prompts.py; an environment without
        upstream texts puts its own rules in RAGEN's layout) or, with prompt_style "detailed", ours."""
        s = self.settings
        if s.prompt_style == "ragen":
            if getattr(self.env, "ragen_name", None) is not None:
                return ragen_system_message(self.env, s.max_actions_per_episode)
            return (SYSTEM_PREFIX + self.env.instructions() + "\nYour available actions are:\n"
                    + ", ".join(self.env.action_names)
                    + f"\nYou can make up to {s.max_actions_per_episode} actions, "
                    'separated by the action separator " || "\n')
        names = ", ".join(self.env.action_names)
        return (
            SYSTEM_PREFIX
            + self.env.instructions()
            + f"\nYour available actions are:\n{names}\n"
            + f"You can make up to {s.max_actions_per_turn} actions per turn "
            f"and {s.max_actions_per_episode} in total, "
            + 'separated by the action separator " || "\n'
        )

    def turn_block(self) -> str:
        """The state block of the current turn (RAGEN's user message for turn k)."""
        s = self.settings
        warning = NO_ACTION_WARNING if self._warn else ""
        return (
            f"\nTurn {len(self.turns) + 1}:\nState:\n{self.observation}\n{warning}"
            f"You have {self.actions_left} actions left. Always output: <think> [Your thoughts] </think> "
            "<answer> [your answer] </answer> with no extra text. Strictly follow this format. "
            f"Max response length: {s.max_tokens_hint} words (tokens).\n"
        )

    def first_messages(self) -> list[dict[str, str]]:
        """System + first user turn."""
        return [{"role": "system", "content": self.system_message()}, {"role": "user", "content": self.turn_block()}]

    def next_user_message(self) -> dict[str, str]:
        """The user message after a turn: the last turn's environment reward, then the next state block. The reward is
        printed as upstream prints it (es_manager.py:183-203, ctx_manager.py:1345-1346): ``0`` when no move ran (its
        int accumulator), else Python's float text of the summed move rewards; format penalties are not in it."""
        turn = self.turns[-1]
        reward = str(0 + turn.reward) if turn.executed else "0"
        return {"role": "user", "content": f"Reward:\n{reward}\n" + self.turn_block()}

    # --- play ------------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """The environment finished, the action budget is spent, or every turn was played."""
        return self.env.done or self.actions_left <= 0 or len(self.turns) >= self.settings.max_turns

    def play(self, response: str) -> TurnRecord:
        """Apply one sampled response (any text). Never raises on the text's content."""
        if self.done:
            raise RuntimeError("play() called on a finished episode")
        s = self.settings
        parsed = parse_turn(response, min(s.max_actions_per_turn, self.actions_left), s.require_think)
        known = [a for a in parsed.actions if self.env.action_index(a) is not None]
        penalty = s.format_penalty if (not known or len(known) != len(parsed.actions)) else 0.0
        result = self.env.step(known) if known else None
        record = TurnRecord(
            actions=parsed.actions,
            valid=len(known),
            executed=result.info["executed"] if result else 0,
            reward=result.reward if result else 0.0,
            penalty=penalty,
        )
        if result is not None:
            self.observation = result.observation
        self.actions_left -= record.executed
        self._warn = not known
        self.turns.append(record)
        return record

    # --- outcome ---------------------------------------------------------------------------------

    @property
    def episode_return(self) -> float:
        """Σ environment rewards + Σ format penalties."""
        return sum(t.reward + t.penalty for t in self.turns)

    @property
    def success(self) -> bool:
        """The environment's success flag."""
        return bool(self.env.success)

    def summary(self) -> dict[str, Any]:
        """Per-episode numbers for reward functions and logs."""
        return {
            "episode_return": self.episode_return,
            "success": self.success,
            "num_turns": len(self.turns),
            "num_actions": sum(t.executed for t in self.turns),
            "penalised_turns": sum(t.penalty != 0 for t in self.turns),
        }
