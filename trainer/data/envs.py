"""Environment tasks as datasets: one row per level seed (``dataset_name: sokoban`` / ``frozenlake``).

A row is ``prompt`` = the level's placeholder message (envs/levels.py), ``answer`` = the same JSON spec,
``source`` = ``env:<name>``. Levels are generated lazily by the multi-turn rollout (trainer/rollout/multi_turn.py),
so a dataset of thousands of levels costs nothing to build. Training seeds start at 10000 and validation
seeds at 123 as in RAGEN; RAGEN draws a fresh level per group and iteration, which a dataset of
``num_levels`` >= P x iterations distinct seeds reproduces (TRL's sampler shuffles them with the run seed).
"""

from __future__ import annotations

import datasets

from envs.levels import EVAL_SEED, TRAIN_SEED, level_prompt, level_spec
from trainer.data.common import register_task_dataset

ENV_TASKS = ("sokoban", "frozenlake")


def level_dataset(env: str, num_levels: int, first_seed: int) -> datasets.Dataset:
    """``num_levels`` consecutive level seeds of ``env`` from ``first_seed``."""
    if num_levels < 1:
        raise ValueError(f"num_levels must be >= 1 (got {num_levels})")
    seeds = range(first_seed, first_seed + num_levels)
    return datasets.Dataset.from_dict(
        {
            "prompt": [level_prompt(env, s) for s in seeds],
            "answer": [level_spec(env, s) for s in seeds],
            "source": [f"env:{env}"] * num_levels,
        }
    )


def _loader(env: str):
    def load(*, num_levels: int = 3200, first_seed: int | None = None, split: str = "train") -> datasets.Dataset:
        """Level rows for training (``split="train"``, seeds from 10000) or validation (``"validation"``, from 123)."""
        if split not in ("train", "validation"):
            raise ValueError(f"split must be 'train' or 'validation' (got {split!r})")
        default = TRAIN_SEED if split == "train" else EVAL_SEED
        return level_dataset(env, num_levels, default if first_seed is None else first_seed)

    load.__name__ = f"load_{env}"
    load.__doc__ = f"{env} levels: num_levels rows from first_seed (default 10000 for train, 123 for validation)."
    return load


for _env in ENV_TASKS:
    register_task_dataset(_env)(_loader(_env))
