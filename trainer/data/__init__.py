"""Task datasets for RL training and evaluation, by name: ``load_task_dataset("dapo_math_17k", ...)``, or any Hub id
or local path as TRL's scripts read it: ``load_generic("org/dataset" | "data/train.parquet", ...)``.

Two kinds of ``dataset_name`` (the recipe field):

- a registered loader (below): it builds the rows itself, in winnow-rl's three-column contract;
- anything else: a Hub id or a local ``.parquet`` / ``.jsonl`` / ``.json`` / ``.csv`` file, a folder of them or a
  ``save_to_disk`` folder (trainer/data/generic.py), loaded like ``trl grpo`` does with ``dataset_config``,
  ``dataset_train_split``, ``dataset_test_split`` and ``dataset_streaming``. TRL's column contract: the ``prompt``
  column is used as it is (a string, or chat messages -- never stringified) and every other column is kept and
  reaches the reward functions as a keyword argument; ``dataset_columns`` maps columns, dotted paths into struct
  columns included (verl's parquet: ``{answer: reward_model.ground_truth}``). Such a dataset has the columns its
  file has: a reward that reads ``answer`` needs one (mapped or not); ``source`` is optional.

Every registered loader returns a ``datasets.Dataset`` with exactly three columns:

- ``prompt``: chat messages (TRL's conversational format), an optional system message then the user
  message, e.g. ``[{"role": "system", ...}, {"role": "user", "content": template.format(problem=...)}]``;
- ``answer``: the gold answer as a string (reward functions receive it as the ``answer`` kwarg);
- ``source``: which dataset the row came from.

Common keyword arguments (every loader): ``split``, ``num_samples`` (keep the first n, after a seeded
shuffle when ``shuffle=True``), ``seed``, ``system_prompt`` (str or None), ``prompt_template`` (a
``str.format`` string with ``{problem}``; literal braces doubled, as in ``\\boxed{{}}``; each loader has a
sensible default) and ``max_prompt_chars`` (drop rows whose rendered messages are longer). What was
read, dropped and kept is logged on the ``trainer.data`` logger and stored in ``dataset.info.description``.

Registered loaders:

- ``dapo_math_17k``: by default the GRPODropout authors' view (``open-r1/DAPO-Math-17k-Processed``, config
  ``en``, 14,116 rows; raw problem + a \\boxed{} system prompt); also the original
  ``BytedTsinghua-SIA/DAPO-Math-17k`` (17,917 items x 100, deduplicated) or a local copy of either;
- ``deepmath_103k``: hub ``zwhe99/DeepMath-103K`` or a local copy, ``min_difficulty``/``max_difficulty``;
- ``metamathqa``: hub ``meta-math/MetaMathQA`` or a local copy, gold from "The answer is: ...", ``types``;
- ``json``: any local JSON/JSONL file with problem/question and answer columns (names configurable), the
  problem written into a template (a column of chat messages is refused: use the file's path as ``dataset_name``);
- ``arithmetic``: generated, seeded integer arithmetic (the CPU demo's task);
- ``champ``: the 270 CHAMP problems from the installed ``champ-dataset`` package (offline);
- ``countdown``: Countdown (TinyZero / RAGEN), generated offline and seeded, or hub
  ``Jiayi-Pan/Countdown-Tasks-3to4`` / a local copy; ``answer`` is JSON ``{"target", "numbers", "solution"}``;
- ``sokoban``, ``frozenlake``: level seeds of a multi-turn environment (trainer/data/envs.py), played by the
  rollout of trainer/rollout/multi_turn.py; ``prompt`` holds the level's spec, not the text the model sees.

Hub ids go through the real ``datasets.load_dataset``. The project's machines are offline
(``HF_HUB_OFFLINE=1``): a dataset that is not in the local cache fails fast with
:class:`DatasetUnavailableError`, whose message says to pass ``path=`` a local file with the same columns.

Thinking on/off is deliberately not a loader option: the prompt holds only the problem. Qwen3-style
``enable_thinking`` is a chat-template switch, set through TRL's
``GRPOConfig(chat_template_kwargs={"enable_thinking": False})``, so the same dataset serves both modes.
"""

from __future__ import annotations

import inspect
from typing import Any

import datasets

from trainer.data import arithmetic, countdown, envs, local, math_hub, metamath  # noqa: F401  (importing registers the loaders)
from trainer.data.common import (
    _REGISTRY,
    OUTPUT_COLUMNS,
    DatasetUnavailableError,
    MissingSplitError,
    register_task_dataset,
)
from trainer.data.generic import load_generic
from trainer.data.math_hub import BOXED_SYSTEM_PROMPT, DAPO_TEMPLATE, strip_dapo_instruction

__all__ = [
    "BOXED_SYSTEM_PROMPT",
    "DAPO_TEMPLATE",
    "OUTPUT_COLUMNS",
    "DatasetUnavailableError",
    "MissingSplitError",
    "list_task_datasets",
    "load_generic",
    "load_task_dataset",
    "register_task_dataset",
    "strip_dapo_instruction",
]


def list_task_datasets() -> list[str]:
    """Names accepted by :func:`load_task_dataset`, sorted."""
    return sorted(_REGISTRY)


def load_task_dataset(name: str, **kwargs: Any) -> datasets.Dataset:
    """Load the task dataset registered as ``name``; ``kwargs`` go to its loader (see the module doc).

    Unknown names and unknown keyword arguments fail with the valid choices in the message, so a typo
    in a YAML recipe is caught before any model is loaded.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown task dataset {name!r}; registered: {list_task_datasets()} (a Hub id or local path "
                         "loads with load_generic)")
    loader = _REGISTRY[name]
    params = inspect.signature(loader).parameters
    unknown = sorted(k for k in kwargs if k not in params)
    if unknown:
        raise TypeError(f"task dataset {name!r} does not accept {unknown}; it accepts {sorted(params)}")
    return loader(**kwargs)
