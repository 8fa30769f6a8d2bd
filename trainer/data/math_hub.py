"""Hub math training sets: DAPO-Math-17k (the GRPODropout authors' English view) and DeepMath-103K (difficulty filter).

Both loaders accept a hub id (the default; real ``datasets.load_dataset``) or a local file/folder with
the same columns, which is how the offline tests and air-gapped machines use them.
"""

from __future__ import annotations

import logging

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trainer.data.common import finalize, load_raw, register_task_dataset, require_columns

logger = logging.getLogger("trainer.data")

DAPO_HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"
DAPO_PROCESSED_HUB_ID = "open-r1/DAPO-Math-17k-Processed"
DEEPMATH_HUB_ID = "zwhe99/DeepMath-103K"

# DAPO's own instruction wrapper around every problem (reference §3). Kept as two halves so the loader
# can strip it from the raw data and the default template can put it back, byte for byte.
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
DAPO_TEMPLATE = DAPO_PREFIX + "{problem}" + DAPO_SUFFIX

# The GRPODropout authors' training prompt: the raw problem as the user turn under this system prompt
# (hexuandeng/GRPODropout@4ad3b3b:data/prepare_dapo17k_for_verl.py, SYSTEM_PROMPT and _normalize_rows).
BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
RAW_TEMPLATE = "{problem}"
# The view the authors trained on has 14,116 rows (their train parquet's question ids run 0..14115,
# hexuandeng/GRPODropout@4ad3b3b:data/dapo17k/dapo17k_verl_train_view.json): the English configuration of
# open-r1/DAPO-Math-17k-Processed (deduplicated, prompts without Chinese characters). Recipes pin it with
# expected_rows.
# Their verl then drops every prompt whose chat-templated text is over 2,048 CHARACTERS (filter_overlong_prompts
# counts len() of the rendered string, hexuandeng/GRPODropout@4ad3b3b:verl/verl/utils/dataset/rl_dataset.py:177,
# tokenize=False at :144). Qwen3's template adds 80 characters to the system + user contents, so max_prompt_chars
# (which counts those contents) at 2048 - 80 = 1968 keeps the same rows (tests/data/test_dapo_prompt_filter.py).

DEEPMATH_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def strip_dapo_instruction(text: str) -> str:
    """Return the raw problem: ``text`` without DAPO's instruction prefix/suffix (if present).

    Compared after trimming whitespace, so a copy whose blank lines were normalised still strips; a plain
    problem (e.g. from a re-processed copy) comes back unchanged apart from surrounding whitespace.
    """
    t = text.strip()
    head, tail = DAPO_PREFIX.strip(), DAPO_SUFFIX.strip()
    if t.startswith(head):
        t = t[len(head):].lstrip()
    if t.endswith(tail):
        t = t[: -len(tail)].rstrip()
    return t


def _first_occurrences(texts: pa.ChunkedArray) -> np.ndarray:
    """Sorted row indices of the first occurrence of each distinct value of ``texts``.

    Done in Arrow (group_by + min index) because the hub copy has 1.79M rows: materialising every
    prompt as a Python string would cost ~1 GB just to keep 17.9k of them.
    """
    table = pa.table({"t": texts, "i": pa.array(np.arange(len(texts), dtype=np.int64))})
    firsts = table.group_by("t", use_threads=False).aggregate([("i", "min")]).column("i_min").to_numpy()
    return np.sort(firsts)


def _dapo_text_and_gold(ds: datasets.Dataset, dataset_name: str) -> tuple[pa.ChunkedArray, pa.ChunkedArray, str]:
    """Problem text and gold answer columns for whichever DAPO schema ``ds`` has (detected by columns)."""
    cols = ds.column_names
    if "prompt" in cols and isinstance(ds.features["prompt"], datasets.Value):
        # open-r1/DAPO-Math-17k-Processed: prompt is the user content string, solution = ground_truth.
        require_columns(ds, ["prompt", "solution"], dataset_name)
        t = ds.select_columns(["prompt", "solution"]).with_format("arrow")[:]
        return t.column("prompt"), t.column("solution"), "processed"
    if "prompt" in cols:
        # Original: prompt = [{content, role="user"}], reward_model = {ground_truth, style}.
        require_columns(ds, ["prompt", "reward_model"], dataset_name)
        rm = ds.features["reward_model"]
        if not isinstance(rm, dict) or "ground_truth" not in rm:
            raise ValueError(
                f"{dataset_name}: column 'reward_model' has no 'ground_truth' field; found {rm}; "
                f"columns found: {cols}"
            )
        t = ds.select_columns(["prompt", "reward_model"]).with_format("arrow")[:]
        content = pc.struct_field(pc.list_element(t.column("prompt"), 0), "content")
        return content, pc.struct_field(t.column("reward_model"), "ground_truth"), "original"
    if "problem" in cols and "answer" in cols:
        # Some re-processed copies (problem/answer) in circulation; same content, already unwrapped.
        t = ds.select_columns(["problem", "answer"]).with_format("arrow")[:]
        return t.column("problem"), t.column("answer"), "problem/answer"
    raise ValueError(
        f"{dataset_name}: missing expected column(s) ['prompt'] (original schema: prompt + reward_model; "
        f"processed schema: prompt (str) + solution); columns found: {cols}"
    )


@register_task_dataset("dapo_math_17k")
def load_dapo_math_17k(
    path: str = DAPO_PROCESSED_HUB_ID,
    *,
    split: str = "train",
    config: str | None = None,
    expected_rows: int | None = None,
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    system_prompt: str | None = BOXED_SYSTEM_PROMPT,
    prompt_template: str = RAW_TEMPLATE,
    max_prompt_chars: int | None = None,
    cache_dir: str | None = None,
    source: str = "dapo_math_17k",
) -> datasets.Dataset:
    """DAPO-Math-17k, deduplicated by problem text (first occurrence kept), gold = ground_truth.

    The defaults are the GRPODropout authors' training data: the English configuration ``en`` of
    ``open-r1/DAPO-Math-17k-Processed`` (14,116 rows), the raw problem as the user turn and the system prompt
    "Please reason step by step, and put your final answer within \\boxed{}." (their
    data/prepare_dapo17k_for_verl.py). ``path`` may also be the original ``BytedTsinghua-SIA/DAPO-Math-17k``
    (17,917 items, each repeated 100 times; ``extra_info.index`` does not identify a problem) or a local
    json/jsonl/parquet file or folder in either schema; rows are deduplicated on the unwrapped problem text
    (a no-op on the Processed view, already deduplicated by its publisher). DAPO's "Answer:" instruction
    wrapper is stripped, so ``prompt_template`` (e.g. ``DAPO_TEMPLATE``, DAPO's own) re-wraps the raw problem.
    ``expected_rows``: the number of rows the source must have (before deduplication); another count means
    another view or version of the data and fails before training. Counts are logged and written to
    ``dataset.info.description``.
    """
    if config is None and path == DAPO_PROCESSED_HUB_ID:
        config = "en"  # the Processed repo has configs all / en / cn and no default; en is the authors' view
    raw = load_raw(path, dataset_name="dapo_math_17k", split=split, config=config, cache_dir=cache_dir)
    texts, golds, schema = _dapo_text_and_gold(raw, "dapo_math_17k")
    n_rows = len(texts)
    if expected_rows is not None and n_rows != expected_rows:
        raise ValueError(
            f"dapo_math_17k: expected_rows={expected_rows} but {path!r} (config={config!r}, split={split!r}) has "
            f"{n_rows} rows: a different view or version of the data. Fix: point path/config at the expected view, "
            "or set expected_rows to null to train on this one."
        )
    # Pass 1 (Arrow): identical raw contents -> one row. Pass 2 (Python, ~17.9k strings): identical
    # problems after unwrapping, which catches a wrapped and an unwrapped copy of the same problem.
    firsts = _first_occurrences(texts)
    problems, answers, seen = [], [], set()
    for text, gold in zip(texts.take(firsts).to_pylist(), golds.take(firsts).to_pylist()):
        problem = strip_dapo_instruction(text or "")
        if problem in seen:
            continue
        seen.add(problem)
        problems.append(problem)
        answers.append(gold)
    n_dups = n_rows - len(problems)
    logger.info("dapo_math_17k: %d rows read (%s schema), %d duplicates dropped", n_rows, schema, n_dups)
    return finalize(
        problems,
        answers,
        dataset_name="dapo_math_17k",
        source=source,
        prompt_template=prompt_template,
        system_prompt=system_prompt,
        max_prompt_chars=max_prompt_chars,
        num_samples=num_samples,
        shuffle=shuffle,
        seed=seed,
        notes=[f"read {n_rows} rows ({schema} schema)", f"dropped {n_dups} duplicates"],
    )


@register_task_dataset("deepmath_103k")
def load_deepmath_103k(
    path: str = DEEPMATH_HUB_ID,
    *,
    split: str = "train",
    config: str | None = None,
    min_difficulty: float | None = None,
    max_difficulty: float | None = None,
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    system_prompt: str | None = None,
    prompt_template: str = DEEPMATH_TEMPLATE,
    max_prompt_chars: int | None = None,
    cache_dir: str | None = None,
    source: str = "deepmath_103k",
) -> datasets.Dataset:
    """DeepMath-103K: ``question`` -> prompt, gold = ``final_answer``, optional difficulty range.

    ``min_difficulty`` / ``max_difficulty`` are inclusive bounds on the float ``difficulty`` column
    (UECR uses 5-7 and 6-8). The default template asks for step-by-step reasoning and a \\boxed{} answer.
    """
    name = "deepmath_103k"
    if min_difficulty is not None and max_difficulty is not None and min_difficulty > max_difficulty:
        raise ValueError(f"{name}: min_difficulty={min_difficulty} > max_difficulty={max_difficulty}")
    raw = load_raw(path, dataset_name=name, split=split, config=config, cache_dir=cache_dir)
    filtering = min_difficulty is not None or max_difficulty is not None
    cols = ["question", "final_answer"] + (["difficulty"] if filtering else [])
    require_columns(raw, cols, name)
    # Select first: the three r1_solution columns are most of the bytes and are never needed here.
    table = raw.select_columns(cols).with_format("arrow")[:]
    n_rows = table.num_rows
    notes = [f"read {n_rows} rows"]
    if filtering:
        diff = table.column("difficulty")
        mask = pc.is_valid(diff)
        if min_difficulty is not None:
            mask = pc.and_(mask, pc.greater_equal(diff, min_difficulty))
        if max_difficulty is not None:
            mask = pc.and_(mask, pc.less_equal(diff, max_difficulty))
        table = table.filter(pc.fill_null(mask, False))
        notes.append(f"{table.num_rows} in difficulty [{min_difficulty}, {max_difficulty}]")
    return finalize(
        table.column("question").to_pylist(),
        table.column("final_answer").to_pylist(),
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
