"""Offline task datasets: any local JSON/JSONL file, and CHAMP from the installed ``champ-dataset`` wheel."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path

import datasets

from trainer.data.common import finalize, load_raw, register_task_dataset, require_columns

BOXED_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."

# CHAMP's own instruction (champ_dataset.prompt.prompt_main) plus a \boxed{} request, so math-verify
# rewards can find the answer.
CHAMP_TEMPLATE = (
    "Solve the following problem. Make sure to show your work before giving the final answer, "
    "and put the final answer within \\boxed{{}}.\n\n{problem}"
)
CHAMP_CATEGORIES = ("Combinatorics", "Inequality", "Number-Theory", "Polynomial", "Sequence")

# A gold answer that is a plain number (integer, decimal or a/b): what a strict math verifier can
# check without reading English ("0 is the only possible value", "No integer solutions", ...).
_NUMERIC_ANSWER = re.compile(r"^-?\d+(\.\d+)?(/\d+)?$")


@register_task_dataset("json")
def load_json(
    path: str | os.PathLike,
    *,
    problem_column: str | None = None,
    answer_column: str = "answer",
    split: str = "train",
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    system_prompt: str | None = None,
    prompt_template: str = BOXED_TEMPLATE,
    max_prompt_chars: int | None = None,
    cache_dir: str | None = None,
    source: str | None = None,
) -> datasets.Dataset:
    """A local JSON/JSONL (or parquet/csv) file of problems with gold answers.

    ``problem_column`` defaults to ``problem``, else ``question`` (whichever the file has);
    ``answer_column`` defaults to ``answer``. Numeric answers become strings. ``source`` defaults to the
    file's stem, so mixed evaluation sets stay distinguishable in the logs. A problem column of chat messages is
    refused (it would be stringified): a file with a ready ``prompt`` column is read by ``dataset_name: <path>``
    (trainer/data/generic.py), which keeps it and every other column as they are.
    """
    name = f"json:{path}"
    raw = load_raw(path, dataset_name=name, split=split, cache_dir=cache_dir)
    if problem_column is None:
        problem_column = next((c for c in ("problem", "question") if c in raw.column_names), "problem")
    require_columns(raw, [problem_column, answer_column], name)
    if isinstance(raw.features[problem_column], (datasets.List, datasets.LargeList, list)):
        # Chat messages (or any list) would be stringified into the template: refuse, and point to the path that
        # keeps them.
        raise ValueError(
            f"{name}: column {problem_column!r} holds a list (chat messages?), not a problem string; this loader "
            f"writes the problem into prompt_template. Use dataset_name: {path} (a local path) instead: its 'prompt' "
            "column is used as it is and every other column reaches the rewards"
        )
    table = raw.select_columns([problem_column, answer_column]).with_format("arrow")[:]
    return finalize(
        table.column(problem_column).to_pylist(),
        table.column(answer_column).to_pylist(),
        dataset_name=name,
        source=source if source is not None else Path(str(path)).stem,
        prompt_template=prompt_template,
        system_prompt=system_prompt,
        max_prompt_chars=max_prompt_chars,
        num_samples=num_samples,
        shuffle=shuffle,
        seed=seed,
    )


@functools.lru_cache(maxsize=2)
def _champ_problems(version: str) -> dict:
    """CHAMP's problems by id, parsed once per process (the JSON is 72 MB; the loader only reads them)."""
    import champ_dataset  # optional: the `demo` extra

    return champ_dataset.load(version).problems


@register_task_dataset("champ")
def load_champ(
    *,
    version: str = "v0",
    categories: Sequence[str] | None = None,
    numeric_only: bool = False,
    raw_answer: bool = False,
    split: str = "train",
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    system_prompt: str | None = None,
    prompt_template: str = CHAMP_TEMPLATE,
    max_prompt_chars: int | None = None,
    source: str = "champ",
) -> datasets.Dataset:
    """CHAMP: 270 competition problems with gold answers, shipped inside the ``champ-dataset`` wheel.

    The package stores everything in ``champ_dataset/dataset_files/v0.json``; ``champ_dataset.load``
    parses it (~0.6 s, 72 MB of which the problems are a small part). Gold answers are short free-form
    strings, not always math: ``239``, ``2^(n-1)``, ``C(10, 5), or equivalently 252``,
    ``No integer solutions``. The package marks the math spans with ``@@``; the default is its cleaned
    ``answer`` (marks removed), ``raw_answer=True`` keeps the marks. ``numeric_only=True`` keeps only
    problems whose answer is a plain number, which a strict verifier can grade. ``categories`` filters
    by CHAMP category (see ``CHAMP_CATEGORIES``). CHAMP has one split; ``split`` is accepted for a uniform
    call signature and must be ``train``.
    """
    try:
        import champ_dataset  # noqa: F401  # optional: the `demo` extra; imported to fail with an install hint
    except ImportError as e:  # a clear fix beats a bare ModuleNotFoundError deep in a run
        raise ImportError("champ: the 'champ-dataset' package is not installed (pip install champ-dataset)") from e
    if split != "train":
        raise ValueError(f"champ: only split='train' exists (all 270 problems), got {split!r}")
    if categories is not None:
        unknown = sorted(set(categories) - set(CHAMP_CATEGORIES))
        if unknown:
            raise ValueError(f"champ: unknown categories {unknown}; known: {list(CHAMP_CATEGORIES)}")
    problems_by_id = _champ_problems(version)
    problems, answers = [], []
    for prob in problems_by_id.values():
        if categories is not None and prob.category not in categories:
            continue
        answer = prob.raw_answer if raw_answer else prob.answer
        if numeric_only and not _NUMERIC_ANSWER.match(prob.answer.strip()):
            continue
        problems.append(prob.text)
        answers.append(answer)
    return finalize(
        problems,
        answers,
        dataset_name="champ",
        source=source,
        prompt_template=prompt_template,
        system_prompt=system_prompt,
        max_prompt_chars=max_prompt_chars,
        num_samples=num_samples,
        shuffle=shuffle,
        seed=seed,
        notes=[f"{len(problems_by_id)} problems in champ {version}", f"{len(problems)} after filters"],
    )
