"""Generated integer arithmetic: a seeded, file-free task for the CPU demo and for tests.

The defaults are deliberately easy (two single-digit operands, + and -, non-negative results):
the demo model, SmolLM2-135M-Instruct, can only do single-digit arithmetic, and GRPO learns nothing
from groups that are all wrong.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import datasets

from trainer.data.common import finalize, register_task_dataset

ARITHMETIC_TEMPLATE = "What is {problem}? Be brief and put the final answer in \\boxed{{}}."
SUPPORTED_OPERATORS = ("+", "-", "*")
_MAX_TRIES_PER_SAMPLE = 1000


def evaluate_expression(expression: str) -> int:
    """Value of a generated expression (space-separated integers and + - *), usual precedence.

    A tiny two-level parser rather than ``eval``: the grammar is fixed and this never runs code.
    """
    tokens = expression.split()
    # Multiplication binds tighter: fold each run of '*' into one term, then sum the signed terms.
    total, sign, term = 0, 1, int(tokens[0])
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            term *= int(num)
        elif op in "+-":
            total += sign * term
            sign, term = (1 if op == "+" else -1), int(num)
        else:
            raise ValueError(f"unsupported operator {op!r} in {expression!r}")
    return total + sign * term


def generate_problems(
    n: int,
    rng: random.Random,
    *,
    num_operands: int,
    min_value: int,
    max_value: int,
    operators: Sequence[str],
    allow_negative: bool,
) -> list[tuple[str, int]]:
    """``n`` (expression, value) pairs drawn from ``rng``; negatives are resampled unless allowed."""
    out = []
    for _ in range(n):
        for _ in range(_MAX_TRIES_PER_SAMPLE):
            nums = [rng.randint(min_value, max_value) for _ in range(num_operands)]
            ops = [rng.choice(operators) for _ in range(num_operands - 1)]
            parts = [str(nums[0])]
            for op, num in zip(ops, nums[1:]):
                parts += [op, str(num)]
            expression = " ".join(parts)
            value = evaluate_expression(expression)
            if allow_negative or value >= 0:
                out.append((expression, value))
                break
        else:  # e.g. operators=("-",) with many operands: almost every draw is negative
            raise ValueError(
                f"arithmetic: no non-negative result in {_MAX_TRIES_PER_SAMPLE} draws with "
                f"num_operands={num_operands}, operators={list(operators)}; set allow_negative=True"
            )
    return out


@register_task_dataset("arithmetic")
def load_arithmetic(
    *,
    num_samples: int = 1000,
    seed: int = 0,
    split: str = "train",
    num_operands: int = 2,
    min_value: int = 0,
    max_value: int = 9,
    operators: Sequence[str] = ("+", "-"),
    allow_negative: bool = False,
    shuffle: bool = False,
    system_prompt: str | None = None,
    prompt_template: str = ARITHMETIC_TEMPLATE,
    max_prompt_chars: int | None = None,
    source: str = "arithmetic",
) -> datasets.Dataset:
    """``num_samples`` integer arithmetic problems such as ``3 + 5``, answers as integer strings.

    Difficulty knobs: ``num_operands`` (>= 2), operand range ``[min_value, max_value]`` (min_value >= 0;
    use ``allow_negative`` for negative results), ``operators`` (a subset of ``+ - *``; usual precedence).
    The generator is seeded by ``(seed, split)``, so the same arguments give the same rows on every rank
    and rerun, and ``split="test"`` draws a different stream (small spaces such as 2 single-digit
    operands, 200 distinct problems, still overlap between splits). ``shuffle`` is accepted for a uniform
    signature; the rows are already random.
    """
    if not isinstance(num_operands, int) or num_operands < 2:
        raise ValueError(f"arithmetic: num_operands must be an int >= 2, got {num_operands!r}")
    if not 0 <= min_value <= max_value:
        raise ValueError(f"arithmetic: need 0 <= min_value <= max_value, got {min_value}, {max_value}")
    if isinstance(operators, str):
        operators = list(operators.replace(" ", ""))  # "+-" and ("+", "-") mean the same thing
    bad = [op for op in operators if op not in SUPPORTED_OPERATORS]
    if not operators or bad:
        raise ValueError(f"arithmetic: operators must be a non-empty subset of {SUPPORTED_OPERATORS}, got {operators}")
    if num_samples < 0:
        raise ValueError(f"arithmetic: num_samples must be >= 0, got {num_samples}")
    # A string seed goes through SHA-512 in random.seed: stable across processes (unlike hash()).
    rng = random.Random(f"arithmetic:{seed}:{split}")
    pairs = generate_problems(
        num_samples,
        rng,
        num_operands=num_operands,
        min_value=min_value,
        max_value=max_value,
        operators=list(operators),
        allow_negative=allow_negative,
    )
    return finalize(
        [p for p, _ in pairs],
        [str(v) for _, v in pairs],
        dataset_name="arithmetic",
        source=source,
        prompt_template=prompt_template,
        system_prompt=system_prompt,
        max_prompt_chars=max_prompt_chars,
        shuffle=shuffle,
        seed=seed,
        notes=[
            f"generated {num_samples} (seed={seed}, split={split}, num_operands={num_operands}, "
            f"values [{min_value}, {max_value}], operators {list(operators)})"
        ],
    )
