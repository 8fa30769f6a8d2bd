"""Which process trains which row: shares of equal row count with about equal token totals.

With token-budget micro-batches (trainer/pipeline/token_budget.py) a process's forward/backward time follows its
tokens, not its rows; the processes meet at every gradient all-reduce (and, under ZeRO-3, at every forward), so the
process dealt the longest rows sets the step time. verl balances the tokens per data-parallel rank before its update
(volcengine/verl@0040110:verl/trainer/ppo/ray_trainer.py ``_balance_batch``, partitioned by
volcengine/verl@55a1e70:verl/utils/seqlen_balancing.py ``get_seqlen_balanced_partitions``, Karmarkar-Karp with
equal partition sizes).

Here the row counts are not free: batch compaction gives every process the same number of micro-batch rows and
step dealing (trainer/algorithms/deal_plan.py) places a process's kept rows by its kept *count*, so the shares keep
the round-robin counts exactly (they differ by at most one) and only choose which rows. verl's partitioner takes
equal sizes and lives in a package this project does not depend on, so the same Karmarkar-Karp idea is written out
here for sizes that differ by one, followed by single swaps; tests/algorithms/test_rank_balance.py bounds the result
against round-robin and against brute force.
"""

from __future__ import annotations

import heapq
from typing import Sequence


def round_robin_shares(rows: int, world: int) -> list[list[int]]:
    """Rows ``0..rows-1`` dealt round-robin over ``world`` processes: row i to process i mod world."""
    return [list(range(rank, rows, world)) for rank in range(world)]


def round_robin_counts(rows: int, world: int) -> list[int]:
    """Rows each process holds when ``rows`` rows are dealt round-robin over ``world`` processes."""
    return [len(share) for share in round_robin_shares(rows, world)]


def balanced_shares(costs: Sequence[float], world: int) -> list[list[int]]:
    """Split items ``0..len(costs)-1`` into ``world`` shares of round-robin's sizes (:func:`round_robin_counts`: the
    first shares hold one item more) with token totals as even as the rule below makes them. Each share lists its
    items in increasing order (a process keeps the batch's global order among its rows). Pure and deterministic:
    every process computes the same shares from the same gathered costs.

    1. Karmarkar-Karp with equal sizes (as verl): the items, padded with zero-cost blanks to a multiple of the share
       count, sorted and cut into consecutive runs of one item per share; runs are merged two at a time, the two
       with the largest spread first, pairing one's heaviest partial share with the other's lightest. The blanks
       are the cheapest run, so each share receives at most one: the shares without a blank go to the first
       processes, which round-robin gives one item more.
    2. Swaps: while swapping one item of the heaviest share with a cheaper item of another share lowers the heavier
       of the two, make the swap that lowers it most (counts stay; no total rises above the old maximum).
    3. The round-robin deal (item i to share i mod world) is kept when its heaviest share is no heavier: balancing
       never makes the slowest process slower.
    """
    n = len(costs)
    if world < 1:
        raise ValueError(f"need at least one share (got world={world})")
    shares = _karmarkar_karp(costs, world)
    shares.sort(key=lambda share: (-len(share), min(share, default=n)))  # full shares first, then by first item
    totals = [float(sum(costs[i] for i in share)) for share in shares]
    _improve_by_swaps(costs, shares, totals)
    rr = round_robin_shares(n, world)
    if max(sum(costs[i] for i in share) for share in rr) <= max(totals):
        return rr
    return [sorted(share) for share in shares]


def _karmarkar_karp(costs: Sequence[float], world: int) -> list[list[int]]:
    """Step 1 of :func:`balanced_shares`: ``world`` shares whose sizes differ by at most one."""
    blanks = -len(costs) % world
    items = [(0.0, -1)] * blanks + sorted((float(c), i) for i, c in enumerate(costs))
    heap = []  # (-spread, tie, partial shares as (total, items)), one entry per run
    for tie, start in enumerate(range(0, len(items), world)):
        run = [(c, [i] if i >= 0 else []) for c, i in items[start:start + world]]
        heap.append((-(run[-1][0] - run[0][0]), tie, run))
    heapq.heapify(heap)
    tie = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        a = sorted(a, key=lambda s: s[0])
        b = sorted(b, key=lambda s: -s[0])
        merged = sorted(((x[0] + y[0], x[1] + y[1]) for x, y in zip(a, b)), key=lambda s: s[0])
        heapq.heappush(heap, (-(merged[-1][0] - merged[0][0]), tie, merged))
        tie += 1
    return [share for _, share in heap[0][2]] if heap else [[] for _ in range(world)]


def _improve_by_swaps(costs: Sequence[float], shares: list[list[int]], totals: list[float]) -> None:
    """Step 2 of :func:`balanced_shares`, in place. Each swap strictly lowers the heaviest share's total or moves the
    maximum to another share at a lower value, so it ends."""
    while True:
        heavy = max(range(len(shares)), key=lambda r: (totals[r], -r))
        best = None  # (new max of the pair, heavy item position, other share, other item position)
        for other in range(len(shares)):
            gap = totals[heavy] - totals[other]
            if other == heavy or gap <= 0:
                continue
            for hi, i in enumerate(shares[heavy]):
                for oj, j in enumerate(shares[other]):
                    d = costs[i] - costs[j]
                    if 0 < d < gap:
                        pair_max = max(totals[heavy] - d, totals[other] + d)
                        if best is None or pair_max < best[0]:
                            best = (pair_max, hi, other, oj)
        if best is None:
            return
        _, hi, other, oj = best
        i, j = shares[heavy][hi], shares[other][oj]
        shares[heavy][hi], shares[other][oj] = j, i
        totals[heavy] += costs[j] - costs[i]
        totals[other] += costs[i] - costs[j]
