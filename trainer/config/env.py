"""Recipe fields of the multi-turn environment tasks (Sokoban, FrozenLake), mixed into ``TaskArguments``.

They take effect when ``dataset_name`` names an environment (trainer/data/envs.py); the trainer then plays
episodes through the multi-turn rollout (trainer/rollout/multi_turn.py). Defaults are RAGEN's (reference notes §3,
§8): 5 turns, 2 actions per turn, 10 per episode, format penalty -0.1, 400 sampled tokens per turn, validation
at temperature 0.5 on 512 held-out levels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal, get_args

from trainer.config.errors import ConfigError

EnvPrompt = Literal["ragen", "detailed"]  # the environment's system prompt (envs/prompts.py)


@dataclass
class EnvTaskFields:
    """Environment and episode settings (used only with dataset_name: sokoban | frozenlake)."""

    env_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Constructor arguments of the environment, e.g. {dim_room: [6, 6], num_boxes: 1} for "
                  "sokoban or {size: 4, p: 0.8, success_rate: 0.8} for frozenlake (see envs/)."},
    )
    max_turns: int = field(default=5, metadata={"help": "Turns per episode (one generation call each)."})
    max_actions_per_turn: int = field(
        default=2,
        metadata={"help": "Actions read from one answer (`Up || Left`); extra ones are ignored, as RAGEN does."},
    )
    max_actions_per_episode: int = field(
        default=10, metadata={"help": "Primitive moves per episode; the episode ends when they are spent."}
    )
    format_penalty: float = field(
        default=-0.1,
        metadata={"help": "Added to the return for a turn with no action or an unknown action name (<= 0)."},
    )
    require_think: bool = field(
        default=True,
        metadata={"help": "Answers must be <think>...</think><answer>...</answer>; False also accepts a bare "
                  "<answer>."},
    )
    turn_max_tokens: int = field(
        default=400,
        metadata={"help": "Sampled tokens per turn (RAGEN's response_length). The whole episode -- sampled and "
                  "environment tokens -- must also fit max_completion_length; an episode that would not is ended."},
    )
    turn_max_tokens_hint: int = field(
        default=120,
        metadata={"help": "The response length the prompt asks for (RAGEN's max_tokens; prompt text only)."},
    )
    env_prompt: EnvPrompt = field(
        default="ragen",
        metadata={"help": "System prompt of the environment: 'ragen' (upstream's config/envs.yaml instruction texts "
                  "in its layout, with the board's true coordinate range; envs/prompts.py) or 'detailed' (our longer "
                  "rules: symbol legend, row/column directions, rewards, deadlock hint)."},
    )
    env_eval_levels: int = field(
        default=512,
        metadata={"help": "Held-out validation levels (seeds from 123), played when eval_strategy is set."},
    )
    env_eval_temperature: float = field(
        default=0.5, metadata={"help": "Sampling temperature of validation episodes (RAGEN: 0.5)."}
    )

    def validate_env_fields(self) -> None:
        """Fail fast on impossible episode settings (field name and fix in the message)."""
        if isinstance(self.env_kwargs, str):
            try:
                self.env_kwargs = json.loads(self.env_kwargs)
            except json.JSONDecodeError as e:
                raise ConfigError("env_kwargs", f"not valid JSON ({e})", "pass e.g. '{\"size\": 4}'") from None
        for name in ("max_turns", "max_actions_per_turn", "max_actions_per_episode", "turn_max_tokens",
                     "turn_max_tokens_hint", "env_eval_levels"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    name, f"must be >= 1 (got {getattr(self, name)})", "use RAGEN's defaults (5, 2, 10, 400, 120, 512)"
                )
        if self.env_prompt not in get_args(EnvPrompt):
            raise ConfigError("env_prompt", f"{self.env_prompt!r} is not an option",
                              f"use one of {list(get_args(EnvPrompt))}")
        if self.format_penalty > 0:
            raise ConfigError("format_penalty", f"must be <= 0 (got {self.format_penalty})", "RAGEN uses -0.1")
        if self.env_eval_temperature <= 0:
            raise ConfigError(
                "env_eval_temperature", f"must be > 0 (got {self.env_eval_temperature})", "RAGEN uses 0.5"
            )
