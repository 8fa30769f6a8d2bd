"""GRPODropout's pure functions: eq. (4)/(7) selection, eq. (9) recentering, the balanced_push selector.

Property tests over random (P, G) batches (G 2..16, P 1..8, fp32 values up to 1e4, tie-heavy and
GRPO-shaped groups, whole all-zero-advantage groups) plus hand-computed cases.
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.algorithms.dropout import (
    balanced_push_select,
    dropout_metrics,
    entropy_contributions,
    recenter,
    restore_removed,
    select_rollouts,
    sequence_surprisal,
    sum_tolerance,
)
from trainer.algorithms.grpo import grpo_advantages

PROPS = settings(max_examples=250, deadline=None)


@st.composite
def batches(draw, max_P=8, max_G=16):
    """(A, s) fp32 (P, G): free large-magnitude values, tie-heavy grids, or GRPO advantages of 0/1 rewards."""
    P, G = draw(st.integers(1, max_P)), draw(st.integers(2, max_G))
    kind = draw(st.sampled_from(["free", "ties", "grpo"]))
    n = P * G
    if kind == "free":
        A = draw(st.lists(st.floats(-1e4, 1e4, width=32), min_size=n, max_size=n))
        s = draw(st.lists(st.floats(0, 1e4, width=32), min_size=n, max_size=n))
    elif kind == "ties":
        A = draw(st.lists(st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0]), min_size=n, max_size=n))
        s = draw(st.lists(st.sampled_from([0.1, 0.2, 0.3, 0.5, 1.0, 2.0]), min_size=n, max_size=n))
    else:
        R = torch.tensor(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)))
        A = grpo_advantages(R, G)[0].tolist()
        s = draw(st.lists(st.floats(0.0, 5.0, width=32), min_size=n, max_size=n))
    A = torch.tensor(A, dtype=torch.float32).view(P, G)
    s = torch.tensor(s, dtype=torch.float32).view(P, G)
    zero_rows = torch.tensor(draw(st.lists(st.booleans(), min_size=P, max_size=P)))
    if draw(st.booleans()):
        A[zero_rows] = 0.0
    return A, s


@functools.lru_cache(maxsize=None)
def subsets(G: int) -> torch.Tensor:
    """All 2^G subsets of range(G) as a (2^G, G) float64 0/1 matrix."""
    return torch.tensor(list(itertools.product([0.0, 1.0], repeat=G)), dtype=torch.float64)


def kept_weights(s: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Independent float64 softmax(-s) over I (shifted by min_I s), 0 outside I."""
    s = s.double()
    smin = torch.where(keep, s, math.inf).amin(dim=1, keepdim=True)
    e = torch.where(keep, torch.exp(-(s - torch.where(torch.isinf(smin), 0.0, smin))), 0.0)
    return e / e.sum(dim=1, keepdim=True).clamp(min=1e-300)


# ---------------------------------------------------------------- selection (eq. 4, eq. 7)


@PROPS
@given(batches())
def test_select_both_is_feasible_and_maximum_cardinality(batch):
    A, s = batch
    keep = select_rollouts(A, s, delete="both")
    h = entropy_contributions(A, s)
    tol = sum_tolerance(A, s)
    assert keep.dtype == torch.bool and keep.shape == A.shape
    kept_sum = torch.where(keep, h, 0.0).sum(dim=1)
    slack = 1e-12 * h.abs().sum(dim=1)  # summation-order rounding only
    assert (kept_sum >= -tol - slack).all()
    # only negative contributions are removed, and they are the most negative ones
    assert (h[~keep] < 0).all()
    G = A.shape[1]
    if G <= 12:  # brute force over every subset
        M = subsets(G)
        sums, sizes = h @ M.T, M.sum(dim=1)
        feasible = sums >= (-tol + slack).unsqueeze(1)
        best = torch.where(feasible, sizes, -1.0).amax(dim=1)
        assert torch.equal(best, keep.sum(dim=1).double())
    else:  # proof check: no (|R|-1)-subset of removals suffices, and the k-smallest sum is the minimum
        for p in range(A.shape[0]):
            k = int((~keep[p]).sum())
            if k:
                smallest = torch.sort(h[p]).values[: k - 1].sum()
                assert h[p].sum() - smallest < -tol[p] + slack[p]


@PROPS
@given(batches())
def test_restoration_rules(batch):
    A, s = batch
    both = select_rollouts(A, s, delete="both")
    pos = select_rollouts(A, s, delete="positive")
    negd = select_rollouts(A, s, delete="negative")
    assert pos[A <= 0].all()  # eq. (7): every non-positive-advantage rollout is kept
    assert negd[A >= 0].all()
    assert torch.equal(pos, both | (A <= 0))
    assert torch.equal(negd, both | (A >= 0))
    assert torch.equal(select_rollouts(A, s), pos)  # paper default


@PROPS
@given(batches())
def test_recenter_prob_weighted_zero_weighted_mean(batch):
    A, s = batch
    for delete in ("positive", "negative", "both"):
        keep = select_rollouts(A, s, delete=delete)
        Ab = recenter(A, s, keep)
        assert Ab.dtype == A.dtype and torch.isfinite(Ab).all()
        assert (Ab[~keep] == 0).all()
        wmean = (kept_weights(s, keep) * Ab.double()).sum(dim=1)
        bound = 1e-6 * A.abs().amax(dim=1).double() + 1e-30
        assert (wmean.abs() <= bound).all(), (wmean, bound)
        m = recenter(A, s, keep, mode="mean").double()
        assert (m[~keep] == 0).all()
        assert (m.sum(dim=1).abs() <= 1e-6 * G_scale(A)).all()
        assert torch.equal(recenter(A, s, keep, mode="none"), torch.where(keep, A, 0.0))
        metrics = dropout_metrics(A, s, keep, Ab)
        optional = ("retained_per_question", "weighted_adv_mean_after")
        assert all(math.isfinite(v) for k, v in metrics.items() if k not in optional)
        if keep.any():
            assert abs(metrics["weighted_adv_mean_after"]) <= float(bound.max())


def G_scale(A: torch.Tensor) -> torch.Tensor:
    return A.shape[1] * A.abs().amax(dim=1).double() + 1e-30


@PROPS
@given(batches())
def test_all_zero_advantage_groups_unchanged(batch):
    A, s = batch
    zero = (A == 0).all(dim=1)
    for delete in ("positive", "negative", "both"):
        keep = select_rollouts(A, s, delete=delete)
        assert keep[zero].all()
        for mode in ("prob_weighted", "mean", "none"):
            assert (recenter(A, s, keep, mode=mode)[zero] == 0).all()
    assert balanced_push_select(A, s)[zero].all()


@PROPS
@given(batches())
def test_balanced_push_invariants(batch):
    A, s = batch
    keep = balanced_push_select(A, s)
    G = A.shape[1]
    push = A.double() * (s.double() - s.double().mean(dim=1, keepdim=True))
    has_pos, has_neg = (push > 1e-12).any(dim=1), (push < -1e-12).any(dim=1)
    assert keep.any(dim=1).all()
    assert keep[push > 1e-12].all()  # every positive push kept
    kept_push = torch.where(keep, push, 0.0).sum(dim=1)
    assert (kept_push[has_pos] > 1e-12).all()
    only_neg = has_neg & ~has_pos
    assert (keep.sum(dim=1)[only_neg] == max(1, G // 4)).all()
    assert torch.equal(keep, balanced_push_select(A, s))  # deterministic


# ---------------------------------------------------------------- hand cases


def test_hand_four_rollout_group():
    # A = [1.5, 0.5, -0.5, -1.5], s = [0.2, 0.5, 0.9, 0.4]
    # s_bar = 2.0 / 4 = 0.5; s - s_bar = [-0.3, 0.0, 0.4, -0.1]
    # h = A (s - s_bar) / 4 = [-0.1125, 0.0000, -0.0500, 0.0375]; sum = -0.1250 < 0
    # remove g=0 (h = -0.1125): sum_I h = -0.0125 < 0; remove g=2 (h = -0.0500): sum_I h = 0.0375 >= 0, stop.
    # delete="both": I = {1, 3}. Restore (eq. 7) removed A <= 0: g=2 (A = -0.5) returns -> I = {1, 2, 3}.
    # softmax(-s) over I: e^-0.5 = 0.6065, e^-0.9 = 0.4066, e^-0.4 = 0.6703, sum 1.6834
    #   w = [0.3603, 0.2415, 0.3982]
    # b = 0.5*0.3603 - 0.5*0.2415 - 1.5*0.3982 = -0.5379
    # A_bar = [0 (removed), 0.5 + 0.5379, -0.5 + 0.5379, -1.5 + 0.5379] = [0, 1.0379, 0.0379, -0.9621]
    # "mean": b = (0.5 - 0.5 - 1.5)/3 = -0.5 -> [0, 1.0, 0.0, -1.0]
    A = torch.tensor([[1.5, 0.5, -0.5, -1.5]])
    s = torch.tensor([[0.2, 0.5, 0.9, 0.4]])
    h = entropy_contributions(A, s)
    assert torch.allclose(h, torch.tensor([[-0.1125, 0.0, -0.05, 0.0375]], dtype=torch.float64), atol=1e-8)
    assert select_rollouts(A, s, delete="both").tolist() == [[False, True, False, True]]
    keep = select_rollouts(A, s)
    assert keep.tolist() == [[False, True, True, True]]
    assert select_rollouts(A, s, delete="negative").tolist() == [[True, True, False, True]]
    Ab = recenter(A, s, keep)
    assert [round(x, 4) for x in Ab[0].tolist()] == [0.0, 1.0379, 0.0379, -0.9621]
    b = (0.5 * math.exp(-0.5) - 0.5 * math.exp(-0.9) - 1.5 * math.exp(-0.4)) / (
        math.exp(-0.5) + math.exp(-0.9) + math.exp(-0.4)
    )
    assert b == pytest.approx(-0.537892725804396, abs=1e-6)
    torch.testing.assert_close(Ab, torch.tensor([[0.0, 0.5 - b, -0.5 - b, -1.5 - b]]), rtol=0, atol=1e-6)
    assert [round(x, 4) for x in recenter(A, s, keep, mode="mean")[0].tolist()] == [0.0, 1.0, 0.0, -1.0]
    m = dropout_metrics(A, s, keep, Ab)
    assert m["retained_per_question"] == 3.0 and m["kept_ratio"] == 0.75 and m["groups_with_deletion"] == 1.0
    assert m["h_sum_before"] == pytest.approx(-0.125) and m["h_sum_after"] == pytest.approx(-0.0125)
    assert abs(m["weighted_adv_mean_after"]) < 1e-6


def test_ties_remove_lowest_index_first():
    # s = [0, 0, 2, 2], s_bar = 1; A = [1, 1, 1.5, 0] -> h = [-0.25, -0.25, 0.375, 0]; sum = -0.125.
    # Removing one of the tied -0.25 suffices (sum 0.125); the lowest index (g=0) goes.
    A = torch.tensor([[1.0, 1.0, 1.5, 0.0]])
    s = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    assert select_rollouts(A, s, delete="both").tolist() == [[False, True, True, True]]


def test_numerically_zero_sums_keep_everything():
    # exact zero: h = [-0.125, 0.125, 0.125, -0.125]
    A = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    s = torch.tensor([[1.0, 1.0, 2.0, 2.0]])
    assert entropy_contributions(A, s).sum() == 0
    assert select_rollouts(A, s, delete="both").all()
    # fp32 representation noise: 0.1 + 0.3 == 0.2 + 0.2 mathematically, sum h is ~ -1e-9 in float64
    A = torch.tensor([[-1.0, -1.0, 1.0, 1.0]])
    s = torch.tensor([[0.1, 0.3, 0.2, 0.2]])
    total = entropy_contributions(A, s).sum()
    assert -1e-8 < total < 0
    assert select_rollouts(A, s, delete="both").all()
    # a genuinely negative sum still deletes
    s = torch.tensor([[0.1, 0.31, 0.2, 0.2]])
    assert not select_rollouts(A, s, delete="both").all()


def test_large_magnitude_fp32_no_overflow():
    # raw e^{-s} underflows to 0 for s ~ 1e4 (0/0) and e^{+s} overflows; softmax over I must not.
    s = torch.tensor([[1e4, 1e4 + 1.0, 1e4 + 2.0, 1e4 + 5.0], [1e4, 9000.0, 5.0, 0.0]], dtype=torch.float32)
    A = torch.tensor([[3.0, 1.0, -1.0, -3.0], [1e4, -1e4, 5e3, -5e3]], dtype=torch.float32)
    for delete in ("positive", "negative", "both"):
        keep = select_rollouts(A, s, delete=delete)
        Ab = recenter(A, s, keep)
        assert torch.isfinite(Ab).all()
        wmean = (kept_weights(s, keep) * Ab.double()).sum(dim=1)
        assert (wmean.abs() <= 1e-6 * A.abs().amax(dim=1)).all()
        assert all(math.isfinite(v) for v in dropout_metrics(A, s, keep, Ab).values())
    keep = torch.tensor([[True, True, True, False], [False, True, True, False]])
    Ab = recenter(A, s, keep)
    w = torch.tensor([1.0, math.exp(-1.0), math.exp(-2.0)], dtype=torch.float64)
    b0 = float((w * torch.tensor([3.0, 1.0, -1.0], dtype=torch.float64)).sum() / w.sum())
    assert Ab[0].tolist() == pytest.approx([3.0 - b0, 1.0 - b0, -1.0 - b0, 0.0], abs=1e-5)
    assert Ab[1].tolist() == pytest.approx([0.0, -1.5e4, 0.0, 0.0], abs=1e-2)  # all weight on s = 5


def test_contributions_in_float64_and_tolerance_scale():
    # s one fp32 ulp apart at 1e4: s_bar = 1e4 + 2u/3 is not an fp32 number, so fp32 arithmetic gives h_0 = 0.
    u = 2.0**-10
    A = torch.tensor([[3000.0, -1000.0, 7.0]])
    s = torch.tensor([[1e4, 1e4 + u, 1e4 + u]])
    h = entropy_contributions(A, s)
    assert h.dtype == torch.float64
    exact = [3000.0 * (-2 * u / 3) / 3, -1000.0 * (u / 3) / 3, 7.0 * (u / 3) / 3]
    assert h[0].tolist() == pytest.approx(exact, rel=1e-7)  # float64 cancellation only
    # ...but a spread of one fp32 ulp is below the inputs' resolution: tol = 8 eps32 * sum|A|(|s|+|s_bar|)/G
    tol = sum_tolerance(A, s)
    assert float(tol[0]) == pytest.approx(8 * 2.0**-23 * 4007 * 2e4 / 3, rel=1e-6)
    assert select_rollouts(A, s, delete="both").all()
    assert sum_tolerance(A.double(), s.double())[0] < 1e-6  # fp64 inputs: fp64 epsilon; sum h = -0.7588
    assert not select_rollouts(A.double(), s.double(), delete="both").all()


def test_empty_retained_set_is_all_zero():
    A = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    s = torch.tensor([[0.0, 0.0, 2.0, 2.0]])  # every h = -0.25: "both" removes all four
    keep = select_rollouts(A, s, delete="both")
    assert not keep.any()
    for mode in ("prob_weighted", "mean", "none"):
        assert torch.equal(recenter(A, s, keep, mode=mode), torch.zeros_like(A))
    assert math.isnan(dropout_metrics(A, s, keep, recenter(A, s, keep))["weighted_adv_mean_after"])


def test_sequence_surprisal_bases():
    nan = float("nan")
    logps = torch.tensor([[-1.0, -2.0, -3.0, nan], [-0.5, -float("inf"), 0.0, 0.0], [nan, nan, nan, nan]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert sequence_surprisal(logps, mask).tolist() == [2.0, 0.5, 0.0]  # (1+2+3)/3, 0.5/1, empty -> 0
    assert sequence_surprisal(logps, mask, basis="sum").tolist() == [6.0, 0.5, 0.0]
    assert sequence_surprisal(logps.double(), mask.bool()).dtype == torch.float64
    with pytest.raises(ValueError):
        sequence_surprisal(logps, mask, basis="avg")


# balanced_push hand cases. G = 8 (m = 2), s = 10 + gap with gap = [3, 1, -1, -3, 2, -2, 0, 0], s_bar = 10.
S8 = torch.tensor([[13.0, 11.0, 9.0, 7.0, 12.0, 8.0, 10.0, 10.0]])


def test_balanced_push_strict_eps_stops_at_zero_sum():
    # push = A * gap = [3, 1, -1, -3, -2, 2, 0, 0]; positives {0, 1, 5}, total 6.
    # negatives closest to zero first: g2 (-1) -> 5 > eps, g4 (-2) -> 3 > eps, g3 (-3) -> 0, not > eps: stop.
    # zero pushes {6, 7} excluded (5 kept >= m). The paper's rule keeps all 8 (sum h = 0 >= 0).
    A = torch.tensor([[1.0, 1.0, 1.0, 1.0, -1.0, -1.0, 1.0, -1.0]])
    assert balanced_push_select(A, S8).tolist() == [[True, True, True, False, True, True, False, False]]
    assert select_rollouts(A, S8, delete="both").all()
    # A_3 = 0.999 -> push -2.997, sum 0.003 > eps: g3 is kept too
    A[0, 3] = 0.999
    assert balanced_push_select(A, S8).tolist() == [[True, True, True, True, True, True, False, False]]


def test_balanced_push_zero_backfill_and_restoration():
    # A = [2, 0, 0, 1, 0, 0, 0, 0]: push = [6, 0, 0, -3, 0, 0, 0, 0]; the g=2..7 zero pushes have A = 0.
    # Mixed: keep g0 (6), add g3 (6 - 3 = 3 > eps); 2 kept = m, no backfill.
    A = torch.tensor([[2.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    keep = balanced_push_select(A, S8)
    assert keep.tolist() == [[True, False, False, True, False, False, False, False]]
    # eq. (7) restoration on top brings back every A <= 0 -- including the A = 0 rows the reference drops
    assert restore_removed(A, keep, "positive").all()
    assert restore_removed(A, keep, "negative").all()  # every A >= 0 here
    assert torch.equal(restore_removed(A, keep, "both"), keep)
    # one positive, a larger negative: push = [6, 0, 0, -9, 0...]: 6 - 9 <= eps, 1 kept < m -> zero push g1
    A = torch.tensor([[2.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0]])
    assert balanced_push_select(A, S8).tolist() == [[True, True, False, False, False, False, False, False]]
    expected = [[True, True, True, False, True, False, False, False]]  # min_keep = 4: zero pushes g1, g2, g4
    assert balanced_push_select(A, S8, min_keep=4).tolist() == expected


def test_balanced_push_single_sign_and_all_zero():
    # s = [1, 2, 3, 4], gap = [-1.5, -0.5, 0.5, 1.5]; A = [1, 1, -1, -1] -> push = [-1.5, -0.5, -0.5, -1.5]
    # no positives, no zeros: m = max(1, 4 // 4) = 1 -> least negative, tie g1/g2 -> g1
    s = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    A = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    assert balanced_push_select(A, s).tolist() == [[False, True, False, False]]
    assert balanced_push_select(A, s, min_keep=3).tolist() == [[True, True, True, False]]
    # only positives: all kept
    assert balanced_push_select(-A, s).all()
    # all-zero advantages, and equal surprisals (all pushes zero): every row kept, deterministically
    assert balanced_push_select(torch.zeros(2, 8), torch.rand(2, 8)).all()
    assert balanced_push_select(torch.randn(1, 8), torch.full((1, 8), 0.7)).all()


def test_argument_validation():
    A, s = torch.zeros(2, 4), torch.zeros(2, 4)
    with pytest.raises(ValueError):
        select_rollouts(A, s, delete="pos")
    with pytest.raises(ValueError):
        recenter(A, s, torch.ones(2, 4, dtype=torch.bool), mode="weighted")
    with pytest.raises(ValueError):
        select_rollouts(A.view(-1), s.view(-1))
