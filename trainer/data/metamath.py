"""MetaMathQA (``meta-math/MetaMathQA``, train split, ~395k rows), as used by RAGEN-2's MetaMathQA task.

Columns read: ``query`` (the prompt), ``response`` (a worked solution whose last line is
"The answer is: <label>"), and, only when their option is used, ``type`` (``GSM_Rephrased``,
``MATH_AnsAug``, ...) and ``original_question`` (the GSM8K/MATH problem a row was augmented from).

The gold answer is RAGEN's label: the text captured by ``The answer is: (.*)$`` on the last line of
``response``, stripped. Trailing whitespace/blank lines after that line are ignored (RAGEN's ``re.search``
would miss a response ending in two newlines; MetaMathQA has none, so this only adds robustness). Rows
without a parsable, non-empty answer are dropped and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trainer.data.common import finalize, load_raw, register_task_dataset, require_columns
from trainer.data.math_hub import DEEPMATH_TEMPLATE, _first_occurrences

logger = logging.getLogger("trainer.data")

METAMATH_HUB_ID = "meta-math/MetaMathQA"
METAMATH_TEMPLATE = DEEPMATH_TEMPLATE  # step-by-step + \boxed{}; math_accuracy verifies the boxed answer

# RAGEN's "The answer is: (.*)$", evaluated by RE2 (Arrow) on the right-trimmed response: [^\n] and \z
# pin the capture to the last line, as Python's `.` and `$` (without re.MULTILINE) do.
_ANSWER_PATTERN = r"The answer is: (?P<answer>[^\n]*)\z"


def extract_metamath_answer(response: str | None) -> str | None:
    """The label of one MetaMathQA ``response`` (stripped), or None if its last line has no answer."""
    label = _extract_answers(pa.chunked_array([[response]], type=pa.string()))[0].as_py()
    return label or None


def _extract_answers(responses: pa.ChunkedArray) -> pa.ChunkedArray:
    """Per row: the stripped label, or null when the last line is not "The answer is: <something>"."""
    if responses.type != pa.string():
        responses = responses.cast(pa.string())
    matched = pc.extract_regex(pc.utf8_rtrim_whitespace(responses), pattern=_ANSWER_PATTERN)
    answers = pc.utf8_trim_whitespace(pc.struct_field(matched, "answer"))
    return pc.if_else(pc.equal(answers, ""), pa.scalar(None, pa.string()), answers)


def _first_per_key(keys: pa.ChunkedArray) -> np.ndarray:
    """Sorted indices keeping the first row per non-null key; rows with a null key are all kept."""
    idx = np.arange(len(keys), dtype=np.int64)
    valid = pc.is_valid(keys).to_numpy(zero_copy_only=False)
    if valid.all():
        return _first_occurrences(keys)
    valid_idx = idx[valid]
    firsts = valid_idx[_first_occurrences(keys.filter(pa.array(valid)))] if len(valid_idx) else valid_idx
    return np.sort(np.concatenate([firsts, idx[~valid]]))


@register_task_dataset("metamathqa")
def load_metamathqa(
    path: str = METAMATH_HUB_ID,
    *,
    split: str = "train",
    config: str | None = None,
    types: Sequence[str] | str | None = None,
    dedupe_original: bool = False,
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    system_prompt: str | None = None,
    prompt_template: str = METAMATH_TEMPLATE,
    max_prompt_chars: int | None = None,
    cache_dir: str | None = None,
    source: str = "metamathqa",
) -> datasets.Dataset:
    """MetaMathQA: ``query`` -> prompt, gold = the "The answer is: ..." label of ``response``.

    ``path`` is the hub id (default) or a local json/jsonl/parquet file or folder with the same columns.
    ``types`` keeps only rows whose ``type`` is one of the given values (an unknown value raises
    ValueError listing the types present). ``dedupe_original`` keeps the first row per
    ``original_question`` among the rows left after the type filter and the answer extraction (so an
    original question is dropped only if none of its augmentations has a parsable answer). Order: type
    filter, answer extraction (unparsable rows dropped), dedupe, then :func:`finalize` (length filter,
    shuffle, ``num_samples``). Every count is logged and written to ``dataset.info.description``.
    """
    name = "metamathqa"
    if isinstance(types, str):
        types = [types]
    if types is not None:
        types = list(types)
        if not types:
            raise ValueError(f"{name}: types must be None or a non-empty list of 'type' values")
    raw = load_raw(path, dataset_name=name, split=split, config=config, cache_dir=cache_dir)
    cols = ["query", "response"]
    if types is not None:
        cols.append("type")
    if dedupe_original:
        cols.append("original_question")
    require_columns(raw, cols, name)
    table = raw.select_columns(cols).with_format("arrow")[:]
    n_rows = table.num_rows
    notes = [f"read {n_rows} rows"]

    if types is not None:
        present = sorted(t for t in pc.unique(table.column("type")).to_pylist() if t is not None)
        unknown = [t for t in types if t not in present]
        if unknown:
            raise ValueError(f"{name}: unknown type(s) {unknown}; types present: {present}")
        table = table.filter(pc.fill_null(pc.is_in(table.column("type"), value_set=pa.array(types)), False))
        notes.append(f"{table.num_rows} rows of types {sorted(set(types))}")

    answers = _extract_answers(table.column("response"))
    parsable = pc.is_valid(answers)
    n_unparsable = table.num_rows - pc.sum(parsable).as_py() if table.num_rows else 0
    table = table.append_column("answer", answers).filter(parsable)
    notes.append(f"dropped {n_unparsable} rows without a parsable 'The answer is:' last line")
    if n_unparsable:
        logger.warning("%s: dropped %d rows without a parsable 'The answer is:' last line", name, n_unparsable)

    if dedupe_original:
        before = table.num_rows
        table = table.take(pa.array(_first_per_key(table.column("original_question"))))
        notes.append(f"dropped {before - table.num_rows} rows repeating an original_question")

    return finalize(
        table.column("query").to_pylist(),
        table.column("answer").to_pylist(),
        dataset_name=name,
        source=source,
        prompt_template=prompt_template,
        system_prompt=system_prompt,
        max_prompt_chars=max_prompt_chars,
        num_samples=num_samples,
        shuffle=shuffle,
        seed=seed,
        notes=notes,
    )
