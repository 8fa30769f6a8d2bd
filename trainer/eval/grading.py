"""Grading evaluation completions: option-letter extraction, final-answer strings, 1/0 correctness.

- Math items: the last ``\\boxed{}`` (else DAPO's ``Answer:`` line) after the think block, checked against the
  gold by Math-Verify through :mod:`rewards.math` / :mod:`rewards.verifier` (worker processes with a hard
  per-item time limit): the same path as the ``math_accuracy`` training reward, so garbage, huge or
  adversarial completions score 0 and never hang or raise.
- Choice items (the paper's QA protocol): the final option letter is extracted, case-normalised and compared
  with the reference letter.

Every extraction is linear-time string scanning, so a 1 MB completion costs milliseconds.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rewards import verifier
from rewards.math import completion_text, make_math_accuracy, strip_think
from rewards.math import extract_final_answer as _math_final_answer
from trainer.eval.benchmarks import EvalItem

__all__ = ["extract_choice", "extract_final_answer", "grade"]

_LETTERS = string.ascii_uppercase
_L = r"([A-Za-z])"  # an option letter; case-normalised afterwards
_END = r"(?![A-Za-z0-9])"  # the letter is a whole token: "Answer: Apple" is no answer
# "Answer: X", "Final answer: (x)", "**Answer:** B", "The answer is: C": any case after a colon.
_ANSWER_COLON = re.compile(
    r"(?i:answer)\s*(?:(?i:is)\s*)?[:\uff1a]\s*[*_]*\s*"
    r"(?:\(\s*" + _L + r"\s*\)|\[\s*" + _L + r"\s*\]|" + _L + r")" + _END
)
# "The answer is (b)", "the correct answer is B", "answer is option C": a bare letter must be upper case here,
# so "the answer is a multiple of..." is not read as option A.
_ANSWER_IS = re.compile(
    r"(?i:answer)\s+(?i:is)\s+[*_]*\s*(?:\(\s*" + _L + r"\s*\)|\[\s*" + _L + r"\s*\]|(?i:option)\s+" + _L
    + r"|([A-Z]))" + _END
)
# "\boxed{B}", "\boxed{(b)}", "\boxed{\text{C}}", "\boxed{\textbf{D}}"
_BOXED = re.compile(
    r"\\(?:boxed|fbox)\s*\{\s*(?:\\text(?:bf|rm)?\s*\{\s*)?\(?\s*" + _L + r"\s*\)?\s*(?:\}\s*)?\}"
)
# The final line is just a letter: "B", "(c)", "**D**", "C."
_LONE_LINE = re.compile(r"[\s*_(\[]*" + _L + r"[\s*_)\].:]*")


def extract_choice(text, num_choices: int) -> str | None:
    """The final option letter of a completion, upper case, or None.

    The think block is removed first (an unclosed ``<think>`` leaves no answer). Then the last of the answer
    patterns wins: ``Answer: X`` / ``answer is (X)`` / ``\\boxed{X}``; without any, a final line that is only
    a letter. Only the first ``num_choices`` letters count (a match on another letter, e.g. the pronoun in
    "Answer: I think ...", is ignored). ``text`` may be a string or a conversational completion. Never raises.
    """
    try:
        n = max(0, min(int(num_choices), len(_LETTERS)))
        if n == 0:
            return None
        allowed = _LETTERS[:n]
        body = strip_think(completion_text(text))
        best_pos, best = -1, None
        for pattern in (_ANSWER_COLON, _ANSWER_IS, _BOXED):
            for m in pattern.finditer(body):
                letter = next((g for g in m.groups() if g), "").upper()
                if letter in allowed and m.start() > best_pos:
                    best_pos, best = m.start(), letter
        if best is not None:
            return best
        tail = body.rstrip()
        last_line = tail[tail.rfind("\n") + 1 :]
        m = _LONE_LINE.fullmatch(last_line)
        if m and m.group(1).upper() in allowed:
            return m.group(1).upper()
        return None
    except Exception:  # noqa: BLE001 - garbage in (odd types, odd text): no answer, never an error
        return None


def extract_final_answer(item: EvalItem, completion) -> str:
    """The extracted final answer of ``completion`` as a stripped string ("" if none), for answer-dispersion
    statistics: math -> the last ``\\boxed{}`` content (else the ``Answer:`` line) after the think block;
    choice -> the option letter."""
    try:
        if item.kind == "choice":
            return extract_choice(completion, len(item.choices) or len(_LETTERS)) or ""
        return (_math_final_answer(completion_text(completion), prefer="boxed") or "").strip()
    except Exception:  # noqa: BLE001
        return ""


_PARALLEL_MIN = 32  # below this a single verifier round trip is cheaper than splitting the batch


def _grade_math(items: Sequence[EvalItem], completions: Sequence, timeout: float) -> list[float]:
    """``math_accuracy`` over the batch, split across the verifier's worker processes when it is large."""
    reward = make_math_accuracy(timeout=timeout)
    n = len(items)
    golds = [it.gold for it in items]
    workers = max(1, min(verifier.MAX_WORKERS, n // _PARALLEL_MIN))
    if workers == 1:
        return reward(completions=list(completions), answer=golds)
    bounds = [(n * k // workers, n * (k + 1) // workers) for k in range(workers)]
    with ThreadPoolExecutor(workers, thread_name_prefix="eval-grade") as pool:
        parts = pool.map(lambda b: reward(completions=list(completions[b[0]:b[1]]), answer=golds[b[0]:b[1]]), bounds)
        return [score for part in parts for score in part]


def grade(items_and_completions: Sequence[tuple[EvalItem, object]], timeout: float = 5.0) -> list[float]:
    """1.0 / 0.0 correctness for each ``(item, completion)`` pair, in order.

    Math items go through Math-Verify (gold parsed first) with at most ``timeout`` seconds per item, in a
    batch; a timeout, an unparsable gold and a missing answer all score 0.0. Choice items score 1.0 when
    :func:`extract_choice` equals the gold letter (case-insensitive). Completions may be strings or
    conversational message lists.
    """
    pairs = list(items_and_completions)
    scores: list[float] = [0.0] * len(pairs)
    math_idx: list[int] = []
    for i, (item, completion) in enumerate(pairs):
        if item.kind == "math":
            math_idx.append(i)
        elif item.kind == "choice":
            letter = extract_choice(completion, len(item.choices) or len(_LETTERS))
            scores[i] = 1.0 if letter is not None and letter == str(item.gold).strip().upper() else 0.0
        else:
            raise ValueError(f"{item.benchmark}/{item.id}: unknown item kind {item.kind!r}")
    if math_idx:
        results = _grade_math([pairs[i][0] for i in math_idx], [pairs[i][1] for i in math_idx], timeout)
        for i, score in zip(math_idx, results):
            scores[i] = score
    return scores
