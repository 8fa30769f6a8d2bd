"""The ``countdown`` reward (TinyZero / RAGEN Countdown): is the answered equation right?

The gold is the dataset's ``answer`` column, a JSON object ``{"target": 24, "numbers": [3, 4, 5, 6], ...}``
(see :mod:`trainer.data.countdown`). The equation is the content of the LAST complete
``<answer>...</answer>`` after the think block is stripped. RAGEN's rule, with its constants configurable
(the released code's ``score``/``format_score`` could not be overridden):

- 0 when there is no equation, it is not a valid expression (see below), divides by zero, or the
  multiset of numbers it uses differs from the given numbers;
- ``format_score`` (0.1) when the numbers match but the value is not the target;
- ``score`` (1.0) when the value equals the target exactly. Values are exact Fractions, so ``8 / (3 - 8 / 3)``
  is exactly 24 (in floats it is 24.000000000000007). RAGEN compared floats with a 1e-5 tolerance, which
  also accepts a value that is merely within 1e-5 of the target; exact equality is stricter and is the
  right test for integer targets.

Valid expressions are non-negative decimal integer literals, binary ``+ - * /`` and parentheses; nothing
else (no unary minus or plus, no ``**``, ``//``, ``%``, names, calls, floats or ``=``; an answer such as
``3 + 5 = 8`` scores 0, as in RAGEN and TinyZero, whose number check counts the 8). Unlike their restricted
``eval``, the equation is never executed: it is parsed with :mod:`ast` and the tree is walked.

Why no worker process with a hard time limit (as :mod:`rewards.verifier` has for Math-Verify): the
equation is capped at ``MAX_EQUATION_CHARS`` characters from a whitelist, so it has at most ~100 integer
literals and the only operators are + - * /. The numbers are checked against the given numbers before
evaluating, so the value is built from a handful of small integers; even without that check, 200
characters cannot express a number with more than ~200 digits. Parsing and evaluation are therefore
microseconds in the worst case, and every exception (SyntaxError, RecursionError, MemoryError, ...) is
caught and scored 0.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from envs.parsing import parse_turn

from .math_rewards import completion_text, strip_think
from .registry import register_reward

MAX_EQUATION_CHARS = 200
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_EQUATION_CHARS = re.compile(r"[0-9+\-*/() \t\r\n]*", re.ASCII)  # ASCII digits only: no "٣" or "³"
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def extract_equation(text: str | None) -> str | None:
    """The stripped content of the last complete ``<answer>...</answer>`` after the think block, or None.

    "Complete" is a closing tag with an opening tag before it, so a trailing unclosed ``<answer>`` (a
    truncated completion) does not hide an earlier complete one (as TinyZero's ``re.finditer``). Two
    ``rfind`` calls: linear in the text, so a megabyte of garbage costs nothing.
    """
    if not text:
        return None
    body = strip_think(text)
    close = body.rfind(_ANSWER_CLOSE)
    if close < 0:
        return None
    start = body.rfind(_ANSWER_OPEN, 0, close)
    if start < 0:
        return None
    return body[start + len(_ANSWER_OPEN) : close].strip() or None


def parse_equation(equation: str | None, max_chars: int | None = MAX_EQUATION_CHARS) -> ast.expr | None:
    """The expression tree of ``equation`` if it is a valid Countdown expression (module doc), else None.

    Never raises: over-long or non-whitelisted text is rejected before parsing, and any parser failure
    (SyntaxError, "too many nested parentheses", RecursionError, MemoryError) gives None.
    """
    if not isinstance(equation, str) or not equation.strip():
        return None
    if max_chars is not None and len(equation) > max_chars:
        return None
    if not _EQUATION_CHARS.fullmatch(equation):
        return None
    try:
        tree = ast.parse(equation.strip(), mode="eval")
        nodes = list(ast.walk(tree))  # iterative (a queue), no recursion
    except Exception:  # noqa: BLE001 - garbage in, None out
        return None
    for node in nodes:
        if isinstance(node, (ast.Expression, ast.Add, ast.Sub, ast.Mult, ast.Div)):
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int:
            continue
        return None  # UnaryOp, Pow, FloorDiv, Mod, anything else
    return tree.body


def equation_numbers(tree: ast.expr) -> list[int]:
    """The integer literals of a parsed equation, in source order."""
    nums = [n for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    return [n.value for n in sorted(nums, key=lambda n: (n.lineno, n.col_offset))]


def evaluate(tree: ast.expr) -> Fraction | None:
    """The exact value of a parsed equation; None on division by zero (or a too-deep tree)."""

    def ev(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        left, right = ev(node.left), ev(node.right)
        op = _BINOPS[type(node.op)]
        if op == "+":
            return left + right
        if op == "-":
            return left - right
        if op == "*":
            return left * right
        return left / right  # ZeroDivisionError on / 0

    try:
        return ev(tree)
    except (ZeroDivisionError, RecursionError):
        return None


def evaluate_equation(equation: str | None, max_chars: int | None = MAX_EQUATION_CHARS) -> Fraction | None:
    """Exact value of ``equation`` as a Countdown expression, or None if invalid or dividing by zero."""
    tree = parse_equation(equation, max_chars)
    return None if tree is None else evaluate(tree)


@functools.lru_cache(maxsize=65536)
def _parse_gold(answer: str) -> tuple[int, tuple[int, ...]]:
    data = json.loads(answer)
    target, numbers = data["target"], data["numbers"]
    if isinstance(target, bool) or not isinstance(target, int) or not isinstance(numbers, list):
        raise TypeError("target must be an int and numbers a list")
    if any(isinstance(n, bool) or not isinstance(n, int) for n in numbers):
        raise TypeError("numbers must be ints")
    return target, tuple(sorted(numbers))


def parse_gold(answer) -> tuple[int, tuple[int, ...]]:
    """``(target, sorted numbers)`` from an ``answer`` cell (the JSON string, or an already-decoded dict).

    A malformed gold is a dataset/recipe error, not a model error, so it raises ValueError (as a missing
    ``answer`` column raises KeyError) instead of silently scoring every completion 0.
    """
    if isinstance(answer, dict):
        answer = json.dumps(answer)
    try:
        return _parse_gold(str(answer))
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(
            f"countdown reward: gold answer {str(answer)[:200]!r} is not the countdown JSON "
            f'{{"target": int, "numbers": [int, ...]}} ({type(e).__name__}: {e}); load the data with '
            "load_task_dataset('countdown', ...)"
        ) from e


def score_equation(
    equation: str | None, target: int, numbers, *, score: float = 1.0, format_score: float = 0.1
) -> float:
    """RAGEN's rule for one extracted equation: 0 / ``format_score`` / ``score`` (module doc)."""
    tree = parse_equation(equation)
    if tree is None:
        return 0.0
    if Counter(equation_numbers(tree)) != Counter(numbers):
        return 0.0
    value = evaluate(tree)
    if value is None:
        return 0.0
    return float(score) if value == target else float(format_score)


def _completions_and_golds(reward: str, completions: Any, kwargs: dict[str, Any]) -> tuple[list, list]:
    """The completions and their 'answer' column; a missing or misaligned column is a recipe error, not a model
    error, so it fails loudly."""
    completions = list(completions or [])
    if "answer" not in kwargs:
        raise KeyError(f"the {reward} reward needs the dataset column 'answer' (countdown JSON)")
    golds = list(kwargs["answer"])
    if len(golds) != len(completions):
        raise ValueError(f"'answer' has {len(golds)} entries for {len(completions)} completions")
    return completions, golds


def make_countdown(score: float = 1.0, format_score: float = 0.1):
    """A ``countdown`` reward paying ``score`` for a correct equation and ``format_score`` for one that
    uses exactly the given numbers but misses the target (RAGEN: 1.0 and 0.1)."""
    score, format_score = float(score), float(format_score)

    def countdown(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        """``score`` if the last ``<answer>`` equation (after ``</think>``) uses each given number exactly
        once and equals the target exactly; ``format_score`` if it uses the numbers but misses; else 0.0
        (no answer, unsafe or invalid expression, wrong numbers, division by zero, garbage)."""
        completions, golds = _completions_and_golds("countdown", completions, kwargs)
        out = []
        for completion, gold in zip(completions, golds):
            target, numbers = parse_gold(gold)
            equation = extract_equation(completion_text(completion))
            out.append(score_equation(equation, target, numbers, score=score, format_score=format_score))
        return out

    return countdown


countdown = register_reward("countdown", factory=make_countdown)(make_countdown())


def make_ragen_countdown(score: float = 1.0, format_score: float = 0.1, format_penalty: float = -0.1):
    """RAGEN's whole single-turn Countdown score (mll-lab-nu/RAGEN@20daedc: ragen/llm_agent/ctx_manager.py:196-221
    parses the reply, es_manager.py:224-237 adds ``format_penalty`` when it yields no action, ragen/env/countdown/
    env.py scores the one action; config/_4_countdown.yaml: 1 turn, 1 action). A reply that does not parse as
    ``<think>…</think><answer>A</answer>`` (envs/parsing.py; the think prefill is in front when ``think_prefill`` is
    on) is no action: ``format_penalty`` only, never the equation's score. Otherwise the first ``||``-separated
    part of A is scored 0 / ``format_score`` / ``score`` as :func:`score_equation` (no penalty)."""
    score, format_score, format_penalty = float(score), float(format_score), float(format_penalty)

    def ragen_countdown(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        """``format_penalty`` for a reply without an action, else the action's Countdown score."""
        completions, golds = _completions_and_golds("ragen_countdown", completions, kwargs)
        out = []
        for completion, gold in zip(completions, golds):
            target, numbers = parse_gold(gold)
            actions = parse_turn(completion_text(completion), max_actions=1).actions
            out.append(score_equation(actions[0], target, numbers, score=score, format_score=format_score)
                       if actions else format_penalty)
        return out

    return ragen_countdown


ragen_countdown = register_reward("ragen_countdown", factory=make_ragen_countdown)(make_ragen_countdown())
