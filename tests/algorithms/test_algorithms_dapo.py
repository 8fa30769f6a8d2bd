"""DAPO's dynamic-sampling group rule and overlong reward shaping (Yu et al. 2025 §3.2, §3.4)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rewards
from rewards.overlong import overlong_penalty_value as overlong_penalty
from trainer.algorithms.dapo import mixed_groups


def test_mixed_groups_is_zero_lt_correct_lt_G_for_accuracy():
    acc = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1], dtype=torch.float)
    assert mixed_groups(acc, 4).tolist() == [False, False, True, True]


def test_mixed_groups_on_total_reward_and_nan():
    nan = float("nan")
    R = torch.tensor([0.5, 0.5, 0.5, nan, 0.2, nan, 0.9, 0.9, nan, nan, nan, 1.0])
    # group 0: constant over its finite values; group 1: varies (NaN ignored); group 2: one finite value only
    assert mixed_groups(R, 4).tolist() == [False, True, False]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=8, max_size=8), st.integers(2, 4))
def test_mixed_groups_matches_the_counting_rule(bits, G):
    bits = bits[: (len(bits) // G) * G]
    acc = torch.tensor(bits, dtype=torch.float)
    correct = acc.view(-1, G).sum(1)
    assert mixed_groups(acc, G).tolist() == ((correct > 0) & (correct < G)).tolist()
    # +-1 rewards (DAPO's) decide the same groups as 0/1
    assert mixed_groups(acc * 2 - 1, G).tolist() == mixed_groups(acc, G).tolist()


@pytest.mark.parametrize(
    "length, expected",
    [
        (0, 0.0),
        (12, 0.0),  # L_max - L_cache = 12: last length without penalty
        (13, -1 / 8),  # inside the buffer: linear
        (16, -0.5),
        (20, -1.0),  # at the cap L_max
        (25, -1.0),  # beyond L_max (cannot be generated, but stays -1)
    ],
)
def test_overlong_penalty_three_regions(length, expected):
    assert overlong_penalty(length, max_length=20, buffer_length=8) == pytest.approx(expected)


def test_overlong_penalty_factor_and_dapo_recipe_numbers():
    # DAPO's 32B recipe: L_max 20480, L_cache 4096 -> penalty starts after 16384 tokens
    assert overlong_penalty(16384, 20480, 4096) == 0.0
    assert overlong_penalty(18432, 20480, 4096) == pytest.approx(-0.5)
    assert overlong_penalty(18432, 20480, 4096, penalty_factor=0.5) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(10, 20, 0)


def test_overlong_penalty_reward_function_uses_token_counts():
    f = rewards.get_reward(
        "overlong_penalty", max_completion_length=20, overlong_buffer_len=8, overlong_penalty_factor=1.0
    )
    assert f(prompts=["p"] * 3, completions=["a"] * 3,
             completion_ids=[[1] * 5, [1] * 16, [1] * 20]) == [0.0, -0.5, -1.0]
    unconfigured = rewards.get_reward("overlong_penalty")
    with pytest.raises(ValueError, match="max_completion_length"):
        unconfigured(prompts=["p"], completions=["a"], completion_ids=[[1]])


def test_overlong_penalty_is_monotone_and_bounded():
    values = [overlong_penalty(n, 100, 30, 0.7) for n in range(0, 120)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert min(values) == pytest.approx(-0.7) and max(values) == 0.0
    assert not any(math.isnan(v) for v in values)
