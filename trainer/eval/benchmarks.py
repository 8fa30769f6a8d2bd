"""Evaluation benchmarks by name: ``load_benchmark("math500")`` -> a list of :class:`EvalItem`.

The ten benchmarks of the GRPODropout paper (App. B.1) plus two offline sets for CPU runs:

============== ====================================== =========== ================================================
name           hub id (config)                        split       mapping (question / gold / id)
============== ====================================== =========== ================================================
gsm8k          openai/gsm8k (main)                    test        question / text after "####", commas removed /
                                                                  row index
math500        HuggingFaceH4/MATH-500                 test        problem / answer / unique_id
olympiadbench  Hothan/OlympiadBench                   train       question / final_answer list joined with ", ",
               (OE_TO_maths_en_COMP)                              "$" removed / id
amc23          math-ai/amc23                          test        question / answer (27.0 -> "27") / id
aime24         HuggingFaceH4/aime_2024                train       problem / answer / id
aime25         MathArena/aime_2025                    train       problem / answer / problem_idx
hmmt25_feb     MathArena/hmmt_feb_2025                train       problem / answer / problem_idx
hmmt25_nov     MathArena/hmmt_nov_2025                train       problem / answer / problem_idx
arc_c          allenai/ai2_arc (ARC-Challenge)        test        question / answerKey as a letter; choices.text in
                                                                  label order, labels "1".."5" -> A..E / id
mmlu_pro       TIGER-Lab/MMLU-Pro                     test        question / answer letter; options / question_id
supergpqa      m-a-p/SuperGPQA                        train       question / answer_letter; options / uuid
champ          (offline: champ-dataset package)       train       problem text / cleaned answer / identifier
arithmetic     (offline: generated)                   test        "What is 3 + 4?" / value / row index
============== ====================================== =========== ================================================

``path=`` replaces the hub id with a local json/jsonl/parquet file or folder holding the same columns
(the project's machines are offline: an uncached hub id fails fast with :class:`DatasetUnavailableError`).
Numeric golds are rendered as text, integral floats as integers (``27.0`` -> ``"27"``). Rows without a
question or gold (or, for choice items, with a gold letter outside the options) are dropped with a warning,
before ``num_samples`` keeps the first n. Ids are the dataset's id column where it has one, else
``f"{name}-{row_index}"`` (the index in the loaded split, so ids do not shift when rows are dropped);
a question is identified by ``(benchmark, id)``.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.data import load_task_dataset
from trainer.data.common import DatasetUnavailableError, load_raw, require_columns
from trainer.data.local import _champ_problems

__all__ = [
    "BENCHMARKS",
    "CHOICE_PROMPT",
    "MATH_PROMPT",
    "BenchmarkSpec",
    "DatasetUnavailableError",
    "EvalItem",
    "list_benchmarks",
    "load_benchmark",
    "render_prompt",
]

logger = logging.getLogger("trainer.eval")

LETTERS = string.ascii_uppercase

MATH_PROMPT = "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
CHOICE_PROMPT = (
    "{question}\n\n{options}\n\n"
    'Answer with the letter of the correct option; end your response with "Answer: X", '
    "where X is one of {letters}."
)


@dataclass(frozen=True)
class EvalItem:
    """One evaluation question. ``kind`` is ``"math"`` (gold: an answer for Math-Verify) or ``"choice"``
    (gold: an upper-case option letter; ``choices``: the option texts in letter order A, B, ...)."""

    benchmark: str
    id: str
    question: str
    gold: str
    kind: str  # "math" | "choice"
    choices: tuple[str, ...] = ()  # option texts in letter order for choice items


# A row mapper gets the row (a dict) and returns (question, gold, choices); gold "" drops the row.
RowMapper = Callable[[Mapping[str, Any]], "tuple[Any, str, tuple[str, ...]]"]


@dataclass(frozen=True)
class BenchmarkSpec:
    """How to load one benchmark: a hub dataset plus a row mapping, or an offline ``loader``."""

    kind: str
    hub_id: str | None = None
    split: str = "test"
    config: str | None = None
    columns: tuple[str, ...] = ()  # required columns (checked with require_columns)
    id_column: str | None = None  # used when the loaded data has it, else f"{name}-{row_index}"
    row: RowMapper | None = None
    # offline benchmarks: loader(name, split, config, num_samples, seed) -> list[EvalItem]
    loader: Callable[..., list[EvalItem]] | None = field(default=None, repr=False)


# ------------------------------------------------------------------------------------------- gold values


def gold_text(value: Any) -> str:
    """A gold value as stripped text: integral floats as integers (27.0 -> "27", also the string "27.0")."""
    if value is None:
        return ""
    if isinstance(value, bool):  # bool is an int subclass; a boolean gold is a schema error, keep it visible
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return str(int(value))
        return repr(value) if math.isfinite(value) else ""
    text = str(value).strip()
    head, dot, tail = text.partition(".")
    if dot and tail and set(tail) == {"0"} and head.lstrip("-").isdigit():
        return head  # "27.0" (a float written out as text by some exporter)
    return text


def _gsm8k_gold(answer: Any) -> str:
    text = "" if answer is None else str(answer)
    if "####" not in text:
        return ""
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def _strip_dollars(s: str) -> str:
    return str(s).replace("\\$", "").replace("$", "").strip()


def _olympiad_gold(final_answer: Any) -> str:
    if final_answer is None:
        return ""
    if isinstance(final_answer, str):
        final_answer = [final_answer]
    parts = [_strip_dollars(a) for a in final_answer if a is not None]
    return ", ".join(p for p in parts if p)


def _letter_for(label: Any, labels: Sequence[Any]) -> str:
    """The letter of ``label``'s position among ``labels`` ("" when it is not one of them)."""
    key = str(label).strip() if label is not None else ""
    for i, lab in enumerate(labels):
        if str(lab).strip() == key and i < len(LETTERS):
            return LETTERS[i]
    return ""


def _choice_gold(letter: Any, n_options: int) -> str:
    gold = str(letter).strip().upper() if letter is not None else ""
    return gold if len(gold) == 1 and gold in LETTERS[:n_options] else ""


# ------------------------------------------------------------------------------------------- row mappers


def _plain(question_col: str, answer_col: str) -> RowMapper:
    return lambda r: (r[question_col], gold_text(r[answer_col]), ())


def _gsm8k_row(r: Mapping[str, Any]):
    return r["question"], _gsm8k_gold(r["answer"]), ()


def _olympiad_row(r: Mapping[str, Any]):
    return r["question"], _olympiad_gold(r["final_answer"]), ()


def _arc_row(r: Mapping[str, Any]):
    """ARC choices are ``{"text": [...], "label": [...]}`` with labels A-E or (for some items) 1-5; the options
    are lettered by position, which is the label order in both cases, so "1" -> A and answerKey "3" -> C."""
    choices = r["choices"] or {}
    texts, labels = list(choices.get("text") or []), list(choices.get("label") or [])
    if len(texts) != len(labels):
        return r["question"], "", ()
    return r["question"], _letter_for(r["answerKey"], labels), tuple(str(t) for t in texts)


def _options_row(answer_col: str) -> RowMapper:
    def row(r: Mapping[str, Any]):
        options = tuple(str(o) for o in (r["options"] or []))[: len(LETTERS)]
        return r["question"], _choice_gold(r[answer_col], len(options)), options

    return row


# ------------------------------------------------------------------------------------------- offline sets


def _load_champ(name: str, split: str | None, config: str | None, num_samples: int | None, seed: int):
    """CHAMP's 270 problems, read by the same cached reader as ``load_task_dataset("champ")``; ``config`` is
    the package's data version (default v0). Question = the raw problem text, gold = the cleaned answer."""
    if split not in (None, "train"):
        raise ValueError(f"{name}: only split='train' exists (all 270 problems), got {split!r}")
    if importlib.util.find_spec("champ_dataset") is None:
        raise ImportError(f"{name}: the 'champ-dataset' package is not installed (pip install champ-dataset)")

    problems = _champ_problems(config or "v0").values()
    return [{"question": p.text, "answer": p.answer, "id": p.identifier} for p in problems]


def _load_arithmetic(name: str, split: str | None, config: str | None, num_samples: int | None, seed: int):
    """Generated arithmetic via ``load_task_dataset("arithmetic", ...)`` (default split "test": a stream other
    than the training one); the question is "What is 3 + 4?", without the training prompt's instructions."""
    kwargs: dict[str, Any] = {"seed": seed, "split": split or "test", "prompt_template": "What is {problem}?"}
    if num_samples is not None:
        kwargs["num_samples"] = num_samples
    ds = load_task_dataset("arithmetic", **kwargs)
    return [{"question": p[-1]["content"], "answer": a} for p, a in zip(ds["prompt"], ds["answer"])]


# ------------------------------------------------------------------------------------------- registry

BENCHMARKS: dict[str, BenchmarkSpec] = {
    "gsm8k": BenchmarkSpec(
        "math", "openai/gsm8k", "test", "main", ("question", "answer"), None, _gsm8k_row
    ),
    "math500": BenchmarkSpec(
        "math", "HuggingFaceH4/MATH-500", "test", None, ("problem", "answer"), "unique_id", _plain("problem", "answer")
    ),
    "olympiadbench": BenchmarkSpec(
        "math", "Hothan/OlympiadBench", "train", "OE_TO_maths_en_COMP", ("question", "final_answer"), "id",
        _olympiad_row,
    ),
    "amc23": BenchmarkSpec(
        "math", "math-ai/amc23", "test", None, ("question", "answer"), "id", _plain("question", "answer")
    ),
    "aime24": BenchmarkSpec(
        "math", "HuggingFaceH4/aime_2024", "train", None, ("problem", "answer"), "id", _plain("problem", "answer")
    ),
    "aime25": BenchmarkSpec(
        "math", "MathArena/aime_2025", "train", None, ("problem", "answer"), "problem_idx", _plain("problem", "answer")
    ),
    "hmmt25_feb": BenchmarkSpec(
        "math", "MathArena/hmmt_feb_2025", "train", None, ("problem", "answer"), "problem_idx",
        _plain("problem", "answer"),
    ),
    "hmmt25_nov": BenchmarkSpec(
        "math", "MathArena/hmmt_nov_2025", "train", None, ("problem", "answer"), "problem_idx",
        _plain("problem", "answer"),
    ),
    "arc_c": BenchmarkSpec(
        "choice", "allenai/ai2_arc", "test", "ARC-Challenge", ("question", "choices", "answerKey"), "id", _arc_row
    ),
    "mmlu_pro": BenchmarkSpec(
        "choice", "TIGER-Lab/MMLU-Pro", "test", None, ("question", "options", "answer"), "question_id",
        _options_row("answer"),
    ),
    "supergpqa": BenchmarkSpec(
        "choice", "m-a-p/SuperGPQA", "train", None, ("question", "options", "answer_letter"), "uuid",
        _options_row("answer_letter"),
    ),
    "champ": BenchmarkSpec(
        "math", None, "train", None, (), "id", _plain("question", "answer"), loader=_load_champ
    ),
    "arithmetic": BenchmarkSpec(
        "math", None, "test", None, (), None, _plain("question", "answer"), loader=_load_arithmetic
    ),
}


def list_benchmarks() -> list[str]:
    """Registered benchmark names, in registry order (the paper's ten first)."""
    return list(BENCHMARKS)


def load_benchmark(
    name: str,
    path: str | os.PathLike | None = None,
    split: str | None = None,
    config: str | None = None,
    num_samples: int | None = None,
    seed: int = 0,
    cache_dir: str | None = None,
) -> list[EvalItem]:
    """Load benchmark ``name`` as a list of :class:`EvalItem` (see the module doc for each mapping).

    ``path`` replaces the hub id (a local file/folder with the hub's columns); ``split``/``config`` override
    the defaults; ``num_samples`` keeps the first n items in dataset order (no shuffling). ``seed`` only
    matters for the generated ``arithmetic`` set. Unknown names raise ValueError listing the known ones;
    an uncached hub id offline raises :class:`DatasetUnavailableError`.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {list_benchmarks()}")
    if num_samples is not None and num_samples < 0:
        raise ValueError(f"{name}: num_samples must be >= 0, got {num_samples}")
    spec = BENCHMARKS[name]
    if spec.loader is not None:
        if path is not None:
            raise ValueError(f"{name}: an offline benchmark takes no path= (got {path!r})")
        rows = spec.loader(name, split, config, num_samples, seed)
        columns = set(rows[0]) if rows else set()
    else:
        ds = load_raw(
            path if path is not None else spec.hub_id,
            dataset_name=name,
            split=split or spec.split,
            config=config if config is not None else spec.config,
            cache_dir=cache_dir,
        )
        require_columns(ds, spec.columns, name)
        columns = set(ds.column_names)
        keep = list(spec.columns) + ([spec.id_column] if spec.id_column in columns else [])
        rows = ds.select_columns(keep).to_list()
    use_id = spec.id_column is not None and spec.id_column in columns
    items: list[EvalItem] = []
    dropped = 0
    for index, row in enumerate(rows):
        question, gold, choices = spec.row(row)
        question = "" if question is None else str(question)
        if not question.strip() or not gold:
            dropped += 1
            continue
        raw_id = row.get(spec.id_column) if use_id else None
        item_id = f"{name}-{index}" if raw_id is None or str(raw_id) == "" else str(raw_id)
        items.append(EvalItem(name, item_id, question, gold, spec.kind, tuple(choices)))
    if dropped:
        logger.warning(
            "%s: dropped %d of %d rows without a question or a usable gold answer", name, dropped, len(rows)
        )
    if num_samples is not None:
        if num_samples > len(items):
            logger.warning("%s: num_samples=%d but only %d items available", name, num_samples, len(items))
        items = items[:num_samples]
    logger.info("%s: loaded %d items (%s)", name, len(items), path if path is not None else spec.hub_id or "offline")
    return items


# ------------------------------------------------------------------------------------------- prompts


def format_options(choices: Sequence[str]) -> str:
    """Option lines ``"A. text"``, one per choice."""
    return "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(choices))


def render_prompt(item: EvalItem, template: str | None = None) -> list[dict[str, str]]:
    """Chat messages for ``item``: one user message, ``template`` (default :data:`MATH_PROMPT` for math items,
    :data:`CHOICE_PROMPT` for choice items) formatted with ``question``, ``options`` (the "A. text" lines)
    and ``letters`` (e.g. "A, B, C, D"). Literal braces in a template are doubled, as in ``\\boxed{{}}``."""
    if item.kind not in ("math", "choice"):
        raise ValueError(f"{item.benchmark}/{item.id}: unknown item kind {item.kind!r} (expected 'math' or 'choice')")
    if template is None:
        template = MATH_PROMPT if item.kind == "math" else CHOICE_PROMPT
    if "{question}" not in template:
        raise ValueError(f"prompt template must contain '{{question}}': {template!r}")
    letters = ", ".join(LETTERS[: len(item.choices)])
    content = template.format(question=item.question, options=format_options(item.choices), letters=letters)
    return [{"role": "user", "content": content}]
