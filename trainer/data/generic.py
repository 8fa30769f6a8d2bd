"""Any Hub dataset or local file/folder as the training set, the way TRL's scripts read ``dataset_name``.

``trl grpo`` (trl/scripts/grpo.py) calls ``datasets.load_dataset(dataset_name, name=dataset_config,
streaming=dataset_streaming)`` and trains on ``dataset[dataset_train_split]``; winnow-rl does the same for
every ``dataset_name`` that is not a registered loader (trainer/data/__init__.py): a Hub id, or a local
``.parquet`` / ``.jsonl`` / ``.json`` / ``.csv`` file, a folder of data files (``train.parquet`` and
``test.parquet`` become the ``train`` and ``test`` splits) or a ``save_to_disk`` folder.

TRL's column contract holds: the ``prompt`` column is used as it is -- a string (a plain prompt, sent
without the chat template) or a list of ``{"role", "content"}`` messages (the chat template applies) -- and
every other column is kept, values and types untouched, and reaches the reward functions as a keyword
argument of the same name. Nothing is renamed, templated or stringified.

``columns`` (the recipe's ``dataset_columns``) adds columns under the names the rewards read:
``{new_name: column}`` or ``{new_name: column.key.key}`` into struct columns. verl's parquet files (``prompt``
already chat messages, ``reward_model: {ground_truth, style}``, ``data_source``, ``extra_info``) read with
``{answer: reward_model.ground_truth}``. A list element is addressed by its index (``choices.0``). The
source columns stay as they are; a new name that is already a column replaces it. ``prompt_column`` (the recipe's
``dataset_prompt_column``, with ``system_prompt``) builds the chat prompt from a text column as open-r1 does.

Offline (``HF_HUB_OFFLINE=1``), a Hub id that is not in the local cache fails at once with a
:class:`~trainer.data.common.DatasetUnavailableError` whose one-line message says what to do.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets

from trainer.data.common import _FILE_BUILDERS, MissingSplitError, is_local_path, load_raw

logger = logging.getLogger("trainer.data")

# What a generic dataset takes through the recipe's dataset_kwargs: sampling, and what datasets.load_dataset
# itself accepts for a Hub id or a folder.
GENERIC_KWARGS = ("num_samples", "shuffle", "seed", "revision", "data_dir", "data_files", "cache_dir")

HUB_FIX = (
    "download it on a machine with hub access (hf download --repo-type dataset ID, then copy the cache), or set "
    "dataset_name to a local .parquet/.jsonl/.json/.csv file, a folder of them or a save_to_disk folder"
)


@contextmanager
def quiet_progress() -> Iterator[None]:
    """No `datasets` progress bars inside: a bar on stderr before the run starts would bury a one-line error."""
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()


def single_split_source(name: str) -> bool:
    """Whether the local ``name`` holds one split only (a data file, or a saved ``Dataset``): it is the training
    set, whatever the split is called, and has no separate test split."""
    p = os.path.expanduser(name)
    if not is_local_path(p):
        return False
    if os.path.isdir(p):
        return (Path(p) / "state.json").is_file() and not (Path(p) / "dataset_dict.json").is_file()
    return Path(p).suffix.lower() in _FILE_BUILDERS


def load_generic(
    name: str,
    *,
    split: str = "train",
    config: str | None = None,
    streaming: bool = False,
    columns: Mapping[str, str] | None = None,
    prompt_column: str | None = None,
    system_prompt: str | None = None,
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    revision: str | None = None,
    data_dir: str | None = None,
    data_files: Any = None,
    cache_dir: str | None = None,
) -> datasets.Dataset | datasets.IterableDataset:
    """Split ``split`` of the Hub id or local path ``name``, its columns mapped by ``columns`` (module doc).

    ``num_samples`` keeps the first n rows (after a seeded shuffle with ``shuffle=True``; a streamed dataset
    shuffles within a buffer of 10,000 rows). ``streaming=True`` returns an ``IterableDataset`` that reads rows as
    training asks for them. Raises ``FileNotFoundError`` (a local path that does not exist),
    :class:`~trainer.data.common.DatasetUnavailableError` (a Hub id that cannot be loaded),
    :class:`~trainer.data.common.MissingSplitError` and ``ValueError`` (no usable ``prompt`` column, a mapping
    that names a missing column or key), each with a message that says what to change.
    """
    load_kwargs = {k: v for k, v in dict(revision=revision, data_dir=data_dir, data_files=data_files).items()
                   if v is not None}
    with quiet_progress():
        ds = load_raw(name, dataset_name=name, split=split, config=config, cache_dir=cache_dir, streaming=streaming,
                      fix=HUB_FIX, **load_kwargs)
        ds = map_columns(ds, columns or {}, name)
        if prompt_column is not None:
            ds = build_chat_prompt(ds, prompt_column, system_prompt, name)
        check_prompt(ds, name, columns or {})
        if shuffle:
            ds = ds.shuffle(seed=seed, buffer_size=10_000) if streaming else ds.shuffle(seed=seed)
        if num_samples is not None:
            if num_samples < 0:
                raise ValueError(f"{name}: num_samples must be >= 0, got {num_samples}")
            ds = ds.take(num_samples) if streaming else ds.select(range(min(num_samples, len(ds))))
    shown = "streamed" if streaming else f"{len(ds)} rows"
    logger.info("%s (split %s): %s, columns %s", name, split, shown, ds.column_names)
    return ds


def load_generic_split(name: str, split: str, **kwargs: Any) -> datasets.Dataset | datasets.IterableDataset:
    """:func:`load_generic` of a split other than the training one (the evaluation set): a single file or saved
    ``Dataset`` has none, which is a :class:`MissingSplitError` rather than the training rows again."""
    if single_split_source(name):
        raise MissingSplitError(f"{name} is a single file (or saved Dataset): it has one split, the training set, "
                                f"and no {split!r} split to evaluate on")
    return load_generic(name, split=split, **kwargs)


def first_row(ds: datasets.Dataset | datasets.IterableDataset) -> dict | None:
    """The first row, or None for an empty dataset (a streamed one reads only that row)."""
    return next(iter(ds), None)


def column_value(row: Mapping[str, Any], path: str) -> Any:
    """``row[path]``, or the value at the dotted ``path`` into struct (dict) and list values: ``reward_model.
    ground_truth``, ``choices.0``. ``KeyError`` names the first part that is missing and what was there."""
    if path in row:
        return row[path]
    value: Any = row
    for depth, part in enumerate(path.split(".")):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            where = ".".join(path.split(".")[:depth]) or "the row"
            found = sorted(value) if isinstance(value, Mapping) else f"a {type(value).__name__}"
            raise KeyError(f"{path!r}: {where} has no {part!r} (it holds {found})")
    return value


def map_columns(ds: datasets.Dataset | datasets.IterableDataset, columns: Mapping[str, str],
                name: str) -> datasets.Dataset | datasets.IterableDataset:
    """Add each ``new_name: path`` of ``columns`` (module doc); a path is checked on the first row before the
    whole dataset is read."""
    if not columns:
        return ds
    row = first_row(ds)
    if row is not None:
        for target, path in columns.items():
            try:
                column_value(row, path)
            except KeyError as e:
                raise ValueError(f"{name}: dataset_columns {target}: {e.args[0]}; columns: {sorted(row)}") from None

    def add(row: dict) -> dict:
        return {target: column_value(row, path) for target, path in columns.items()}

    return ds.map(add)


def build_chat_prompt(ds: datasets.Dataset | datasets.IterableDataset, column: str, system_prompt: str | None,
                      name: str) -> datasets.Dataset | datasets.IterableDataset:
    """``prompt`` = [a system message ``system_prompt``, if given] + the text of ``column`` as the user message: the
    conversation open-r1's grpo.py builds (``make_conversation`` with ``dataset_prompt_column`` and
    ``system_prompt``). Every other column, ``column`` included, stays."""
    row = first_row(ds)
    if row is not None and column not in row:
        raise ValueError(f"{name}: dataset_prompt_column {column!r} is not a column; columns: {sorted(row)}")
    if row is not None and not isinstance(row[column], str):
        raise ValueError(f"{name}: dataset_prompt_column {column!r} must hold text, got "
                         f"{type(row[column]).__name__} {str(row[column])[:80]!r}")
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []

    def conversation(row: dict) -> dict:
        return {"prompt": [*system, {"role": "user", "content": row[column]}]}

    if "prompt" in (ds.column_names or []):  # the built conversation replaces it (a string column cannot hold one)
        ds = ds.remove_columns("prompt")
    return ds.map(conversation)


def check_prompt(ds: datasets.Dataset | datasets.IterableDataset, name: str, columns: Mapping[str, str]) -> None:
    """The ``prompt`` column exists and is TRL's: a string or a list of ``{role, content}`` messages (checked on
    the first row; Arrow gives every row the same type)."""
    row = first_row(ds)
    names = list(ds.column_names or (row or {}))
    if "prompt" not in names:
        raise ValueError(f"{name}: no 'prompt' column (columns: {names}); the trainer reads the prompt from it")
    if row is None:
        return
    prompt = row["prompt"]
    chat = isinstance(prompt, list) and prompt and all(isinstance(m, Mapping) and {"role", "content"} <= set(m)
                                                        for m in prompt)
    if not (isinstance(prompt, str) or chat):
        source = f" (mapped from {columns['prompt']!r})" if "prompt" in columns else ""
        raise ValueError(f"{name}: 'prompt'{source} must be a string or a list of {{role, content}} messages, got "
                         f"{type(prompt).__name__} {str(prompt)[:80]!r}")
