"""Clip-Cov and KL-Cov (Cui et al. 2025 §4.2) as pure functions: hand-made tensors where every selected token is
known in advance, property tests of the selection rules, and gradient checks (which tokens get gradient)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.algorithms.losses import (
    clip_cov_selection,
    clip_cov_token_loss,
    kl_cov_selection,
    kl_cov_token_loss,
    ppo_clipped,
    selection_count,
    token_covariance,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_token_covariance_hand_computed():
    # two rollouts, A = +1 / -1; log-probs chosen so the means are easy: valid tokens (mask) only
    A = torch.tensor([1.0, -1.0])
    logp = torch.tensor([[-1.0, -3.0, 9.0], [-2.0, -2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    cov = token_covariance(A, logp, mask)
    # mean A over 4 valid tokens = 0; mean logp = -2 -> cov = A * (logp + 2)
    expected = torch.tensor([[1.0, -1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.equal(cov, expected)
    # padding value (9.0) must not enter the means
    logp[:, 2] = -100.0
    assert torch.equal(token_covariance(A, logp, mask), expected)


def test_selection_count_is_floor_with_a_minimum_of_one():
    assert selection_count(2e-4, 10_000) == 2
    assert selection_count(2e-4, 100) == 1  # floor(0.02) -> at least one token
    assert selection_count(0.5, 7) == 3
    assert selection_count(0.5, 0) == 0


def test_ppo_clipped_marks_tokens_whose_clip_is_active():
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.0]])
    A = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0]])
    # A>0 & r>1+eps: clipped; A<0 & r>1+eps: not (min picks r); A>0 & r<1-eps: not; A<0 & r<1-eps: clipped
    assert ppo_clipped(ratio, A, 0.2, 0.2).tolist() == [[True, False, False, True, False]]


def test_clip_cov_candidates_are_the_band_minus_ppo_clipped_and_padding():
    cov = torch.tensor([[0.5, 2.0, 3.0, 4.9, 5.0], [2.5, 2.5, 6.0, 1.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    clipped = torch.zeros_like(mask, dtype=torch.bool)
    clipped[1, 0] = True
    # candidates: (0,1) (0,2) (0,3) (1,1); excluded: 0.5 and 5.0 and 6.0 and 1.0 (band is open), (1,0) PPO-clipped,
    # (1,4) padding. Ratio 1.0 -> all 9 valid tokens wanted, so every candidate is chosen.
    selected = clip_cov_selection(cov, mask, clipped, 1.0, 1.0, 5.0, gen())
    assert selected.nonzero().tolist() == [[0, 1], [0, 2], [0, 3], [1, 1]]
    # ratio 0.25 of 9 valid -> 2 tokens, all from the candidates
    selected = clip_cov_selection(cov, mask, clipped, 0.25, 1.0, 5.0, gen())
    assert int(selected.sum()) == 2
    assert set(map(tuple, selected.nonzero().tolist())) <= {(0, 1), (0, 2), (0, 3), (1, 1)}


def test_clip_cov_choice_depends_on_values_and_seed_not_layout():
    torch.manual_seed(0)
    cov = torch.rand(6, 50, dtype=torch.float64) * 6
    mask = torch.ones(6, 50)
    clipped = torch.zeros(6, 50, dtype=torch.bool)
    a = clip_cov_selection(cov, mask, clipped, 0.05, 1.0, 5.0, gen(3))
    perm = torch.randperm(6)
    b = clip_cov_selection(cov[perm], mask[perm], clipped[perm], 0.05, 1.0, 5.0, gen(3))
    assert torch.equal(a[perm], b)  # same tokens chosen after the rows were shuffled
    c = clip_cov_selection(cov, mask, clipped, 0.05, 1.0, 5.0, gen(4))
    assert not torch.equal(a, c)  # a different seed chooses differently


def test_kl_cov_selects_the_top_covariance_tokens():
    cov = torch.tensor([[0.1, 9.0, -3.0], [4.0, 8.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # 100.0 sits on padding: never selected
    selected = kl_cov_selection(cov, mask, 0.4)  # floor(0.4 * 5) = 2
    assert selected.nonzero().tolist() == [[0, 1], [1, 1]]


def test_clip_cov_loss_cuts_gradient_of_selected_tokens_only_and_keeps_them_in_the_mean():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.1, -0.5]])
    A = torch.tensor([1.0])
    selected = torch.tensor([[False, True, False]])
    loss = clip_cov_token_loss(logp, old, A, selected, 0.2, 0.2)
    mask = torch.ones(1, 3)
    (loss * mask).sum().div(mask.sum()).backward()  # token mean over all 3 valid tokens
    g = logp.grad[0]
    assert g[1] == 0  # selected: no gradient
    # unselected, unclipped token: d(-A r)/dlogp / 3 = -r/3
    assert g[0].item() == pytest.approx(-1.0 / 3)
    assert g[2].item() == pytest.approx(-1.0 / 3)
    assert loss[0, 1].item() == 0.0


def test_clip_cov_loss_equals_ppo_when_nothing_selected():
    torch.manual_seed(1)
    logp, old = torch.randn(3, 5), torch.randn(3, 5)
    A = torch.randn(3)
    loss = clip_cov_token_loss(logp, old, A, torch.zeros(3, 5, dtype=torch.bool), 0.2, 0.28)
    r = torch.exp(logp - old)
    ppo = -torch.min(r * A[:, None], torch.clamp(r, 0.8, 1.28) * A[:, None])
    assert torch.allclose(loss, ppo)


def test_kl_cov_has_no_clipping_and_penalises_selected_tokens():
    # token 0: ratio e^1 ~ 2.7, far outside any clip range, A > 0 -> PPO would give zero gradient; KL-Cov does not
    logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.5]])
    A = torch.tensor([2.0])
    selected = torch.tensor([[False, True]])
    loss = kl_cov_token_loss(logp, old, A, selected, beta=0.5)
    loss.sum().backward()
    assert logp.grad[0, 0].item() == pytest.approx(-2.0 * math.e)  # d(-A r)/dlogp = -A r
    # selected: -A r + beta |logp - old| with logp > old -> -A r + beta
    assert logp.grad[0, 1].item() == pytest.approx(-2.0 * math.exp(0.5) + 0.5)
    assert loss[0, 1].item() == pytest.approx(-2.0 * math.exp(0.5) + 0.5 * 0.5)
    # the same token under PPO's clip gets no gradient: the contrast the test is about
    p2 = logp.detach().clone().requires_grad_(True)
    r = torch.exp(p2 - old)
    (-torch.min(r * A, torch.clamp(r, 0.8, 1.2) * A)).sum().backward()
    assert p2.grad[0, 0].item() == 0.0


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 12),
    ratio=st.floats(1e-3, 1.0),
    seed=st.integers(0, 2**16),
)
def test_selection_invariants(rows, cols, ratio, seed):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(rows, generator=g)
    logp = -torch.rand(rows, cols, generator=g) * 5
    mask = (torch.rand(rows, cols, generator=g) > 0.3).float()
    cov = token_covariance(A, logp, mask)
    # the batch mean of Cov over valid tokens is the (population) covariance: centred products sum to ~0 only in A
    valid = mask.bool()
    n_valid = int(valid.sum())
    kl = kl_cov_selection(cov, mask, ratio)
    assert not (kl & ~valid).any()
    assert int(kl.sum()) == selection_count(ratio, n_valid)
    if kl.any() and (valid & ~kl).any():
        assert cov[kl].min() >= cov[valid & ~kl].max()  # every chosen token outranks every unchosen one
    clipped = torch.rand(rows, cols, generator=g) > 0.7
    cc = clip_cov_selection(cov, mask, clipped, ratio, -0.5, 0.5, torch.Generator().manual_seed(seed))
    candidate = valid & ~clipped & (cov > -0.5) & (cov < 0.5)
    assert not (cc & ~candidate).any()
    assert int(cc.sum()) == min(selection_count(ratio, n_valid), int(candidate.sum()))
