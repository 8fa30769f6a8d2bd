"""The GRPO advantage as a pure function: TRL's numbers, invariants on random groups, and small hand cases."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.trainer.utils import nanstd as trl_nanstd

from trainer.algorithms.grpo import (
    group_index,
    group_view,
    grpo_advantages,
    nanstd,
    normalize_then_sum_advantages,
    total_reward,
)

rewards = st.floats(min_value=-100, max_value=100, allow_nan=False, width=32)


@st.composite
def reward_groups(draw, max_groups=6, max_G=8, nan=False):
    P = draw(st.integers(1, max_groups))
    G = draw(st.integers(2, max_G))
    elems = st.one_of(rewards, st.just(float("nan"))) if nan else rewards
    values = draw(st.lists(elems, min_size=P * G, max_size=P * G))
    return torch.tensor(values, dtype=torch.float32), G


def trl_reference(R: torch.Tensor, G: int, scale: str) -> torch.Tensor:
    """TRL 1.16's sum_then_normalize advantage, transcribed from GRPOTrainer._generate_and_score_completions."""
    mean = torch.nanmean(R.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale == "batch":
        std = trl_nanstd(R).expand_as(R)
    else:
        std = trl_nanstd(R.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    A = R - mean
    if scale != "none":
        A = A / (std + 1e-4)
    return torch.nan_to_num(A, nan=0.0)


@settings(max_examples=300, deadline=None)
@given(reward_groups(nan=True), st.sampled_from(["group", "batch", "none"]))
def test_grpo_equals_trl_bit_for_bit(data, scale):
    R, G = data
    A, _ = grpo_advantages(R, G, scale_rewards=scale)
    assert torch.equal(A, trl_reference(R, G, scale))


@settings(max_examples=300, deadline=None)
@given(reward_groups(), st.sampled_from(["unbiased", "population"]))
def test_group_invariants(data, std):
    """Per group with a real spread: advantages sum to 0, are shift invariant, and with population std have
    unit RMS. Groups whose spread is at float32 rounding level (near-constant rewards) are left out: there
    (R - mean) is rounding noise that 1 / (sigma + eps) amplifies, in TRL as here -- see the dyadic test below."""
    R, G = data
    A, sigma = grpo_advantages(R, G, std=std, eps=1e-6)
    A_shift, _ = grpo_advantages(R + 7.0, G, std=std, eps=1e-6)
    Ag, Ag_shift = group_view(A, G), group_view(A_shift, G)
    scale = group_view(R, G).abs().amax(dim=1).clamp(min=8.0)  # 8: the shifted rewards' magnitude too
    spread = group_view(sigma, G)[:, 0] / scale
    real = spread > 1e-3
    assert torch.all(Ag[real].sum(dim=1).abs() <= 1e-3 * G)
    assert torch.allclose(Ag[real], Ag_shift[real], atol=1e-2)
    if std == "population":
        rms = Ag[real].pow(2).mean(dim=1).sqrt()
        assert torch.allclose(rms, torch.ones_like(rms), atol=1e-3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-64, 64), min_size=1, max_size=6), st.integers(2, 8))
def test_constant_groups_get_zero_advantage(levels, G):
    """Verifiable rewards (dyadic values such as 0/1 or k/8) in a constant group give exactly A = 0.

    (For arbitrary floats the float32 group mean can be off by an ulp, and ulp / (0 + 1e-4) is a small
    spurious advantage -- TRL's behaviour too.)"""
    R = torch.tensor(levels, dtype=torch.float32).div(8).repeat_interleave(G)
    A, sigma = grpo_advantages(R, G)
    assert torch.equal(A, torch.zeros_like(A)) and torch.equal(sigma, torch.zeros_like(sigma))


def test_hand_computed_group():
    # Group of 4 with rewards [1, 0, 0, 1]: mean 0.5; unbiased var = (4 * 0.25) / 3 = 1/3, std = 0.57735;
    # A = +-0.5 / (0.57735 + 1e-4) = +-0.86588. Population std = 0.5 -> A = +-0.5 / 0.5001 = +-0.99980.
    R = torch.tensor([1.0, 0.0, 0.0, 1.0])
    A, _ = grpo_advantages(R, 4)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert torch.allclose(A, torch.tensor([expected, -expected, -expected, expected]), atol=1e-6)
    A_pop, _ = grpo_advantages(R, 4, std="population")
    assert torch.allclose(A_pop, torch.tensor([1, -1, -1, 1]) * 0.5 / 0.5001, atol=1e-6)
    A_none, _ = grpo_advantages(R, 4, scale_rewards="none")
    assert torch.equal(A_none, torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_unscorable_rows_are_left_out():
    # NaN row excluded: the group is [1, 0, -] -> mean 0.5, unbiased std = 0.7071; the NaN row gets 0.
    R = torch.tensor([1.0, 0.0, float("nan"), 0.5])
    A, _ = grpo_advantages(R, 4)
    mean = (1 + 0 + 0.5) / 3
    std = math.sqrt(((1 - mean) ** 2 + mean**2 + (0.5 - mean) ** 2) / 2)
    assert A[2] == 0
    assert torch.allclose(A[[0, 1, 3]], (torch.tensor([1.0, 0.0, 0.5]) - mean) / (std + 1e-4), atol=1e-6)


def test_nanstd_matches_trl_and_population():
    x = torch.tensor([[1.0, 2.0, float("nan"), 4.0], [3.0, float("nan"), float("nan"), float("nan")]])
    assert torch.allclose(nanstd(x, dim=1), trl_nanstd(x, dim=1), equal_nan=True)
    assert torch.isnan(nanstd(x, dim=1)[1])  # one value: unbiased std undefined, like TRL
    assert nanstd(x, dim=1, std="population")[1] == 0
    v = torch.tensor([1.0, 2.0, 4.0])
    assert torch.isclose(nanstd(v, std="population"), v.std(unbiased=False))


def test_normalize_then_sum_matches_trl_formula():
    g = torch.Generator().manual_seed(0)
    R_k = torch.rand(12, 3, generator=g)
    R_k[5, 1] = float("nan")
    w = torch.tensor([1.0, 0.5, 2.0])
    A, _ = normalize_then_sum_advantages(R_k, w, G=4)
    grouped = R_k.view(-1, 4, 3)
    z = ((grouped - torch.nanmean(grouped, 1, keepdim=True)) / (trl_nanstd(grouped, dim=1, keepdim=True) + 1e-4)).view(
        -1, 3
    )
    S = (z * w).nansum(1)
    expected = (S - S.mean()) / (trl_nanstd(S) + 1e-4)
    assert torch.equal(A, expected)


def test_group_helpers():
    assert group_index(6, 3).tolist() == [0, 0, 0, 1, 1, 1]
    assert group_view(torch.arange(6), 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    R_k = torch.tensor([[1.0, float("nan")], [float("nan"), float("nan")]])
    R = total_reward(R_k, torch.tensor([2.0, 1.0]))
    assert R[0] == 2 and torch.isnan(R[1])
    try:
        group_view(torch.arange(5), 2)
    except ValueError as e:
        assert "groups of G=2" in str(e)
    else:
        raise AssertionError("a batch that does not split into groups must be rejected")
