"""Plain-Python restatements of the GRPODropout authors' released rules (hexuandeng/GRPODropout@4ad3b3b), one group at
a time with Python floats: the oracles that winnow's vectorised selector and recomputation are checked against.

- ``released_balance`` / ``released_balance_neg``: verl/examples/grpo_dropout/selector_methods.py,
  select_balanced_push_zero and _select_balanced_push_zero_add_negpush_adv_sign (adv_sign "negative");
- ``released_grpo``: verl's compute_grpo_outcome_advantage (norm_adv_by_std_in_grpo True), which the authors' fit()
  runs again on the kept rows (RECOMPUTE_ADV_AFTER_SELECT).
"""

from __future__ import annotations

import statistics

EPS = 1e-12


def released_balance(A: list[float], s: list[float]) -> list[int] | None:
    """The `balance` selector on one group (None for an all-zero-push group, whose pick is random upstream)."""
    G = len(A)
    s_bar = sum(s) / G
    push = [a * (x - s_bar) for a, x in zip(A, s)]
    pos = [g for g in range(G) if push[g] > EPS]
    neg = [g for g in range(G) if push[g] < -EPS]
    zero = [g for g in range(G) if abs(push[g]) <= EPS]
    m = max(1, G // 4)
    if len(zero) == G:
        return None
    chosen = sorted(pos, key=lambda g: push[g], reverse=True)
    if not pos or not neg:  # single sign: zero pushes, then the same-sign pool from the top
        chosen += zero[: max(0, m - len(chosen))]
        pool = sorted(neg if neg else pos, key=lambda g: push[g], reverse=True)
        chosen += [g for g in pool if g not in chosen][: max(0, m - len(chosen))]
        return sorted(chosen)
    total = sum(push[g] for g in chosen)
    for g in sorted(neg, key=lambda g: push[g], reverse=True):  # closest to zero first
        if total + push[g] <= EPS:
            break
        chosen.append(g)
        total += push[g]
    chosen += zero[: max(0, m - len(chosen))]  # never more negatives here
    return sorted(chosen)


def released_balance_neg(A: list[float], s: list[float]) -> list[int] | None:
    """`balance_neg`: `balance`, then every unselected rollout with push < -eps and A < -eps is added back."""
    base = released_balance(A, s)
    if base is None:
        return None
    s_bar = sum(s) / len(s)
    back = [g for g in range(len(A)) if g not in base and A[g] * (s[g] - s_bar) < -EPS and A[g] < -EPS]
    return sorted(base + back)


def released_grpo(scores: list[float], eps: float = 1e-6) -> list[float]:
    """verl's compute_grpo_outcome_advantage on one group's kept scores (norm_adv_by_std_in_grpo True): a single
    score gets mean 0 and std 1, otherwise the mean and the unbiased std."""
    if len(scores) == 1:
        mean, std = 0.0, 1.0
    else:
        mean, std = statistics.fmean(scores), statistics.stdev(scores)
    return [(x - mean) / (std + eps) for x in scores]
