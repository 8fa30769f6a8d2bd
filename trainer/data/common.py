"""Shared plumbing for the task-dataset loaders: the registry, raw loading, checks and the final shape.

Every loader ends in :func:`finalize`, so all of them agree on the output contract
(``prompt`` / ``answer`` / ``source``), on what ``num_samples``/``shuffle``/``seed`` mean and on the
prompt-length filter. Loaders differ only in how they read rows and what their default template is.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets

logger = logging.getLogger("trainer.data")

# name -> loader. Filled by the @register_task_dataset decorators when trainer.data imports its modules.
_REGISTRY: dict[str, Callable[..., datasets.Dataset]] = {}

# Suffixes we hand to a `datasets` file builder. Anything else that exists on disk is treated as a
# folder (load_from_disk output or a folder of data files).
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}

OUTPUT_COLUMNS = ("prompt", "answer", "source")


class DatasetUnavailableError(RuntimeError):
    """A hub dataset could not be loaded (offline and not cached, unknown id, no network)."""


class MissingSplitError(ValueError):
    """The dataset exists but has no split of the requested name (the message lists the ones it has)."""


def register_task_dataset(name: str) -> Callable[[Callable[..., datasets.Dataset]], Callable[..., datasets.Dataset]]:
    """Decorator: register ``fn`` as the loader for task dataset ``name`` (names are unique)."""

    def deco(fn: Callable[..., datasets.Dataset]) -> Callable[..., datasets.Dataset]:
        if name in _REGISTRY:
            raise ValueError(f"task dataset {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        _REGISTRY[name] = fn
        return fn

    return deco


def is_local_path(path: str | os.PathLike) -> bool:
    """True if ``path`` names something on disk, or plainly means to (absolute, ./, or a data suffix).

    A missing file that looks like a path must fail as FileNotFoundError here, not be sent to the hub
    as an id (where it would fail with a confusing "repo not found").
    """
    p = str(path)
    if os.path.exists(p):
        return True
    return os.path.isabs(p) or p.startswith((".", "~")) or Path(p).suffix.lower() in _FILE_BUILDERS


def load_raw(
    path: str | os.PathLike,
    *,
    dataset_name: str,
    split: str = "train",
    config: str | None = None,
    cache_dir: str | None = None,
    streaming: bool = False,
    fix: str | None = None,
    **load_kwargs: Any,
) -> datasets.Dataset | datasets.IterableDataset:
    """Load a raw dataset from a local file/folder or a hub id, with errors that say what to do.

    Local single files become one split named after ``split`` (minus any slice such as ``[:100]``), so
    ``split="train[:100]"`` slices a local file exactly like a hub split. Hub ids go through the real
    ``datasets.load_dataset``; with ``HF_HUB_OFFLINE=1`` that reads the local cache or fails fast.
    ``streaming`` returns an ``IterableDataset`` (a save_to_disk folder is converted); ``load_kwargs``
    (``revision``, ``data_dir``, ``data_files``) go to ``datasets.load_dataset`` for a folder or hub id;
    ``fix`` replaces the default advice of the hub error. A split the source lacks is a
    :class:`MissingSplitError` that lists the splits it has.
    """
    p = os.path.expanduser(str(path))
    if is_local_path(p):
        if not os.path.exists(p):
            raise FileNotFoundError(f"{dataset_name}: local dataset path {p!r} does not exist")
        if os.path.isdir(p) and any((Path(p) / f).exists() for f in ("state.json", "dataset_dict.json")):
            # Output of Dataset.save_to_disk / DatasetDict.save_to_disk.
            ds = datasets.load_from_disk(p)
            if isinstance(ds, datasets.DatasetDict):
                base = split.split("[")[0]
                if base not in ds:
                    raise MissingSplitError(f"{dataset_name}: no split {base!r} in {p!r}; splits: {sorted(ds)}")
                ds = ds[base]
            return ds.to_iterable_dataset() if streaming else ds
        if os.path.isdir(p):
            return _with_split_error(dataset_name, lambda: datasets.load_dataset(
                p, name=config, split=split, cache_dir=cache_dir, streaming=streaming, **load_kwargs))
        builder = _FILE_BUILDERS.get(Path(p).suffix.lower())
        if builder is None:
            raise ValueError(
                f"{dataset_name}: cannot read {p!r}: unsupported suffix (use one of {sorted(_FILE_BUILDERS)})"
            )
        if load_kwargs:
            raise ValueError(f"{dataset_name}: {sorted(load_kwargs)} apply to a folder or hub dataset, not to the "
                             f"single file {p!r}")
        base_split = split.split("[")[0] or "train"
        return datasets.load_dataset(builder, data_files={base_split: p}, split=split, cache_dir=cache_dir,
                                     streaming=streaming)
    try:
        return _with_split_error(dataset_name, lambda: datasets.load_dataset(
            p, name=config, split=split, cache_dir=cache_dir, streaming=streaming, **load_kwargs))
    except MissingSplitError:
        raise
    except Exception as e:  # noqa: BLE001 - every hub failure gets the same actionable message
        offline = bool(datasets.config.HF_HUB_OFFLINE)
        hint = (
            "HF_HUB_OFFLINE is set and the dataset is not in the local cache"
            if offline
            else "the hub may be unreachable from this machine"
        )
        fix = fix or (
            "pass path=<local .parquet/.jsonl file or save_to_disk folder> with the same columns, or pre-cache the "
            "dataset on a machine with hub access."
        )
        cause = " ".join(f"{type(e).__name__}: {e}".split())  # one line: the message ends up in a one-line error
        raise DatasetUnavailableError(
            f"{dataset_name}: could not load hub dataset {p!r} (config={config!r}, split={split!r}): "
            f"{cause}. Likely cause: {hint}. Fix: {fix}"
        ) from e


def _with_split_error(dataset_name: str, load: Callable[[], Any]) -> Any:
    """``load()``, with `datasets`' ``Unknown split "x". Should be one of [...]`` as a :class:`MissingSplitError`."""
    try:
        return load()
    except ValueError as e:
        if str(e).startswith("Unknown split"):
            raise MissingSplitError(f"{dataset_name}: {e}") from e
        raise


def require_columns(ds: datasets.Dataset, required: Sequence[str], dataset_name: str) -> None:
    """Raise ValueError naming the dataset, each missing column and the columns that were found."""
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise ValueError(
            f"{dataset_name}: missing expected column(s) {missing}; columns found: {ds.column_names}"
        )


def check_template(prompt_template: str, dataset_name: str) -> None:
    """Fail early (before reading data) on a template that cannot be formatted with ``problem=``."""
    if "{problem}" not in prompt_template:
        raise ValueError(f"{dataset_name}: prompt_template must contain '{{problem}}': {prompt_template!r}")
    try:
        prompt_template.format(problem="x")
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"{dataset_name}: prompt_template is not a valid format string ({type(e).__name__}: {e}); "
            "literal braces must be doubled, e.g. '\\\\boxed{{}}'"
        ) from e


def build_messages(problem: str, prompt_template: str, system_prompt: str | None) -> list[dict[str, str]]:
    """Chat messages for one problem: an optional system message, then the templated user message."""
    messages = []
    if system_prompt:  # "" and None both mean "no system message" (an empty one still costs tokens)
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": prompt_template.format(problem=problem)})
    return messages


def finalize(
    problems: Sequence[str],
    answers: Sequence[Any],
    *,
    dataset_name: str,
    source: str,
    prompt_template: str,
    system_prompt: str | None = None,
    max_prompt_chars: int | None = None,
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    notes: Sequence[str] = (),
) -> datasets.Dataset:
    """Turn raw (problem, answer) pairs into the standard ``prompt``/``answer``/``source`` Dataset.

    Order of operations: drop rows with an empty problem or gold answer, render prompts, drop prompts longer than
    ``max_prompt_chars`` (system + user content), then (optionally) a seeded shuffle, then keep the first
    ``num_samples``. Filtering comes before sampling so ``num_samples`` rows survive when available.
    The counts go to the log and to ``dataset.info.description`` so a run records what it trained on.
    """
    check_template(prompt_template, dataset_name)
    if len(problems) != len(answers):
        raise ValueError(f"{dataset_name}: {len(problems)} problems but {len(answers)} answers")
    notes = list(notes)
    rows: list[tuple[list[dict[str, str]], str]] = []
    n_no_gold = n_too_long = 0
    for problem, answer in zip(problems, answers):
        # JSON files often store integer answers as numbers; the reward functions compare strings.
        gold = "" if answer is None else str(answer).strip()
        if not gold or problem is None or not str(problem).strip():
            n_no_gold += 1  # unrewardable (no gold) or unanswerable (no problem): pure noise in a group
            continue
        messages = build_messages(str(problem), prompt_template, system_prompt)
        if max_prompt_chars is not None and sum(len(m["content"]) for m in messages) > max_prompt_chars:
            n_too_long += 1
            continue
        rows.append((messages, gold))
    if n_no_gold:
        notes.append(f"dropped {n_no_gold} rows with an empty problem or gold answer")
        logger.warning("%s: dropped %d rows with an empty problem or gold answer", dataset_name, n_no_gold)
    if max_prompt_chars is not None:
        notes.append(f"dropped {n_too_long} prompts longer than {max_prompt_chars} chars")
    if shuffle:
        random.Random(seed).shuffle(rows)
    if num_samples is not None:
        if num_samples < 0:
            raise ValueError(f"{dataset_name}: num_samples must be >= 0, got {num_samples}")
        if num_samples > len(rows):
            logger.warning("%s: num_samples=%d but only %d rows available", dataset_name, num_samples, len(rows))
        rows = rows[:num_samples]
    notes.append(f"kept {len(rows)} rows")
    description = f"{dataset_name}: " + "; ".join(notes)
    logger.info(description)
    features = datasets.Features(
        {
            "prompt": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
            "answer": datasets.Value("string"),
            "source": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_dict(
        {
            "prompt": [r[0] for r in rows],
            "answer": [r[1] for r in rows],
            "source": [source] * len(rows),
        },
        info=datasets.DatasetInfo(description=description, features=features),
    )
