"""Token balancing across processes (trainer/algorithms/rank_balance.py), checked against brute force and
round-robin."""

from __future__ import annotations

import itertools
import random

import pytest

from trainer.algorithms.rank_balance import balanced_shares, round_robin_counts


def _totals(costs, shares):
    return [sum(costs[i] for i in share) for share in shares]


def _long_tail(rng: random.Random, n: int) -> list[int]:
    """Lognormal lengths, p99/p50 about 8 like reasoning completions, capped."""
    return [min(int(rng.lognormvariate(4.0, 0.9)), 1024) + 1 for _ in range(n)]


def test_round_robin_counts_by_hand():
    assert round_robin_counts(7, 3) == [3, 2, 2]
    assert round_robin_counts(2, 4) == [1, 1, 0, 0]
    assert round_robin_counts(0, 2) == [0, 0]


def test_hand_example():
    """One long row and seven short ones on 2 processes, 4 rows each: round-robin puts the long row with three
    others (100+3+5+7 = 115 vs 2+4+6+8 = 20); the balanced deal gives the long row the three shortest."""
    costs = [100, 2, 3, 4, 5, 6, 7, 8]
    shares = balanced_shares(costs, 2)
    assert [len(s) for s in shares] == [4, 4]
    assert sorted(sum(shares, [])) == list(range(8))
    assert sorted(_totals(costs, shares)) == [26, 109]  # 100+2+3+4 with the long row: the optimum (brute force)
    best = min(max(sum(costs[i] for i in a), sum(costs) - sum(costs[i] for i in a))
               for a in itertools.combinations(range(8), 4))
    assert max(_totals(costs, shares)) == best


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_long_tailed_batches(world):
    """On random long-tailed batches: the round-robin counts exactly, every row once, the heaviest share never heavier
    than round-robin's (and much lighter on average), shares within one longest row of each other."""
    gains = []
    for seed in range(300):
        rng = random.Random(seed * 31 + world)
        n = rng.randint(1, 64)
        costs = _long_tail(rng, n)
        counts = round_robin_counts(n, world)
        shares = balanced_shares(costs, len(counts))
        assert [len(s) for s in shares] == counts
        assert sorted(sum(shares, [])) == list(range(n))
        assert all(s == sorted(s) for s in shares)
        totals = _totals(costs, shares)
        rr = _totals(costs, [list(range(r, n, world)) for r in range(world)])
        assert max(totals) <= max(rr)
        assert max(totals) - min(totals) <= max(costs)
        gains.append(max(rr) / max(totals))
    assert sum(gains) / len(gains) > 1.1  # balancing does something on long tails


def test_near_brute_force_optimum():
    """Small batches on 2 processes: the heaviest share is within one shortest row of the best possible deal."""
    for seed in range(200):
        rng = random.Random(seed)
        n = rng.randint(2, 12)
        costs = _long_tail(rng, n)
        counts = round_robin_counts(n, 2)
        shares = balanced_shares(costs, len(counts))
        best = min(max(sum(costs[i] for i in a), sum(costs) - sum(costs[i] for i in a))
                   for a in itertools.combinations(range(n), counts[0]))
        assert best <= max(_totals(costs, shares)) <= best + min(costs), (costs, shares)


def test_fewer_rows_than_processes():
    assert balanced_shares([5, 9], 4) == [[0], [1], [], []]
    assert balanced_shares([], 2) == [[], []]
    with pytest.raises(ValueError, match="at least one share"):
        balanced_shares([1], 0)
