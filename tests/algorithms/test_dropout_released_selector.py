"""GRPODropout as its authors' code runs it (hexuandeng/GRPODropout@4ad3b3b): the `balance` and `balance_neg`
selectors with their min_select_count and all-zero draw, and RECOMPUTE_ADV_AFTER_SELECT.

The oracles (tests/grpodropout_oracle.py) are plain-Python restatements of the released rules, one group at a time
with Python floats -- independent of the vectorised tensor code under test.
"""

from __future__ import annotations

import torch
from grpodropout_oracle import released_balance, released_balance_neg, released_grpo
from hypothesis import given, settings
from hypothesis import strategies as st
from test_algorithms_dropout import batches

from trainer.algorithms.dropout import (
    all_zero_push_groups,
    balanced_push_select,
    min_keep_count,
    restandardize,
    restore_negative_push_negative_advantage,
    seeded_subset,
)

PROPS = settings(max_examples=250, deadline=None)


def _as_mask(rows: list[int], G: int) -> list[bool]:
    return [g in rows for g in range(G)]


@PROPS
@given(batches())
def test_balanced_push_and_balance_neg_equal_the_released_selectors(batch):
    A, s = (t.double() for t in batch)
    keep = balanced_push_select(A, s)
    keep_neg = restore_negative_push_negative_advantage(A, s, keep)
    degenerate = all_zero_push_groups(A, s)
    for p in range(A.shape[0]):
        rows = released_balance(A[p].tolist(), s[p].tolist())
        assert (rows is None) == bool(degenerate[p])
        if rows is None:
            continue
        assert keep[p].tolist() == _as_mask(rows, A.shape[1])
        assert keep_neg[p].tolist() == _as_mask(released_balance_neg(A[p].tolist(), s[p].tolist()), A.shape[1])


@PROPS
@given(batches(), st.integers(0, 2**31 - 1))
def test_all_zero_push_groups_keep_min_select_count_drawn_reproducibly(batch, seed):
    """An all-zero-push group keeps exactly max(1, G // 4) of its rollouts (the released code's random subset), the
    same ones for the same key and seed, other groups are untouched; without a draw it keeps all G (the paper)."""
    A, s = batch
    A[0] = 0.0  # at least one degenerate group
    P, G = A.shape
    degenerate = all_zero_push_groups(A, s)
    keys = [f"{seed}:{p}" for p in range(P)]
    drawn = seeded_subset(degenerate.unsqueeze(1).expand(P, G), min_keep_count(G), keys)
    keep = balanced_push_select(A, s, all_zero_keep=drawn)
    assert (keep.sum(dim=1)[degenerate] == max(1, G // 4)).all()
    assert torch.equal(keep[~degenerate], balanced_push_select(A, s)[~degenerate])
    assert torch.equal(drawn, seeded_subset(degenerate.unsqueeze(1).expand(P, G), min_keep_count(G), keys))
    assert balanced_push_select(A, s)[degenerate].all()


def test_seeded_subset_depends_on_the_key():
    pool = torch.ones(1, 8, dtype=torch.bool)
    draws = {tuple(seeded_subset(pool, 2, [f"3407:{k}"])[0].nonzero().squeeze(1).tolist()) for k in range(40)}
    assert len(draws) > 10 and all(len(d) == 2 for d in draws)


@PROPS
@given(st.integers(1, 6), st.integers(2, 10), st.data())
def test_restandardize_is_verl_grpo_on_the_kept_rows(P, G, data):
    R = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=P * G, max_size=P * G)),
                     dtype=torch.float64).view(P, G)
    keep = torch.tensor(data.draw(st.lists(st.booleans(), min_size=P * G, max_size=P * G))).view(P, G)
    A = restandardize(R, keep, eps=1e-6)
    for p in range(P):
        rows = keep[p].nonzero().squeeze(1).tolist()
        expected = released_grpo([float(R[p, g]) for g in rows]) if rows else []
        assert torch.allclose(A[p, rows], torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
        assert (A[p][~keep[p]] == 0).all()


def test_restandardize_by_hand():
    # kept rewards [1, 0, 0] of a group of 4: mean 1/3, unbiased std sqrt(1/3) -> A = (2/3, -1/3, -1/3) / (0.57735..)
    R = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    keep = torch.tensor([[True, True, True, False]])
    std = (1 / 3) ** 0.5
    expected = torch.tensor([[2 / 3, -1 / 3, -1 / 3, 0.0]], dtype=torch.float64) / (std + 1e-6)
    assert torch.allclose(restandardize(R, keep), expected)
    # one kept row: verl's mean 0, std 1 -> A = R / (1 + eps); without the std division A = R
    one = torch.tensor([[False, False, False, True]])
    assert restandardize(R, one)[0, 3] == 1.0 / (1 + 1e-6)
    assert restandardize(R, one, scale=False)[0, 3] == 1.0


def test_balance_neg_by_hand():
    # s = [1, 3, 2, 2], s_bar = 2; A = [-1, -1, -1, 1] -> push = [1, -1, 0, 0]. balance: g0 (sum 1); g1 would bring the
    # sum to 0 (not > eps): stop; 1 kept >= m = 1. balance_neg brings back g1 (push -1, A -1), not g2 (push 0: never
    # eligible although A = -1) nor g3 (A = 1).
    A = torch.tensor([[-1.0, -1.0, -1.0, 1.0]])
    s = torch.tensor([[1.0, 3.0, 2.0, 2.0]])
    keep = balanced_push_select(A, s)
    assert keep.tolist() == [[True, False, False, False]]
    assert restore_negative_push_negative_advantage(A, s, keep).tolist() == [[True, True, False, False]]
