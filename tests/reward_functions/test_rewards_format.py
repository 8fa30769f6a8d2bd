"""RAGEN's format penalty: 0 for <think>R</think><answer>A</answer>, the penalty for anything else."""

import pytest

from rewards import get_reward


@pytest.mark.parametrize(
    "text, ok",
    [
        ("<think>add them</think><answer>1 + 2</answer>", True),
        ("  <think>a\nb</think>\n\n<answer> 3 </answer>\n", True),
        ("<think>x</think><answer>  </answer>", False),  # blank answer
        ("<answer>3</answer>", False),  # no think block
        ("<think>x</think>3", False),  # no answer block
        ("<think>x</think><answer>3</answer> trailing words", False),
        ("<think>x</think><answer>3</answer><answer>4</answer>", False),
        ("<think>x<think>y</think><answer>3</answer>", False),
        ("", False),
        ("\x00" * 10_000, False),
    ],
)
def test_format_penalty(text, ok):
    reward = get_reward("answer_format_penalty")
    assert reward(completions=[text]) == [0.0 if ok else -0.1]
    assert reward(completions=[[{"role": "assistant", "content": text}]]) == [0.0 if ok else -0.1]


def test_configurable_penalty_and_prefilled_think():
    reward = get_reward("answer_format_penalty", penalty=-0.5, think_prefilled=True)
    assert reward(completions=["reasoning</think><answer>7</answer>", "no tags"]) == [0.0, -0.5]
