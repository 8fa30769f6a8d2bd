"""Countdown (TinyZero / RAGEN): reach a target with + - * / using each given number exactly once.

Single-turn: the prompt shows the target and the numbers, the model answers ``<answer> equation </answer>``
and the ``countdown`` reward (:mod:`rewards.countdown`) checks the equation. Rows come from a seeded
generator (the default, offline) or from a copy of ``Jiayi-Pan/Countdown-Tasks-3to4`` (columns ``target``
and ``nums``; RAGEN's ``data/countdown/train.parquet`` is built from it), a local file or the hub id.

The dataset contract has exactly three columns, so the reward's inputs travel in ``answer`` as a JSON
object: ``{"target": 24, "numbers": [3, 4, 5, 6], "solution": "((3 + 5) - 4) * 6"}``. ``solution`` is
one reference equation (the generator's, or the solver's for loaded rows), ``null`` when loaded rows
were not solved (``require_solvable=False``). The reward reads ``target`` and ``numbers`` only.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from fractions import Fraction
from numbers import Integral, Real

import datasets

from trainer.data.common import finalize, load_raw, register_task_dataset, require_columns

logger = logging.getLogger("trainer.data")

COUNTDOWN_HUB_ID = "Jiayi-Pan/Countdown-Tasks-3to4"
# The problem is RAGEN's observation ("Target: 24, nums: [3, 4, 5, 6]"); the instruction is TinyZero's.
COUNTDOWN_TEMPLATE = (
    "{problem}\n\nUsing the numbers in nums, create an equation that equals the target. You can use basic "
    "arithmetic operations (+, -, *, /) and each number must be used exactly once. Show your work in "
    "<think> </think> tags and return the final equation in <answer> </answer> tags, for example "
    "<answer> (1 + 2) / 3 </answer>."
)
SUPPORTED_OPERATORS = ("+", "-", "*", "/")
MAX_SOLVER_NUMBERS = 6  # worst case (unsolvable): ~5 ms for 4 numbers, ~0.1 s for 5, a few s for 6
_MAX_TRIES_PER_SAMPLE = 10_000


def format_problem(target: int, numbers: Sequence[int]) -> str:
    """RAGEN's observation for one instance: ``Target: 24, nums: [3, 4, 5, 6]``."""
    return f"Target: {target}, nums: {list(numbers)}"


def encode_answer(target: int, numbers: Sequence[int], solution: str | None) -> str:
    """The ``answer`` column: a JSON object with ``target``, ``numbers`` and a reference ``solution``."""
    return json.dumps({"target": int(target), "numbers": [int(n) for n in numbers], "solution": solution})


def solve(numbers: Sequence[int], target: int, operators: Sequence[str] = SUPPORTED_OPERATORS) -> str | None:
    """One equation that uses every number exactly once and equals ``target`` exactly, or None.

    Exhaustive over all binary expression trees with ``operators`` (no unary minus, the same space the
    reward accepts), in exact :class:`~fractions.Fraction` arithmetic, so intermediate fractions and
    negatives are allowed (``(1 + 2) / 3`` and ``6 / (1 - 3 / 4)`` are found). States already explored
    (the same multiset of values) are not searched again. Cheap for the 3-4 numbers of Countdown (a few
    ms when unsolvable). The equation is fully parenthesised bar the outermost pair: ``8 / (3 - (8 / 3))``.
    """
    ops = set(operators)
    bad = ops - set(SUPPORTED_OPERATORS)
    if bad:
        raise ValueError(f"countdown: unsupported operators {sorted(bad)}; use a subset of {SUPPORTED_OPERATORS}")
    goal = int(target)
    if not numbers:
        return None
    failed: set[tuple] = set()

    # Values stay Python ints while they are integers (int arithmetic is ~50x cheaper than Fraction's) and
    # become Fractions only after an inexact division. Expressions are nested (left, op, right) tuples,
    # rendered once at the end instead of formatting a string for each of the thousands of candidates.
    def exact(v):
        return v if type(v) is int or v.denominator != 1 else v.numerator

    def divide(a, b):
        if type(a) is int and type(b) is int and a % b == 0:
            return a // b
        return exact(Fraction(a) / b)

    def combine(a, ea, b, eb):
        if "+" in ops:
            yield exact(a + b), (ea, "+", eb)
        if "-" in ops:
            yield exact(a - b), (ea, "-", eb)
            yield exact(b - a), (eb, "-", ea)
        if "*" in ops:
            yield exact(a * b), (ea, "*", eb)
        if "/" in ops:
            if b:
                yield divide(a, b), (ea, "/", eb)
            if a:
                yield divide(b, a), (eb, "/", ea)

    def search(items: list) -> object:
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        if len(items) == 2:  # the leaves: compare directly (half of all the work is here)
            return next((expr for value, expr in combine(*items[0], *items[1]) if value == goal), None)
        key = tuple(sorted(v for v, _ in items))
        if key in failed:
            return None
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
                for value, expr in combine(*items[i], *items[j]):
                    found = search(rest + [(value, expr)])
                    if found is not None:
                        return found
        failed.add(key)
        return None

    def render(expr, top: bool = False) -> str:
        if isinstance(expr, int):
            return str(expr)
        left, op, right = expr
        text = f"{render(left)} {op} {render(right)}"
        return text if top else f"({text})"

    found = search([(int(n), int(n)) for n in numbers])
    return None if found is None else render(found, top=True)


def generate_instance(
    rng: random.Random,
    *,
    num_numbers: int,
    min_number: int,
    max_number: int,
    max_target: int,
    operators: Sequence[str],
) -> tuple[int, list[int], str]:
    """One (target, numbers, solution) drawn from ``rng``: a random expression tree over the numbers.

    Repeatedly joins two random pool entries with a random operator among those whose result is a
    positive integer (``-`` takes the larger minus the smaller, ``/`` only divides exactly), so every
    intermediate value is a positive integer and the target is one. Draws whose target exceeds
    ``max_target`` are redrawn.
    """
    for _ in range(_MAX_TRIES_PER_SAMPLE):
        numbers = [rng.randint(min_number, max_number) for _ in range(num_numbers)]
        pool = [(n, str(n)) for n in numbers]
        while len(pool) > 1:
            i, j = rng.sample(range(len(pool)), 2)
            (a, ea), (b, eb) = pool[i], pool[j]
            if a < b:
                (a, ea), (b, eb) = (b, eb), (a, ea)  # a >= b from here on
            choices = []
            if "+" in operators:
                choices.append((a + b, f"({ea} + {eb})"))
            if "-" in operators and a > b:
                choices.append((a - b, f"({ea} - {eb})"))
            if "*" in operators:
                choices.append((a * b, f"({ea} * {eb})"))
            if "/" in operators and a % b == 0:
                choices.append((a // b, f"({ea} / {eb})"))
            if not choices:  # e.g. operators ("-",) and a == b
                break
            pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [rng.choice(choices)]
        if len(pool) == 1 and 1 <= pool[0][0] <= max_target:
            value, expr = pool[0]
            return value, numbers, expr[1:-1] if expr.startswith("(") else expr
    raise ValueError(
        f"countdown: no target in [1, {max_target}] after {_MAX_TRIES_PER_SAMPLE} draws with "
        f"num_numbers={num_numbers}, numbers [{min_number}, {max_number}], operators {list(operators)}"
    )


def _as_int(x) -> int | None:
    """``x`` as an int if it is an integral number (``24``, ``24.0``), else None (bools are not numbers)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, Integral):
        return int(x)
    if isinstance(x, Real) and float(x).is_integer():
        return int(x)
    return None


def _check_operators(operators: Sequence[str] | str) -> list[str]:
    if isinstance(operators, str):
        operators = list(operators.replace(" ", "").replace(",", ""))  # "+-*/" and ("+", "-") both work
    bad = [op for op in operators if op not in SUPPORTED_OPERATORS]
    if not operators or bad:
        raise ValueError(f"countdown: operators must be a non-empty subset of {SUPPORTED_OPERATORS}, got {operators}")
    return list(dict.fromkeys(operators))


def _num_numbers_range(num_numbers: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(num_numbers, int) and not isinstance(num_numbers, bool):
        lo = hi = num_numbers
    elif (
        isinstance(num_numbers, Sequence)
        and len(num_numbers) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in num_numbers)
    ):
        lo, hi = num_numbers
    else:
        raise ValueError(f"countdown: num_numbers must be an int or a [min, max] pair, got {num_numbers!r}")
    if not 2 <= lo <= hi:
        raise ValueError(f"countdown: need 2 <= num_numbers (min <= max), got {num_numbers!r}")
    return lo, hi


def _read_rows(raw: datasets.Dataset, *, require_solvable: bool, operators: Sequence[str]):
    """(problems, answers, notes) from ``target``/``nums`` rows; invalid and unsolvable rows are dropped."""
    require_columns(raw, ["target", "nums"], "countdown")
    cols = raw.select_columns(["target", "nums"]).to_dict()
    problems, answers = [], []
    n_invalid = n_unsolvable = 0
    for raw_target, raw_nums in zip(cols["target"], cols["nums"]):
        target = _as_int(raw_target)
        nums = [_as_int(n) for n in raw_nums] if isinstance(raw_nums, (list, tuple)) else []
        # Negative numbers cannot be written: the reward accepts no unary minus.
        if target is None or not nums or any(n is None or n < 0 for n in nums):
            n_invalid += 1
            continue
        solution = None
        if require_solvable:
            if len(nums) > MAX_SOLVER_NUMBERS:
                raise ValueError(
                    f"countdown: a row has {len(nums)} numbers; the solvability check handles at most "
                    f"{MAX_SOLVER_NUMBERS}. Pass require_solvable=False for such data."
                )
            solution = solve(nums, target, operators)
            if solution is None:
                n_unsolvable += 1
                continue
        problems.append(format_problem(target, nums))
        answers.append(encode_answer(target, nums, solution))
    notes = [f"read {len(cols['target'])} rows"]
    if n_invalid:
        notes.append(f"dropped {n_invalid} rows with a non-integer target or missing/negative/non-integer nums")
        logger.warning("countdown: dropped %d invalid rows", n_invalid)
    if require_solvable:
        notes.append(f"dropped {n_unsolvable} rows not solvable with {''.join(operators)}")
    return problems, answers, notes


@register_task_dataset("countdown")
def load_countdown(
    path: str | None = None,
    *,
    split: str = "train",
    config: str | None = None,
    cache_dir: str | None = None,
    num_samples: int | None = None,
    num_numbers: int | Sequence[int] = 3,
    min_number: int = 1,
    max_number: int = 99,
    max_target: int = 1000,
    operators: Sequence[str] | str = SUPPORTED_OPERATORS,
    require_solvable: bool = True,
    shuffle: bool = False,
    seed: int = 0,
    system_prompt: str | None = None,
    prompt_template: str = COUNTDOWN_TEMPLATE,
    max_prompt_chars: int | None = None,
    source: str = "countdown",
) -> datasets.Dataset:
    """Countdown instances: prompt "Target: T, nums: [...]" + instruction, ``answer`` = JSON (module doc).

    ``path=None`` (default) generates ``num_samples`` (default 1000) instances offline, seeded by
    ``(seed, split)`` like ``arithmetic``: ``num_numbers`` numbers (an int, or ``[min, max]`` drawn per
    row, e.g. ``[3, 4]`` like the 3to4 set) uniform in ``[min_number, max_number]`` (TinyZero: 1-99), and a
    target built from them with ``operators``, every intermediate result a positive integer, target in
    ``[1, max_target]``. Generated rows are solvable by construction.

    ``path=`` a local json/jsonl/parquet file or folder, or a hub id (``COUNTDOWN_HUB_ID``; offline and not
    cached -> :class:`DatasetUnavailableError`), with columns ``target`` (int) and ``nums`` (list of ints).
    With ``require_solvable`` (default) each row is checked by the exhaustive :func:`solve` over
    ``operators`` and unsolvable rows are dropped; RAGEN's filter is ``operators="+-"``, its data the first
    20,000 rows (``split="train[:20000]"``). The check costs a few ms per unsolvable 4-number row.
    The reward accepts all four operators whatever ``operators`` says.
    """
    ops = _check_operators(operators)
    if num_samples is not None and num_samples < 0:
        raise ValueError(f"countdown: num_samples must be >= 0, got {num_samples}")
    if path is None:
        lo, hi = _num_numbers_range(num_numbers)
        if not 1 <= min_number <= max_number:
            raise ValueError(f"countdown: need 1 <= min_number <= max_number, got {min_number}, {max_number}")
        if max_target < 1:
            raise ValueError(f"countdown: max_target must be >= 1, got {max_target}")
        n = 1000 if num_samples is None else num_samples
        # A string seed goes through SHA-512 in random.seed: stable across processes (unlike hash()).
        rng = random.Random(f"countdown:{seed}:{split}")
        problems, answers = [], []
        for _ in range(n):
            target, numbers, solution = generate_instance(
                rng,
                num_numbers=rng.randint(lo, hi),
                min_number=min_number,
                max_number=max_number,
                max_target=max_target,
                operators=ops,
            )
            problems.append(format_problem(target, numbers))
            answers.append(encode_answer(target, numbers, solution))
        notes = [
            f"generated {n} (seed={seed}, split={split}, num_numbers={num_numbers}, numbers "
            f"[{min_number}, {max_number}], max_target={max_target}, operators {ops})"
        ]
    else:
        raw = load_raw(path, dataset_name="countdown", split=split, config=config, cache_dir=cache_dir)
        problems, answers, notes = _read_rows(raw, require_solvable=require_solvable, operators=ops)
    return finalize(
        problems,
        answers,
        dataset_name="countdown",
        source=source,
        prompt_template=prompt_template,
        system_prompt=system_prompt,
        max_prompt_chars=max_prompt_chars,
        num_samples=num_samples,
        shuffle=shuffle,
        seed=seed,
        notes=notes,
    )
