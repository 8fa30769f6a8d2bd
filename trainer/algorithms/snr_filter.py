"""RAGEN-2 SNR-aware prompt-group filtering: per-group scores, group selection, loss scaling, telemetry.

Paper: "RAGEN-2" (arXiv:2604.06268), section 3.4; released-code semantics from
``ragen/trainer/rollout_filter.py`` (``RolloutFilter._select_top_groups``) as described in the RAGEN
reference notes, section 1 (which wins where they disagree with the paper). Pure tensor functions (no
TRL / accelerate imports). Group tensors are (P, G): P prompt groups of G rollouts
(``grpo.group_view`` of the flat batch); a selection is a (P,) bool mask over groups.

The signal of a prompt x is its within-prompt reward variance RV(x) = Var(R(Z; x) | X = x): the task
gradient norm is bounded by sqrt(RV(x)) (section 3.3), while the KL/entropy regularisers are not, so
low-RV groups mostly contribute input-agnostic drift. Top-p filtering keeps the highest-RV groups that
together carry a fraction rho of the batch's total RV (section 3.4):

    k* = min{k : sum_{j<=k} RV(x_sigma(j)) >= rho sum_i RV(x_i)},  S = {sigma(1), ..., sigma(k*)}.

Choices where the sources leave room:

- Unscorable rollouts (NaN reward: no reward function scored them) are left out of their group's
  statistics, as in ``grpo``: scores are nan-aware over the scored rollouts. A group with fewer than
  2 scored values has variance/std 0 (no within-group contrast, hence no signal); a group with none
  has score 0 under every metric. So G == 1 gives variance/std 0. A group whose scored values are all
  equal gets exactly 0 (not rounding residue), so the |score| <= 1e-10 zero test is reliable.
- Ties in every ordering go to the lower group index (stable sorts), so selection is deterministic;
  the released code's ``topk`` / unstable sort leaves them unspecified.
- Selection arithmetic is float64 whatever the input dtype, so the zero test and the min-p bounds see
  the exact score value (a float32 score of 1e-10 is 1.00000001e-10 > 1e-10: a candidate).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

# The options of WinnowConfig's snr_* fields (their types): the one list of each; the tuples are derived.
ScoreMetric = Literal[
    "reward_variance",
    "reward_std",
    "reward_sum",
    "reward_mean",
    "entropy",
    "entropy_variance",
    "entropy_std",
    "length",
]
Strategy = Literal["top_p", "top_k", "top_k_abs", "min_p"]
TopPMode = Literal["linear", "softmax"]
KeepMode = Literal["largest", "smallest"]
LossScaling = Literal["none", "linear", "sqrt"]
SCORE_METRICS: tuple[str, ...] = get_args(ScoreMetric)
STRATEGIES: tuple[str, ...] = get_args(Strategy)
TOP_P_MODES: tuple[str, ...] = get_args(TopPMode)
KEEP_MODES: tuple[str, ...] = get_args(KeepMode)
LOSS_SCALING: tuple[str, ...] = get_args(LossScaling)

ZERO_TOL = 1e-10  # |score| <= ZERO_TOL counts as a zero-signal group (released code's constant)

# metric -> (input it reads, statistic)
_METRIC_SPEC = {
    "reward_variance": ("rewards", "var"),
    "reward_std": ("rewards", "std"),
    "reward_sum": ("rewards", "sum"),
    "reward_mean": ("rewards", "mean"),
    "entropy": ("entropies", "mean"),
    "entropy_variance": ("entropies", "var"),
    "entropy_std": ("entropies", "std"),
    "length": ("lengths", "mean"),
}
_INPUT_DOC = {
    "entropies": "(P, G) per-rollout token-mean policy entropy",
    "lengths": "(P, G) per-rollout loss-token counts",
}


def _group_stat(x: torch.Tensor, stat: str) -> torch.Tensor:
    """Nan-aware statistic over dim 1 of a (P, G) tensor, in float64 (see the module docstring)."""
    x = x.to(torch.float64)
    scored = ~torch.isnan(x)
    n = scored.sum(dim=1)
    total = torch.where(scored, x, 0.0).sum(dim=1)
    if stat == "sum":
        return total
    mean = torch.where(n > 0, total / n.clamp(min=1), 0.0)
    if stat == "mean":
        return mean
    # Population variance: the paper's RV(x) = Var(R | X = x), estimated with ddof 0.
    dev = torch.where(scored, x - mean.unsqueeze(1), 0.0)
    var = (dev**2).sum(dim=1) / n.clamp(min=1)
    if stat == "std":  # unbiased (Bessel), what the released code computes as "reward_variance"
        var = var * n / (n - 1).clamp(min=1)
    # All-equal scored values give exactly 0: the mean of equal values can round (e.g. G = 3), and
    # the residue must not pass the zero-score test.
    hi = torch.where(scored, x, -math.inf).amax(dim=1)
    lo = torch.where(scored, x, math.inf).amin(dim=1)
    var = torch.where((n >= 2) & (hi > lo), var, 0.0)
    return var.sqrt() if stat == "std" else var


def group_scores(
    rewards: torch.Tensor,
    metric: str = "reward_variance",
    entropies: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-group filter score (section 3.4's RV(x) and the Table/ablation metrics of the released code).

    - ``reward_variance``: population variance of the group's rewards, the paper's RV(x).
    - ``reward_std``: unbiased std, which the released code computes under the name reward_variance.
    - ``reward_sum``, ``reward_mean``: sum / mean of the scored rewards.
    - ``entropy``: group mean of ``entropies``; ``entropy_variance``: their population variance;
      ``entropy_std``: their unbiased std (the released code's "entropy_variance").
    - ``length``: group mean of ``lengths`` (the released code selects on the mean).

    NaN values (in any input) are unscored and left out; see the module docstring for groups with
    fewer than 2 (variance/std) or 0 (all metrics) scored values.

    Args:
        rewards: (P, G) total reward per rollout; NaN = unscorable.
        entropies, lengths: (P, G), required by the entropy and length metrics.
    Returns:
        (P,) scores in the promoted dtype of the input used (at least float32), never NaN.
    """
    if metric not in _METRIC_SPEC:
        raise ValueError(f"metric must be one of {SCORE_METRICS}, got {metric!r}")
    name, stat = _METRIC_SPEC[metric]
    x = {"rewards": rewards, "entropies": entropies, "lengths": lengths}[name]
    if x is None:
        raise ValueError(f"metric {metric!r} needs `{name}` ({_INPUT_DOC[name]}), got None")
    if x.dim() != 2:
        raise ValueError(f"`{name}` must be (P, G), got shape {tuple(x.shape)}")
    if name != "rewards" and x.shape != rewards.shape:
        raise ValueError(f"`{name}` {tuple(x.shape)} must match rewards {tuple(rewards.shape)}")
    out_dtype = torch.promote_types(x.dtype, torch.float32)
    return _group_stat(x, stat).to(out_dtype)


def _check_selection_args(strategy: str, value: float, top_p_mode: str, keep: str, eps: float) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if top_p_mode not in TOP_P_MODES:
        raise ValueError(f"top_p_mode must be one of {TOP_P_MODES}, got {top_p_mode!r}")
    if keep not in KEEP_MODES:
        raise ValueError(f"keep must be one of {KEEP_MODES}, got {keep!r}")
    try:
        ok = math.isfinite(float(value)) and float(value) > 0 and math.isfinite(float(eps))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"value must be a finite number > 0 and eps finite, got value={value!r}, eps={eps!r}")
    if strategy == "top_p" and top_p_mode == "linear" and keep == "smallest":
        # The released code sorts ascending and still stops at the first score <= 0: with include_zero a
        # zero-score group stops it at once (nothing kept); without, the rule is defined but not built here.
        # Rejected for every value (even value >= 1, where it would keep all) as a config error.
        raise ValueError(
            "keep='smallest' with linear top_p is not implemented; use top_k, top_k_abs, min_p or "
            "top_p_mode='softmax'"
        )


def _linear_prefix(sorted_scores: list[float], value: float, eps: float) -> int:
    """Length of the kept prefix of the descending scores under linear top-p; 0 = keep nothing.

    threshold = rho * sum - eps; accumulate while the running total is below it, stopping at the first
    score <= 0; if the total never reaches the threshold nothing is kept. With eps >= 0 and rho < 1 a
    positive threshold is always reached (sum of positives >= sum > rho * sum - eps), so an empty
    result means threshold <= 0, i.e. sum <= eps / rho: the empty prefix already "reaches" it and
    nothing is kept (no signal; the released code returns the same). Only eps < 0 can make a positive
    threshold unreachable.
    """
    threshold = value * math.fsum(sorted_scores) - eps
    count, total = 0, 0.0
    for score in sorted_scores:
        if total >= threshold or score <= 0:
            break
        total += score
        count += 1
    return count if total >= threshold else 0


def select_groups(
    scores: torch.Tensor,
    strategy: str = "top_p",
    value: float = 0.9,
    top_p_mode: str = "linear",
    keep: str = "largest",
    include_zero: bool = False,
    eps: float = 0.01,
) -> torch.Tensor:
    """Which prompt groups to train on: section 3.4's top-p rule and its baselines (reference notes 1.3-1.4).

    Candidates are all groups, or with ``include_zero=False`` the groups with |score| > 1e-10 (removed
    even at value >= 1: DAPO-style zero-variance filtering). No candidate -> nothing kept. Then:

    - ``top_p``, value >= 1: every candidate.
    - ``top_p`` ``linear`` (keep="largest" only): the shortest prefix of the candidates sorted by
      descending score whose sum reaches ``rho * sum(scores) - eps`` (k* of section 3.4 with the
      released code's ``selection_eps``), accumulated only over positive scores; nothing if the
      threshold is not reached or is <= 0 (see :func:`_linear_prefix`).
    - ``top_p`` ``softmax``: p = softmax(score) (largest) or softmax(-score) (smallest) over the
      candidates; keep the shortest prefix of p sorted descending whose cumulative sum reaches
      ``value`` (``searchsorted(cumsum p, value) + 1``, capped). Always >= 1 group.
    - ``top_k``: the k = int(value * P) best candidates (paper: floor(rho N)); ``top_k_abs``:
      k = int(value); k clamped to [1, #candidates].
    - ``min_p``: largest keeps score >= value * max - 1e-10; smallest keeps
      score <= min / (value + 1e-10) + 1e-10 (max / min over the candidates).

    Orderings are stable (ties to the lower group index).

    Args:
        scores: (P,) float group scores (:func:`group_scores`), any device; must be finite.
        value: rho, the keep rate / k / min-p ratio; > 0.
        keep: ``"largest"`` (the method) or ``"smallest"`` (the keep-smallest ablation).
    Returns:
        (P,) bool mask on ``scores.device``.
    """
    _check_selection_args(strategy, value, top_p_mode, keep, eps)
    if scores.dim() != 1:
        raise ValueError(f"scores must be (P,), got shape {tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("scores must be finite (group_scores never returns NaN)")
    P = scores.shape[0]
    s = scores.detach().to(torch.float64)
    cand = torch.ones(P, dtype=torch.bool, device=s.device) if include_zero else s.abs() > ZERO_TOL
    ids = cand.nonzero().squeeze(1)  # candidate group indices, ascending
    c = s[ids]
    n = ids.numel()
    selected = torch.zeros(P, dtype=torch.bool, device=scores.device)
    if n == 0:
        return selected

    if strategy == "top_p" and value >= 1:
        chosen = ids
    elif strategy == "top_p" and top_p_mode == "linear":
        order = torch.sort(c, descending=True, stable=True).indices
        k = _linear_prefix(c[order].tolist(), float(value), float(eps))
        chosen = ids[order[:k]]
    elif strategy == "top_p":
        p = torch.softmax(c if keep == "largest" else -c, dim=0)
        p_sorted, order = torch.sort(p, descending=True, stable=True)
        k = int(torch.searchsorted(torch.cumsum(p_sorted, dim=0), float(value))) + 1
        chosen = ids[order[: min(k, n)]]
    elif strategy in ("top_k", "top_k_abs"):
        k = int(value * P) if strategy == "top_k" else int(value)
        k = max(1, min(k, n))
        order = torch.sort(c, descending=keep == "largest", stable=True).indices
        chosen = ids[order[:k]]
    elif keep == "largest":  # min_p
        chosen = ids[c >= value * c.max() - ZERO_TOL]
    else:
        chosen = ids[c <= c.min() / (value + ZERO_TOL) + ZERO_TOL]
    selected[chosen.to(scores.device)] = True
    return selected


def filter_loss_scale(kept_groups: int, total_groups: int, mode: str) -> float:
    """Factor on the advantages after filtering (released code's ``filter_loss_scaling``, notes 1.6.7).

    ``"none"`` -> 1; ``"linear"`` -> kept / total; ``"sqrt"`` -> sqrt(kept / total). The released code
    multiplies the advantages by it after the advantage computation, so a heavily filtered step moves
    the policy less than one that kept every group.
    """
    if mode not in LOSS_SCALING:
        raise ValueError(f"mode must be one of {LOSS_SCALING}, got {mode!r}")
    if total_groups <= 0 or not 0 <= kept_groups <= total_groups:
        raise ValueError(f"need 0 <= kept_groups <= total_groups, total_groups > 0; got {kept_groups}/{total_groups}")
    if mode == "none":
        return 1.0
    ratio = kept_groups / total_groups
    return ratio if mode == "linear" else math.sqrt(ratio)


def selection_metrics(scores: torch.Tensor, selected: torch.Tensor) -> dict[str, float]:
    """Filter telemetry for one batch (python floats; the released code's ``rollout/filter_*``, notes 1.5).

    ``kept_groups``, ``kept_ratio`` (kept / P), ``zero_score_groups`` (|score| <= 1e-10), ``empty``
    (1.0 when nothing is kept: the released trainer skips such a step); ``score_mean`` / ``score_max``
    over all groups and ``kept_score_mean`` / ``kept_score_max`` over kept groups. A statistic over no
    group is omitted rather than NaN (or the released code's 0, which reads as a real mean).
    """
    if scores.shape != selected.shape or scores.dim() != 1:
        raise ValueError(f"scores {tuple(scores.shape)} and selected {tuple(selected.shape)} must both be (P,)")
    s = scores.detach().to(torch.float64)
    sel = selected.bool()
    P, kept = s.numel(), int(sel.sum())
    out = {
        "kept_groups": float(kept),
        "kept_ratio": kept / P if P else 0.0,
        "zero_score_groups": float((s.abs() <= ZERO_TOL).sum()),
        "empty": float(kept == 0),
    }
    if P:
        out.update(score_mean=float(s.mean()), score_max=float(s.max()))
    if kept:
        out.update(kept_score_mean=float(s[sel].mean()), kept_score_max=float(s[sel].max()))
    return out
