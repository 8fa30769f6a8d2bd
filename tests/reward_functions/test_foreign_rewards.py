"""Other trainers' reward names in a recipe (rewards/foreign.py), the ones that need no verifier worker: TRL's
think_format_reward and get_soft_overlong_punishment (TRL's own objects, trl grpo's values), open-r1's ``format``
(its pattern, huggingface/open-r1@bd581c7e73bbd0b63b6605fc1ed4b51d231fa597:src/open_r1/rewards.py:53-58, by a linear
scan), and open-r1's names winnow does not implement. The accuracy rewards: tests/verifier/test_foreign_accuracy.py."""

from __future__ import annotations

import random
import re

import pytest

from rewards import foreign
from trainer.config.errors import RecipeError
from trainer.config.recipe_checks import resolve_reward


def _chat(texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


def test_trl_format_and_overlong_are_trls_objects_with_trl_grpos_values():
    from trl.rewards import think_format_reward

    fmt = resolve_reward("think_format_reward", {"max_completion_length": 64})
    assert fmt.__wrapped__ is think_format_reward and fmt.__name__ == "think_format_reward"
    texts = ["<think>\nreasoning\n</think>\nanswer", "<think>\nno end", "answer <think>a</think>"]
    assert fmt(completions=[[{"role": "assistant", "content": t}] for t in texts]) == [1.0, 0.0, 0.0]
    assert fmt(completions=texts) == [1.0, 0.0, 0.0]  # plain text too (TRL's own fails on a string)
    overlong = resolve_reward("get_soft_overlong_punishment", {"max_completion_length": 64})
    assert type(overlong).__module__ == "trl.rewards.other_rewards"
    # trl grpo's max_completion_len=1280, soft_punish_cache=256 -- not the recipe's max_completion_length
    ids = [[7] * 1024, [7] * 1152, [7] * 1280, [7] * 1281]
    assert overlong(completion_ids=ids) == [0.0, -0.5, -1.0, -1.0]


def _open_r1_format_regex(text: str) -> float:  # open-r1 bd581c7, src/open_r1/rewards.py:55-58 (the oracle)
    return 1.0 if re.match(r"^<think>.*?</think>\s*<answer>.*?</answer>$", text, re.DOTALL | re.MULTILINE) else 0.0


def test_open_r1_format_is_its_pattern_in_linear_time():
    fmt = resolve_reward("format", {})
    cases = {
        "<think>\nx\n</think>\n<answer>\ny\n</answer>": 1.0,
        "<think>x</think><answer>y</answer>": 1.0,
        "<think>x</think> <answer>y</answer>\ntrailing": 1.0,  # MULTILINE: $ before a newline
        "<think>x</think> <answer>y</answer> trailing": 0.0,
        " <think>x</think><answer>y</answer>": 0.0,
        "<think>x</think>text<answer>y</answer>": 0.0,
        "<think>a</think>b</think>\n<answer>y</answer>": 1.0,  # the lazy .*? runs on to a later </think>
        "<think>x</think><answer>y": 0.0,
    }
    assert fmt(completions=_chat(list(cases))) == list(cases.values())
    assert [_open_r1_format_regex(t) for t in cases] == list(cases.values())
    rng = random.Random(0)  # and the regex itself on random tag soup
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "\n", " ", "x", "\t"]
    for _ in range(3000):
        text = ("<think>" if rng.random() < 0.5 else "") + "".join(rng.choices(pieces, k=rng.randint(0, 9)))
        assert foreign.open_r1_format_matches(text) == bool(_open_r1_format_regex(text)), repr(text)


def test_other_open_r1_names_are_refused_with_the_names_that_exist():
    with pytest.raises(RecipeError) as e:
        resolve_reward("cosine", {})
    line = str(e.value)
    assert "\n" not in line and "open-r1" in line and "accuracy and format" in line and "math_accuracy" in line
