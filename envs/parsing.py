"""Parse one model turn ``<think>...</think><answer>Up || Left</answer>`` into action names.

Grammar (RAGEN's answer format, reference notes §3.3): the reasoning is the text between the first
``<think>`` and the first ``</think>`` after it; after optional whitespace an ``<answer>`` must follow, and the
answer is the text up to the first ``</answer>``. The answer is split on the action separator (``||``), each
part stripped, empty parts dropped, and the list truncated to ``max_actions`` (RAGEN truncates silently; the
format penalty is for turns with *no* usable action or an unknown one, see envs/episode.py). With
``require_think=False`` an answer without a think block is accepted too.

Written with ``str.find`` instead of RAGEN's DOTALL regex on purpose: the regex backtracks over every
``<think>`` occurrence (quadratic on hostile output such as a megabyte of repeated tags); this is linear in
the text and never raises. Chat special tokens (``<|im_start|>``, ``<|im_end|>``, ...) are removed from both
parts, as the reference does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
ACTION_SEPARATOR = "||"
_SPECIAL_TOKEN = re.compile(r"<\|[^|<>\s]{1,40}\|>")  # <|im_start|>, <|im_end|>, <|endoftext|>


@dataclass(frozen=True)
class ParsedTurn:
    """One turn's answer: whether the format matched, the reasoning text and the action names (≤ max)."""

    format_ok: bool
    thinking: str
    answer: str
    actions: tuple[str, ...]


_NO_ANSWER = ParsedTurn(False, "", "", ())


def _strip_special(text: str) -> str:
    return _SPECIAL_TOKEN.sub("", text)


def parse_turn(
    text: str, max_actions: int, require_think: bool = True, separator: str = ACTION_SEPARATOR
) -> ParsedTurn:
    """Parse one model response (any string; never raises). See the module docstring for the grammar."""
    if not isinstance(text, str) or max_actions < 1:
        return _NO_ANSWER
    thinking = ""
    cursor = 0
    think_start = text.find(THINK_OPEN)
    if think_start >= 0:
        think_end = text.find(THINK_CLOSE, think_start + len(THINK_OPEN))
        if think_end < 0:
            return _NO_ANSWER  # reasoning never closed: no answer can follow it
        thinking = text[think_start + len(THINK_OPEN) : think_end]
        cursor = think_end + len(THINK_CLOSE)
    elif require_think:
        return _NO_ANSWER
    answer_start = text.find(ANSWER_OPEN, cursor)
    if answer_start < 0 or (think_start >= 0 and text[cursor:answer_start].strip()):
        return _NO_ANSWER  # no answer, or something other than whitespace between </think> and <answer>
    answer_end = text.find(ANSWER_CLOSE, answer_start + len(ANSWER_OPEN))
    if answer_end < 0:
        return _NO_ANSWER
    answer = _strip_special(text[answer_start + len(ANSWER_OPEN) : answer_end])
    parts = (part.strip() for part in answer.split(separator))
    actions = tuple(part for part in parts if part)[:max_actions]
    return ParsedTurn(True, _strip_special(thinking).strip(), answer.strip(), actions)
