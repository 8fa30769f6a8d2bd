"""Levels as dataset rows: which environment and which seed, carried in the prompt column.

TRL hands a ``rollout_func`` only the prompts of the batch, so the level a prompt stands for travels inside
it: the dataset row's prompt is one user message whose content is ``{"env": "sokoban", "seed": 10003}``.
The rollout (trainer/rollout/multi_turn.py) reads it back with :func:`parse_level_prompt` and shows the model the
real conversation (rules, rendered state); the placeholder text itself is never tokenised for training.
Rendering levels lazily also keeps dataset construction instant (thousands of levels per run).
"""

from __future__ import annotations

import json
from typing import Any

# RAGEN's seeds (reference notes §3.1): training levels from 10000 on, validation from 123 on.
TRAIN_SEED = 10_000
EVAL_SEED = 123


def level_spec(env: str, seed: int) -> str:
    """The JSON text that names one level."""
    return json.dumps({"env": env, "seed": int(seed)}, sort_keys=True)


def level_prompt(env: str, seed: int) -> list[dict[str, str]]:
    """The prompt column of one level's dataset row."""
    return [{"role": "user", "content": level_spec(env, seed)}]


def parse_level_prompt(prompt: Any) -> tuple[str, int]:
    """(env name, seed) of a prompt built by :func:`level_prompt`; ValueError otherwise."""
    content = prompt[-1]["content"] if isinstance(prompt, list) and prompt else prompt
    try:
        spec = json.loads(content)
        return str(spec["env"]), int(spec["seed"])
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(
            f"not an environment level prompt: {str(content)[:120]!r}; environment tasks take their rows from "
            "dataset_name: sokoban | frozenlake (trainer/data/envs.py)"
        ) from e
