"""RAGEN's structured-response format penalty for single-turn tasks (countdown, math).

RAGEN's environment manager adds ``format_penalty`` (-0.1) to a turn whose response does not parse as
``<think>...</think><answer>...</answer>`` (ragen.md §3.3-3.4). The penalty is part of the episode reward,
so it also enters the reward variance that the SNR filter scores; recipes that reproduce RAGEN-2 add this
reward next to the task reward (weights 1 and 1).
"""

from __future__ import annotations

import re

from .math_rewards import completion_text
from .registry import register_reward

# RAGEN's DOTALL pattern: think block, whitespace, answer block; we require the whole response to be that.
_STRUCTURED = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_MAX_CHARS = 200_000  # bounds the counts and the (linear, once gated by the counts) regex on pathological text


def make_answer_format_penalty(penalty: float = -0.1, think_prefilled: bool = False):
    """A reward of 0.0 for a well-formed ``<think>R</think><answer>A</answer>`` response (A not blank,
    one block of each) and ``penalty`` otherwise. ``think_prefilled=True`` for templates whose generation
    prompt already ends with ``<think>`` (RAGEN's own), so the completion starts inside the block."""

    def answer_format_penalty(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        """``penalty`` unless the response is exactly one think block then one non-empty answer block."""
        scores = []
        for c in completions or []:
            text = completion_text(c)[:_MAX_CHARS]
            if think_prefilled and not text.lstrip().startswith("<think>"):
                text = "<think>" + text
            # The tag counts are checked BEFORE the regex (same result, the conjunction is only reordered): on
            # a degenerate repetition loop ("<think>a</think><answer>b</answer>" * 5000 + "x") the lazy groups
            # make fullmatch backtrack over every "</think>" x every "</answer>", quadratic -- 5 s for one
            # 194k-character completion (tests/verifier/test_reward_fuzz.py). With one <think> and one <answer> the
            # regex has a single viable split and runs in linear time.
            ok = text.count("<think>") == 1 and text.count("<answer>") == 1
            if ok:
                match = _STRUCTURED.fullmatch(text)
                ok = match is not None and match.group(2).strip() != ""
            scores.append(0.0 if ok else float(penalty))
        return scores

    return answer_format_penalty


answer_format_penalty = register_reward("answer_format_penalty", factory=make_answer_format_penalty)(
    make_answer_format_penalty()
)
