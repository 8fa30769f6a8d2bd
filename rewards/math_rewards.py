"""Math answer extraction and verifiable math rewards: ``math_accuracy`` (and its ``math_accuracy_full_text``
variant, the GRPODropout authors' grading), ``think_format``, ``dapo_accuracy``.

All rewards follow TRL's contract ``f(prompts, completions, completion_ids=None, **columns)``; the gold
answer is the dataset column ``answer`` (``kwargs["answer"]``, aligned with ``completions``). Completions
may be strings or conversational message lists. Equivalence goes through :mod:`rewards.verifier` (Math-Verify
in a worker process with a hard per-item time limit), so garbage or adversarial output is scored, never
raised on, and never hangs the trainer. Extraction is linear-time string scanning (``rfind`` and one
brace-matching pass; the only regex runs on the last 300 characters), so a 1 MB completion costs ~1 ms.
"""

from __future__ import annotations

import functools
import logging
import re
import time

from .registry import register_reward
from .verifier import DEFAULT_TIMEOUT, batch_deadline, verify_batch

logger = logging.getLogger(__name__)

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")  # DAPO's pattern (verl math_dapo.py)
_ANSWER_WINDOW = 300  # DAPO looks only at the last 300 characters (longest MATH-500 answer: 197)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_checked_golds: set[str] = set()  # golds already checked for parseability


def extract_boxed(text: str | None) -> str | None:
    """Content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, or None.

    Nested braces are matched; escaped braces (``\\{``, ``\\}``) are literal characters and don't count.
    ``\\boxed 5`` (command, whitespace, one token) gives the token. If the last box is unbalanced (e.g. a
    truncated completion) or empty the result is None; an earlier complete box is NOT used instead, since the
    model's final answer is the last one it started.
    """
    if not text:
        return None
    cmd = max(_BOX_COMMANDS, key=lambda c: text.rfind(c))
    start = text.rfind(cmd)
    if start < 0:
        return None
    i = start + len(cmd)
    j = i
    while j < len(text) and text[j].isspace():
        j += 1
    if j < len(text) and text[j] == "{":
        depth, k = 0, j
        while k < len(text):
            ch = text[k]
            if ch == "\\":
                k += 2  # skip the escaped character: "\{" and "\}" are literal, "\\" is a line break
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : k].strip() or None
            k += 1
        return None  # unbalanced
    if j > i and j < len(text):  # "\boxed 5": a single whitespace-delimited token
        m = re.match(r"[^\s$]+", text[j : j + 200])
        return m.group(0) if m else None
    return None  # "\boxedx" or "\boxed" at the very end


def extract_answer_line(text: str | None) -> str | None:
    """DAPO's ``Answer: ...`` line: the last match of ``(?i)Answer\\s*:\\s*([^\\n]+)`` in the last 300 chars.

    Markdown emphasis around the value (``**Answer:** 5``) is stripped; an empty value gives None.
    """
    if not text:
        return None
    matches = _ANSWER_LINE.findall(text[-_ANSWER_WINDOW:])
    if not matches:
        return None
    value = matches[-1].strip().strip("*").strip()
    return value or None


def strip_think(text: str) -> str:
    """The part of ``text`` after the last ``</think>``: the answer, with the reasoning block removed.

    An opened but never closed ``<think>`` (reasoning cut off by the length limit) leaves no answer: "".
    Text without think tags is returned unchanged.
    """
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        return text[close + len(_THINK_CLOSE) :]
    return "" if _THINK_OPEN in text else text


def completion_text(completion) -> str:
    """The text of one TRL completion: a string, or the last assistant message of a conversation.

    Message content may be a string or a list of ``{"type": "text", "text": ...}`` parts. When TRL's
    response parser split the reasoning off into ``reasoning_content`` (or ``thinking``), it is put back as
    a ``<think>`` block so the format reward sees what the model generated.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)):
        return str(completion)
    messages = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
    if not messages:
        return ""
    msg = messages[-1]
    content = msg.get("content")
    if isinstance(content, list):
        content = "".join((p.get("text") or "") if isinstance(p, dict) else str(p) for p in content)
    content = "" if content is None else str(content)
    reasoning = msg.get("reasoning_content") or msg.get("thinking")
    if isinstance(reasoning, str) and reasoning and _THINK_OPEN not in content:
        return f"{_THINK_OPEN}\n{reasoning}\n{_THINK_CLOSE}\n{content}"
    return content


def extract_final_answer(text: str, prefer: str = "boxed") -> str | None:
    """The answer of a completion text: think block stripped, then last boxed / Answer: line.

    ``prefer="boxed"`` tries the boxed answer first (math_accuracy); ``prefer="answer_line"`` tries the
    DAPO ``Answer:`` line first (dapo_accuracy). A boxed answer inside an Answer: line is unwrapped.
    """
    body = strip_think(text)
    if prefer == "boxed":
        found = extract_boxed(body) or extract_answer_line(body)
    else:
        found = extract_answer_line(body) or extract_boxed(body)
    if found and any(c in found for c in _BOX_COMMANDS):
        found = extract_boxed(found) or found
    return found


def _golds(kwargs: dict, n: int) -> list:
    if "answer" not in kwargs:  # a recipe error, not a model error: fail loudly
        raise KeyError("math rewards need the gold answer in the dataset column 'answer'")
    golds = list(kwargs["answer"])
    if len(golds) != n:
        raise ValueError(f"'answer' has {len(golds)} entries for {n} completions")
    return golds


def _call_deadline(n: int, timeout: float) -> float:
    """When a reward call over ``n`` completions must be done: one clock for all its verifier calls, so the whole
    call keeps verify_batch's promise (batch_deadline from the moment it is made)."""
    return time.monotonic() + batch_deadline(n, timeout)


def _verify_completions(completions, golds, timeout: float, prefer: str) -> list[bool | None]:
    end = _call_deadline(len(completions), timeout)
    preds = [extract_final_answer(completion_text(c), prefer) for c in completions]
    results = verify_batch(list(zip(preds, golds)), timeout, deadline=end)
    # None = timeout or unparsable gold. A bad gold silently zeroes its prompt forever, so check each such
    # gold once (a cheap round trip) and warn; timeouts are expected now and then and stay quiet. The check runs on
    # the call's clock: one cut short by it is not a verdict, and the gold is checked on a later call.
    suspects = {str(g) for g, p, r in zip(golds, preds, results) if r is None and p} - _checked_golds
    for gold in suspects:
        check_end = min(end, time.monotonic() + timeout)
        unparsable = verify_batch([("0", gold)], timeout, deadline=check_end)[0] is None
        if unparsable and time.monotonic() >= check_end:
            continue
        if len(_checked_golds) > 100_000:
            _checked_golds.clear()  # bound memory over a long run
        _checked_golds.add(gold)
        if unparsable:
            logger.warning("gold answer %r does not parse; its completions score as incorrect", gold)
    return results


# ``grade`` of make_math_accuracy: "answer" grades the answer after the think block (winnow's default);
# "full_text" grades the whole completion as the GRPODropout authors' training reward does (see below).
MATH_GRADES = ("answer", "full_text")
# The authors' answer-marker phrases, tried on each of the last 4 non-empty lines, last line first, patterns in
# this order (hexuandeng/GRPODropout@4ad3b3b:verl/examples/grpo_dropout/reward.py:37-58).
_MARKERS = tuple(re.compile(p) for p in (
    r"(?i)(?:final\s+answer|answer)\s*[:=]\s*(.+)$",
    r"(?i)(?:final\s+answer|answer)\s+is\s+(.+)$",
    r"(?i)(?:therefore|thus|hence|so)[,:]?\s+(?:the\s+)?answer\s+is\s+(.+)$",
))
# The fourth phrase, "(.+?)\s+(?:is|are)\s+the\s+answers?\.?$", is quadratic in the line's length as a regex search
# (the lazy prefix restarts at every position: 40 kB of "x is y " took 23 s). Its match is the line's prefix before
# a suffix " is/are the answer(s)(.)" that ends the line, so it is found from the line's end instead (the suffix
# searched in the last _SUFFIX_WINDOW characters: whitespace runs longer than that are the only difference).
_IS_THE_ANSWER = re.compile(r"(?i)\s+(?:is|are)\s+the\s+answers?\.?$")
_SUFFIX_WINDOW = 64
_MARKER_LINES = 4


def _brace_end(text: str, open_at: int) -> int | None:
    """Index of the ``}`` closing the first ``{`` at or after ``open_at``, counting every brace (escaped ones too,
    as verl's boxed scanners do), or None when it never closes."""
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return None


def _authors_boxed(text: str) -> str | None:
    """The box content the authors' grader extracts from ``text``, "" for a box it finds but cannot unwrap, or
    None for no complete box (reward.py:62-85: verl math_dapo's last ``\\boxed{``, else verl math's fallback).

    The last ``\\boxed{`` counts only if its braces close; an earlier complete box is not used instead. The
    fallback gives the text after the last ``\\boxed `` up to a ``$``, or "" for a complete box that starts
    otherwise (``\\fbox{...}``, a ``\\boxed`` not directly followed by ``{``), which neither unwrapper accepts."""
    start = text.rfind("\\boxed{")
    end = _brace_end(text, start) if start >= 0 else None
    if end is not None:
        return text[start + len("\\boxed{") : end]
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
    return "" if start >= 0 and _brace_end(text, start) is not None else None


def _authors_marker(text: str) -> str | None:
    """The authors' answer-marker fallback: the first phrase pattern that matches, scanning the last 4 non-empty
    (stripped) lines from the last one (reward.py:37-58); the captured span, or None."""
    lines = [line.strip() for line in text.splitlines() if line.strip()][-_MARKER_LINES:]
    for line in reversed(lines):
        for pattern in _MARKERS:
            m = pattern.search(line)
            if m and m.group(1).strip():
                return m.group(1).strip()
        tail = line[-_SUFFIX_WINDOW:]
        m = _IS_THE_ANSWER.search(tail)
        if m:
            prefix = line[: len(line) - len(tail) + m.start()].strip()
            if prefix:
                return prefix
    return None


def full_text_candidates(text: str) -> list[str]:
    """The answers the GRPODropout authors' training reward accepts for ``text`` (the whole decoded response,
    think block included, finished or not); the completion is correct if any one equals the gold answer.

    hexuandeng/GRPODropout@4ad3b3b:verl/examples/grpo_dropout/reward.py ``_grade_with_ground_truth``:
    (1) verl math_dapo's Minerva check (reward.py:147-149): the last ``Answer: X`` in the last 300 characters,
    taken as written (no Markdown stripping); (2) the extracted answer (reward.py:140, 158-159): the last complete
    box anywhere in the text, else, only when there is no box at all, the answer-marker phrases of the last 4
    lines (reward.py:92-98). An empty or un-unwrappable box blocks the marker fallback and gives no answer.
    Equivalence is then Math-Verify's (winnow's verifier), not verl's string normalisation."""
    if not text:
        return []  # reward.py:89-90: empty text, no answer
    found = []
    line = _ANSWER_LINE.findall(text[-_ANSWER_WINDOW:])
    if line and line[-1].strip():
        found.append(line[-1].strip())
    boxed = _authors_boxed(text)
    answer = _authors_marker(text) if boxed is None else boxed.strip()
    if answer:
        found.append(answer)
    return found


def _verify_full_text(completions, golds, timeout: float) -> list[bool]:
    """Correct when either candidate of :func:`full_text_candidates` verifies: one verify_batch call over every item's
    first candidate (None = nothing to verify, as math_accuracy's call), then one over the items whose second,
    different candidate is still needed -- not after a first verification that hit the time limit (None), so an item
    spends at most one limit: a timed-out item scores as wrong, as in math_accuracy."""
    end = _call_deadline(len(completions), timeout)
    cands = [list(dict.fromkeys(full_text_candidates(completion_text(c)))) for c in completions]
    first = verify_batch([(ps[0] if ps else None, g) for ps, g in zip(cands, golds)], timeout, deadline=end)
    correct = [bool(r) for r in first]
    again = [i for i, ps in enumerate(cands) if len(ps) > 1 and first[i] is False]
    if again:
        for i, r in zip(again, verify_batch([(cands[i][1], golds[i]) for i in again], timeout, deadline=end)):
            correct[i] = bool(r)
    return correct


def make_math_accuracy(timeout: float = DEFAULT_TIMEOUT, grade: str = "answer"):
    """A ``math_accuracy`` reward with a per-completion verification limit of ``timeout`` seconds.

    ``grade="answer"`` (the default) grades the last boxed answer (else the Answer: line) after ``</think>``; an
    unfinished think block has no answer. ``grade="full_text"`` grades the whole completion as the GRPODropout
    authors' training reward does (:func:`full_text_candidates`): a box inside the think block, finished or not,
    counts. Registered as ``math_accuracy_full_text``."""
    if grade not in MATH_GRADES:
        raise ValueError(f"math_accuracy: grade must be one of {MATH_GRADES}, got {grade!r}; use 'answer' (winnow's "
                         "default) or 'full_text' (the GRPODropout authors' grading)")

    def math_accuracy(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        """1.0 if the last boxed answer (else the Answer: line) after ``</think>`` equals the gold answer
        per Math-Verify (gold parsed first), else 0.0 -- also for no answer, garbage and timeouts."""
        completions = list(completions or [])
        results = _verify_completions(completions, _golds(kwargs, len(completions)), timeout, "boxed")
        return [1.0 if r else 0.0 for r in results]

    def math_accuracy_full_text(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        """1.0 if an answer the GRPODropout authors' grader takes from the WHOLE completion (think block
        included, finished or not: the Answer: line in the last 300 characters, the last box, else an answer
        phrase of the last 4 lines) equals the gold answer per Math-Verify, else 0.0."""
        completions = list(completions or [])
        return [1.0 if r else 0.0 for r in _verify_full_text(completions, _golds(kwargs, len(completions)), timeout)]

    return math_accuracy if grade == "answer" else math_accuracy_full_text


def make_dapo_accuracy(timeout: float = DEFAULT_TIMEOUT):
    """A ``dapo_accuracy`` reward (DAPO's +1 / -1) with a verification limit of ``timeout`` seconds."""

    def dapo_accuracy(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        """DAPO's rule: +1.0 if correct, -1.0 otherwise (no answer, wrong, garbage, timeout). The answer is
        the ``Answer:`` line in the last 300 characters after ``</think>``, else the last boxed answer;
        equivalence by Math-Verify rather than DAPO's Minerva normalisation + exact match."""
        completions = list(completions or [])
        results = _verify_completions(completions, _golds(kwargs, len(completions)), timeout, "answer_line")
        return [1.0 if r else -1.0 for r in results]

    return dapo_accuracy


def make_think_format(open_tag_in_prompt: bool = False):
    """A ``think_format`` reward; ``open_tag_in_prompt=True`` for chat templates whose generation prompt
    already ends with ``<think>`` (the completion then starts inside the reasoning)."""

    def think_format(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        """1.0 iff the completion, leading/trailing whitespace ignored, is exactly
        ``<think>R</think>A`` where R (the reasoning) is not blank, neither R nor A contains another
        ``<think>`` or ``</think>`` tag, and A (the answer) holds a complete ``\\boxed{...}`` (or
        ``\\fbox{}``) or an ``Answer: ...`` line in its last 300 characters. Else 0.0."""
        scores = []
        for c in completions or []:
            text = completion_text(c).strip()
            if open_tag_in_prompt and not text.startswith(_THINK_OPEN):
                text = _THINK_OPEN + text
            ok = False
            if text.startswith(_THINK_OPEN) and text.count(_THINK_OPEN) == 1 and text.count(_THINK_CLOSE) == 1:
                reasoning, _, answer = text[len(_THINK_OPEN) :].partition(_THINK_CLOSE)
                ok = bool(reasoning.strip()) and bool(extract_boxed(answer) or extract_answer_line(answer))
            scores.append(1.0 if ok else 0.0)
        return scores

    return think_format


@register_reward("boxed_format")
def boxed_format(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
    """1.0 iff the answer part (after a closed ``</think>``, if any) has a complete, non-empty last
    ``\\boxed{...}`` -- the format half of an accuracy + format reward for models that must first learn
    to box their answer (the CPU demo). Else 0.0."""
    return [1.0 if extract_boxed(strip_think(completion_text(c))) else 0.0 for c in completions or []]


math_accuracy = register_reward("math_accuracy", factory=make_math_accuracy)(make_math_accuracy())
# The GRPODropout authors' training reward (grade="full_text"): the recipes of that family name it in reward_funcs.
math_accuracy_full_text = register_reward(
    "math_accuracy_full_text", factory=functools.partial(make_math_accuracy, grade="full_text")
)(make_math_accuracy(grade="full_text"))
think_format = register_reward("think_format", factory=make_think_format)(make_think_format())
dapo_accuracy = register_reward("dapo_accuracy", factory=make_dapo_accuracy)(make_dapo_accuracy())
