"""Math answer extraction and verifiable math rewards: ``math_accuracy``, ``think_format``, ``dapo_accuracy``.

All rewards follow TRL's contract ``f(prompts, completions, completion_ids=None, **columns)``; the gold
answer is the dataset column ``answer`` (``kwargs["answer"]``, aligned with ``completions``). Completions
may be strings or conversational message lists. Equivalence goes through :mod:`rewards.verifier` (Math-Verify
in a worker process with a hard per-item time limit), so garbage or adversarial output is scored, never
raised on, and never hangs the trainer. Extraction is linear-time string scanning (``rfind`` and one
brace-matching pass; the only regex runs on the last 300 characters), so a 1 MB completion costs ~1 ms.
"""

from __future__ import annotations

import logging
import re

from .registry import register_reward
from .verifier import DEFAULT_TIMEOUT, verify_batch

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


def _verify_completions(completions, golds, timeout: float, prefer: str) -> list[bool | None]:
    preds = [extract_final_answer(completion_text(c), prefer) for c in completions]
    results = verify_batch(list(zip(preds, golds)), timeout)
    # None = timeout or unparsable gold. A bad gold silently zeroes its prompt forever, so check each such
    # gold once (a cheap round trip) and warn; timeouts are expected now and then and stay quiet.
    suspects = {str(g) for g, p, r in zip(golds, preds, results) if r is None and p} - _checked_golds
    for gold in suspects:
        if len(_checked_golds) > 100_000:
            _checked_golds.clear()  # bound memory over a long run
        _checked_golds.add(gold)
        if verify_batch([("0", gold)], timeout)[0] is None:
            logger.warning("gold answer %r does not parse; its completions score as incorrect", gold)
    return results


def make_math_accuracy(timeout: float = DEFAULT_TIMEOUT):
    """A ``math_accuracy`` reward with a per-completion verification limit of ``timeout`` seconds."""

    def math_accuracy(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        """1.0 if the last boxed answer (else the Answer: line) after ``</think>`` equals the gold answer
        per Math-Verify (gold parsed first), else 0.0 -- also for no answer, garbage and timeouts."""
        completions = list(completions or [])
        results = _verify_completions(completions, _golds(kwargs, len(completions)), timeout, "boxed")
        return [1.0 if r else 0.0 for r in results]

    return math_accuracy


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
think_format = register_reward("think_format", factory=make_think_format)(make_think_format())
dapo_accuracy = register_reward("dapo_accuracy", factory=make_dapo_accuracy)(make_dapo_accuracy())
