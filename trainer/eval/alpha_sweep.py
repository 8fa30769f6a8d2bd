"""UECR-GRPO's fixed-rollout alpha audit (paper App. F.4) over scored response groups.

PUU ranks a group's responses by the unified utility R^U = R^task + alpha R^T (R^T: the length-normalised teacher
score). For a grid of alpha the audit measures, on *fixed* rollouts (no retraining):

- ``conflict_rate``: group-balanced correct-incorrect ordering inversions -- per mixed group the fraction of
  (correct i, incorrect j) pairs with R^U_j > R^U_i (strict), averaged over mixed groups;
- ``any_inversion_rate``: mixed groups with at least one inverted pair;
- ``pair_inversion_rate``: inverted pairs over all pairs (pooled);
- ``sign_flip_rate``: responses of mixed groups whose group-normalised A^U (population std, eps 1e-6) has another
  sign than the centred task reward -- a trajectory-sign statistic, not an ordering one;
- the per-group safety threshold alpha*_g (:func:`trainer.algorithms.uecr.alpha_safety`) and its distribution;
- 95% intervals from a bootstrap clustered by question (every group of a resampled question, across checkpoints,
  enters together; F.4: 2,000 replicates, seed 42), and the rule-of-three bound 3/n for a zero-event estimate.

Input records (JSON lines) are launch/eval.py's ``results.jsonl`` rows -- ``system`` (the checkpoint), ``id``
(the question), ``correct`` (the task reward) -- plus a ``teacher_score`` per response (the response's mean
teacher-minus-checkpoint token log-ratio at T = 1, scored separately); the key names are configurable.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from trainer.algorithms.uecr import alpha_safety

DEFAULT_ALPHAS = tuple(sorted({0.0, 0.25, 0.5, 1.0, 2.0, 4.0, *np.round(np.linspace(0.0, 8.0, 81), 6).tolist()}))


@dataclass
class Group:
    """One response group: the checkpoint that generated it, its question, task rewards R and teacher scores S."""

    checkpoint: str
    question: str
    R: np.ndarray
    S: np.ndarray

    @property
    def mixed(self) -> bool:
        """Whether the verifier separates the group (max > min): only mixed groups have correct-incorrect pairs."""
        return bool(self.R.max() > self.R.min())


def load_groups(
    path: str | Path,
    *,
    reward_key: str = "correct",
    score_key: str = "teacher_score",
    question_key: str = "id",
    checkpoint_key: str = "system",
    benchmark_key: str = "benchmark",
) -> list[Group]:
    """Groups of a JSON-lines file, keyed by (checkpoint, benchmark, question); records lacking a field fail loudly."""
    rows: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        missing = [k for k in (reward_key, score_key, question_key) if k not in rec]
        if missing:
            raise ValueError(
                f"{path}:{n}: record lacks {missing}; pass --reward_key/--score_key/--question_key to name "
                f"the fields (found {sorted(rec)})"
            )
        question = f"{rec.get(benchmark_key, '')}/{rec[question_key]}"
        rows[(str(rec.get(checkpoint_key, "")), question)].append((float(rec[reward_key]), float(rec[score_key])))
    return [Group(c, q, np.array([r for r, _ in v]), np.array([s for _, s in v])) for (c, q), v in rows.items()]


def _pairs(g: Group) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays (i correct, j incorrect) of a group; correct = the group's maximum task reward."""
    correct = g.R == g.R.max()
    i, j = np.nonzero(correct[:, None] & ~correct[None, :])
    return i, j


def group_counts(g: Group, alphas: Sequence[float]) -> dict[str, np.ndarray]:
    """Per alpha: inverted pairs, pairs, sign flips and responses counted, for one mixed group."""
    a = np.asarray(alphas, dtype=np.float64)[:, None]
    U = g.R[None, :] + a * g.S[None, :]  # (A, G)
    i, j = _pairs(g)
    inverted = (U[:, j] > U[:, i]).sum(axis=1)
    dev = U - U.mean(axis=1, keepdims=True)
    A_U = dev / (np.sqrt((dev ** 2).mean(axis=1, keepdims=True)) + 1e-6)
    centred = g.R - g.R.mean()
    signed = centred != 0
    flips = (np.sign(A_U[:, signed]) != np.sign(centred[signed])[None, :]).sum(axis=1)
    return {
        "inverted": inverted,
        "pairs": np.full(len(a), len(i)),
        "flips": flips,
        "signed": np.full(len(a), int(signed.sum())),
    }


def sweep(groups: Iterable[Group], alphas: Sequence[float] = DEFAULT_ALPHAS) -> list[dict[str, float]]:
    """The ordering metrics of every alpha over the mixed groups (point estimates)."""
    mixed = [g for g in groups if g.mixed]
    if not mixed:
        raise ValueError("no mixed group (every group's task rewards are tied): nothing to audit")
    counts = [group_counts(g, alphas) for g in mixed]
    inv = np.stack([c["inverted"] for c in counts])  # (N, A)
    pairs = np.stack([c["pairs"] for c in counts])
    flips, signed = np.stack([c["flips"] for c in counts]), np.stack([c["signed"] for c in counts])
    out = []
    for k, alpha in enumerate(alphas):
        out.append({
            "alpha": float(alpha),
            "conflict_rate": float((inv[:, k] / pairs[:, k]).mean()),
            "any_inversion_rate": float((inv[:, k] > 0).mean()),
            "pair_inversion_rate": float(inv[:, k].sum() / pairs[:, k].sum()),
            "sign_flip_rate": float(flips[:, k].sum() / max(int(signed[:, k].sum()), 1)),
            "mixed_groups": len(mixed),
            "pairs": int(pairs[:, k].sum()),
            # 95% rule-of-three upper bounds, meaningful when the observed count is zero
            "rule_of_three_groups": 3.0 / len(mixed),
            "rule_of_three_pairs": 3.0 / float(pairs[:, k].sum()),
        })
    return out


def alpha_star_summary(groups: Iterable[Group]) -> dict[str, float]:
    """Distribution of the per-group safety threshold alpha*_g over mixed groups (F.4's min, 5th percentile,
    median and share of +inf)."""
    stars = np.array([alpha_safety(torch.as_tensor(g.R), torch.as_tensor(g.S)) for g in groups if g.mixed])
    if stars.size == 0:
        raise ValueError("no mixed group: alpha* is undefined")
    finite = stars[np.isfinite(stars)]
    # order statistics (no interpolation: +inf thresholds are values, not a reason for NaN)
    pct = (lambda q: float(np.percentile(stars, q, method="inverted_cdf"))) if finite.size else (lambda q: math.inf)
    return {
        "min": float(stars.min()),
        "p5": pct(5),
        "median": pct(50),
        "frac_inf": float((~np.isfinite(stars)).mean()),
        "mixed_groups": int(stars.size),
    }


def clustered_bootstrap(groups: Iterable[Group], alphas: Sequence[float] = DEFAULT_ALPHAS, *, replicates: int = 2000,
                        seed: int = 42, level: float = 0.95) -> list[dict[str, Any]]:
    """Percentile intervals of conflict_rate and any_inversion_rate, resampling questions with replacement; a drawn
    question contributes all its mixed groups (every checkpoint), so within-question correlation is kept."""
    mixed = [g for g in groups if g.mixed]
    if not mixed:
        raise ValueError("no mixed group: nothing to bootstrap")
    questions = sorted({g.question for g in mixed})
    index = {q: n for n, q in enumerate(questions)}
    Q, A = len(questions), len(alphas)
    rate_sum, any_sum, n_groups = np.zeros((Q, A)), np.zeros((Q, A)), np.zeros(Q)
    for g in mixed:
        c = group_counts(g, alphas)
        q = index[g.question]
        rate_sum[q] += c["inverted"] / c["pairs"]
        any_sum[q] += c["inverted"] > 0
        n_groups[q] += 1
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, Q, size=(replicates, Q))
    weights = np.stack([np.bincount(d, minlength=Q) for d in draws]).astype(np.float64)  # (B, Q) multiplicities
    denom = weights @ n_groups  # every draw holds >= 1 question and every question >= 1 mixed group
    conflict, anyinv = (weights @ rate_sum) / denom[:, None], (weights @ any_sum) / denom[:, None]
    lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2

    def interval(x: np.ndarray) -> list[float]:  # percentile interval as order statistics of the replicates
        return [float(np.percentile(x, lo, method="inverted_cdf")), float(np.percentile(x, hi, method="inverted_cdf"))]

    return [
        {
            "alpha": float(a),
            "conflict_rate_ci": interval(conflict[:, k]),
            "any_inversion_rate_ci": interval(anyinv[:, k]),
        }
        for k, a in enumerate(alphas)
    ]


def refinement_grid(groups: Iterable[Group], alphas: Sequence[float] = DEFAULT_ALPHAS, *, threshold: float = 0.10,
                    points: int = 10) -> list[float]:
    """F.4's second grid: ``points`` alphas strictly between the first grid alpha at which, at some checkpoint, at
    least ``threshold`` of the mixed groups contain an inversion and the grid alpha before it (empty when no grid
    alpha reaches the threshold)."""
    by_checkpoint: dict[str, list[Group]] = defaultdict(list)
    for g in groups:
        if g.mixed:
            by_checkpoint[g.checkpoint].append(g)
    first = math.inf
    for gs in by_checkpoint.values():
        for row in sweep(gs, alphas):
            if row["any_inversion_rate"] >= threshold:
                first = min(first, row["alpha"])
                break
    below = [a for a in alphas if a < first]
    if not math.isfinite(first) or not below:
        return []
    return np.linspace(max(below), first, points + 2)[1:-1].tolist()
