"""Countdown scored as RAGEN scores it (issue 20 item 7): the reply is parsed by RAGEN's regex (with the think
prefill in front), a reply without an action earns only the format penalty -0.1 (not the equation's 1.0 - 0.1),
and one action is scored 0 / 0.1 / 1. The oracle below is upstream's code (mll-lab-nu/RAGEN@20daedc:
ctx_manager.py:196-221 ``_parse_response``, es_manager.py:224-237 the penalty, env/countdown/env.py:9-21, 69-79 the
score; config/_4_countdown.yaml: one action per turn), run on hand-written replies."""

from __future__ import annotations

import json
import re

import pytest

import rewards

SPECIAL = ["<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>"]


def upstream_score(reply: str, nums: list[int], target: int) -> float:
    response = "<think>" + reply  # get_env_inputs adds the prefill back
    match = re.search(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", response, re.DOTALL)
    actions = []
    if match:
        content = match.group(2)
        for token in SPECIAL:
            content = content.replace(token, "").strip()
        actions = [a.strip() for a in content.split("||") if a.strip()][:1]
    if not actions:
        return -0.1
    equation = actions[0]
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(nums):
        return 0.0
    try:
        correct = abs(eval(equation, {"__builtins__": None}, {}) - target) < 1e-5
    except Exception:
        correct = False
    return 1.0 if correct else 0.1


REPLIES = [
    "2 + 5 - 3 = 4.</think><answer>2 + 5 - 3</answer>",  # correct: 1.0
    "The answer is <answer>2 + 5 - 3</answer>",  # no </think>: no action, -0.1 (was 0.9 here)
    "x</think> so <answer>2 + 5 - 3</answer>",  # text between the blocks: no action, -0.1
    "x</think><answer>2 + 5 + 3</answer>",  # numbers right, value wrong: 0.1
    "x</think><answer>2 + 5</answer>",  # numbers wrong: 0
    "x</think><answer>  </answer>",  # empty answer: no action, -0.1
    "x</think>\n<answer>2 + 5 - 3 || 5</answer>",  # one action per turn: the first is scored, 1.0
    "x</think><answer><|im_end|>2 + 5 - 3</answer>",  # special tokens removed: 1.0
    "",
]


@pytest.mark.parametrize("reply", REPLIES)
def test_ragen_countdown_matches_upstream(reply):
    gold = json.dumps({"target": 4, "numbers": [3, 5, 2]})
    ours = rewards.get_reward("ragen_countdown")(completions=["<think>" + reply], answer=[gold])
    assert ours == [pytest.approx(upstream_score(reply, [3, 5, 2], 4))]


def test_malformed_reply_is_penalty_only_not_the_equation_score():
    gold = json.dumps({"target": 4, "numbers": [3, 5, 2]})
    reply = "The answer is <answer>2 + 5 - 3</answer>"
    old = rewards.get_reward("countdown")(completions=[reply], answer=[gold])[0] + \
        rewards.get_reward("answer_format_penalty")(completions=[reply])[0]
    assert old == pytest.approx(0.9)  # the previous recipes' pair (no prefill)
    for text in (reply, "<think>" + reply):  # without or with the prefill: no action
        assert rewards.get_reward("ragen_countdown")(completions=[text], answer=[gold]) == [pytest.approx(-0.1)]
