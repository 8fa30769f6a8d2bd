"""GRPODropout: rollout deletion by entropy contribution, then probability-weighted recentering.

Paper: "GRPODropout: Less is More for Online Reinforcement Learning Rollouts", section 3 (eqs. 2-9)
and Appendix B.1. Pure tensor functions (no TRL / accelerate imports). Group tensors are (P, G): P
prompt groups of G rollouts (``grpo.group_view`` of the flat batch). Symbols follow the paper:
``A`` advantages A^(g), ``s`` surprisals s_g, ``h`` entropy contributions h_g, ``keep`` the
indicator of I_keep.

``valid`` (P, G) bool marks rollouts with at least one loss token. A rollout without one (a truncated
rollout under ``mask_truncated_completions``, an episode with no model token) has no surprisal -- its
s = 0 would be "probability 1" -- and is never trained, so it is no deletion candidate (h = 0, always
kept), and s_bar, the tolerance and the recentering weights are taken over the valid rollouts only. Its
advantage, from TRL's group statistics that include its reward, is recentered like the others'.

Sums that decide a sign are taken in float64 whatever the input dtype. The test "sum_{g in I} h_g >= 0"
(eq. 4) is evaluated as ``sum_I h >= -tol`` with the tolerance of :func:`sum_tolerance`:
``tol = rtol * (1/G) * sum_g |A_g| (|s_g| + |s_bar|)``, an upper bound on |h_g| summed over the group,
and ``rtol = 8 * eps(input dtype)`` (about 1e-6 for fp32). A sum that is zero up to the rounding of
the inputs therefore keeps everything, and an exactly zero group (all A = 0 or all s equal) has
``tol = 0`` and ``sum h = 0`` exactly.
"""

from __future__ import annotations

import math
import random
from typing import Literal, get_args

import torch

# The options of WinnowConfig's dropout_* fields (their types): the one list of each; the tuples are derived.
SurprisalBasis = Literal["mean", "sum"]
DeleteKind = Literal["positive", "negative", "both"]
RecenterMode = Literal["prob_weighted", "mean", "none"]
Selector = Literal["paper", "balanced_push", "balanced_push_neg"]  # methods/grpodropout/stage.py picks the rule
ZeroPushGroups = Literal["keep_all", "random_min_keep"]
SURPRISAL_BASES: tuple[str, ...] = get_args(SurprisalBasis)
DELETE_KINDS: tuple[str, ...] = get_args(DeleteKind)
RECENTER_MODES: tuple[str, ...] = get_args(RecenterMode)


def _as64(advantages: torch.Tensor, surprisal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if advantages.dim() != 2 or advantages.shape != surprisal.shape:
        shapes = f"advantages {tuple(advantages.shape)} and surprisal {tuple(surprisal.shape)}"
        raise ValueError(f"{shapes} must both be (P, G)")
    return advantages.to(torch.float64), surprisal.to(torch.float64)


def _inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """rank[p, order[p, j]] = j: position of each rollout in a per-group ordering."""
    ranks = torch.arange(order.shape[1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, ranks)


def sequence_surprisal(per_token_logps: torch.Tensor, mask: torch.Tensor, basis: str = "mean") -> torch.Tensor:
    """Surprisal of each sampled sequence under the old policy (section 3.1; length-normalised in practice, 3.2).

    ``basis="mean"``: s = -(1/T) sum_t mask_t log pi_old(y_t | x, y_<t) with T the number of unmasked
    tokens (the paper's practice); ``"sum"``: s = -sum_t mask_t log pi_old (no length normalisation).
    Masked positions are ignored even if they hold NaN/-inf; a fully masked row gets s = 0.

    Args:
        per_token_logps: (N, T) old-policy log-probabilities of the sampled tokens.
        mask: (N, T) bool / 0-1 completion mask.
    Returns:
        (N,) surprisal, accumulated in float64 and returned in at least float32.
    """
    if basis not in SURPRISAL_BASES:
        raise ValueError(f"basis must be one of {SURPRISAL_BASES}, got {basis!r}")
    m = mask.bool()
    total = torch.where(m, per_token_logps.to(torch.float64), 0.0).sum(dim=1)
    if basis == "mean":
        total = total / m.sum(dim=1).clamp(min=1)
    return (-total).to(torch.promote_types(per_token_logps.dtype, torch.float32))


def _valid(valid: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if valid is None:
        return torch.ones(like.shape, dtype=torch.bool, device=like.device)
    if valid.shape != like.shape:
        raise ValueError(f"valid {tuple(valid.shape)} must match advantages {tuple(like.shape)}")
    return valid.bool()


def surprisal_mean(surprisal: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """s_bar (P, 1) float64: the group mean of s over its valid rollouts (0 for a group with none)."""
    s = surprisal.to(torch.float64)
    v = _valid(valid, s)
    return torch.where(v, s, 0.0).sum(dim=1, keepdim=True) / v.sum(dim=1, keepdim=True).clamp(min=1)


def entropy_contributions(
    advantages: torch.Tensor, surprisal: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """First-order entropy contribution of each rollout, eq. (2) with H(pi_old) estimated by s_bar.

    ``h_g = A_g (s_g - s_bar) / G``, s_bar the mean over the original group (its valid rollouts);
    ``sum_g h_g`` is Cov_g(A_g, s_g) of eq. (3) when sum_g A_g = 0. h = 0 for a rollout that is not
    ``valid``. Returned as float64 (P, G).
    """
    A, s = _as64(advantages, surprisal)
    v = _valid(valid, A)
    return torch.where(v, A * (s - surprisal_mean(s, v)), 0.0) / s.shape[1]


def sum_tolerance(
    advantages: torch.Tensor, surprisal: torch.Tensor, rtol: float | None = None, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-group tolerance (P,) float64 for the sign test ``sum_I h >= 0`` (see the module docstring).

    ``tol = rtol * (1/G) * sum_g |A_g| (|s_g| + |s_bar|)``; ``rtol`` defaults to 8 machine epsilons of
    the inputs' promoted dtype, so it tracks how precisely A and s were given (fp32: ~9.5e-7). Sums over
    the ``valid`` rollouts.
    """
    if rtol is None:
        rtol = 8 * torch.finfo(torch.promote_types(advantages.dtype, surprisal.dtype)).eps
    A, s = _as64(advantages, surprisal)
    v = _valid(valid, A)
    scale = torch.where(v, A.abs() * (s.abs() + surprisal_mean(s, v).abs()), 0.0).sum(dim=1) / s.shape[1]
    return rtol * scale


def restore_removed(advantages: torch.Tensor, keep: torch.Tensor, delete: str = "positive") -> torch.Tensor:
    """Restoration step (eq. 7 for ``"positive"``): which removed rollouts come back.

    ``"positive"`` (paper): only positive-advantage rollouts may stay deleted, so every A <= 0 returns;
    ``"negative"``: every A >= 0 returns; ``"both"``: nothing returns. Returns the new (P, G) bool keep.
    """
    if delete not in DELETE_KINDS:
        raise ValueError(f"delete must be one of {DELETE_KINDS}, got {delete!r}")
    keep = keep.bool()
    if delete == "positive":
        return keep | (advantages <= 0)
    if delete == "negative":
        return keep | (advantages >= 0)
    return keep.clone()


def select_rollouts(
    advantages: torch.Tensor,
    surprisal: torch.Tensor,
    delete: str = "positive",
    rtol: float | None = None,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Retained set I_keep of each group: eq. (4) solved greedily, then eq. (7).

    Start from I = all G rollouts; while ``sum_{g in I} h_g < 0`` (i.e. < -tol, :func:`sum_tolerance`)
    remove the rollout with the most negative h_g, ties to the lowest index. Removing the k most
    negative h_g minimises the removed sum over all k-subsets, so the first feasible k gives the
    maximum-cardinality I of eq. (4) (and, among those, the largest sum_I h). Only h_g < 0 rollouts
    are ever removed, so zero-contribution rollouts (A = 0, or s_g = s_bar) always stay. Then removed
    rollouts are restored per ``delete`` (:func:`restore_removed`). Rollouts that are not ``valid`` have
    h = 0 and are always kept.

    Args:
        advantages, surprisal: (P, G) float tensors; valid: (P, G) bool or None (all valid).
    Returns:
        (P, G) bool keep mask.
    """
    if delete not in DELETE_KINDS:
        raise ValueError(f"delete must be one of {DELETE_KINDS}, got {delete!r}")
    h = entropy_contributions(advantages, surprisal, valid)
    tol = sum_tolerance(advantages, surprisal, rtol, valid)
    order = torch.sort(h, dim=1, stable=True).indices  # ascending h, ties in index order
    h_sorted = h.gather(1, order)
    # kept_sum[:, k] = sum of h over I after removing the k first (most negative); kept_sum[:, G] = 0.
    tail = torch.flip(torch.cumsum(torch.flip(h_sorted, dims=[1]), dim=1), dims=[1])
    kept_sum = torch.cat([tail, torch.zeros_like(tail[:, :1])], dim=1)
    k = (kept_sum >= -tol.unsqueeze(1)).to(torch.int8).argmax(dim=1)  # first feasible k
    keep = _inverse_permutation(order) >= k.unsqueeze(1)
    return restore_removed(advantages, keep, delete)


def min_keep_count(G: int) -> int:
    """The released selector's floor on the rollouts a group keeps, ``min_select_count = max(1, G // 4)``
    (hexuandeng/GRPODropout@4ad3b3b:verl/examples/grpo_dropout/selector_methods.py, select_balanced_push_zero)."""
    return max(1, G // 4)


def all_zero_push_groups(
    advantages: torch.Tensor, surprisal: torch.Tensor, eps: float = 1e-12, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """(P,) bool: groups whose every valid push ``A_g (s_g - s_bar)`` is within ``eps`` of 0 (every group whose
    rewards are all equal, since GRPO gives it A = 0) -- the released selector's degenerate case."""
    A, s = _as64(advantages, surprisal)
    v = _valid(valid, A)
    push = torch.where(v, A * (s - surprisal_mean(s, v)), 0.0)
    return (push.abs() <= eps).all(dim=1)


def seeded_subset(candidates: torch.Tensor, count: int, keys: list[str]) -> torch.Tensor:
    """Per group, ``count`` of its ``candidates`` ((P, G) bool) drawn without replacement by ``random.Random(key)``.

    The released selector keeps such a random subset of an all-zero-push group, seeded by a fresh uuid per step
    (so no run repeats it); here each group's key is built by the caller from the run seed and the group's own
    tokens, so the draw is the same on every process, after a resume and in a rerun. Returns (P, G) bool."""
    out = torch.zeros_like(candidates, dtype=torch.bool)
    for p, key in enumerate(keys):
        pool = candidates[p].nonzero().squeeze(1).tolist()
        for g in random.Random(key).sample(pool, min(count, len(pool))):
            out[p, g] = True
    return out


def balanced_push_select(
    advantages: torch.Tensor,
    surprisal: torch.Tensor,
    eps: float = 1e-12,
    min_keep: int | None = None,
    valid: torch.Tensor | None = None,
    all_zero_keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """The released code's selector (``balanced_push_zero``), deterministic and without its fallbacks' flaws.

    ``push_g = A_g (s_g - s_bar) = G h_g``; classes: positive (push > eps), negative (push < -eps),
    zero (|push| <= eps). Keep every positive push; then add negative pushes from the one closest to
    zero downwards (ties: lowest index) while the running kept sum stays **strictly** > eps, stopping
    at the first that would not. Zero pushes are excluded, used only as backfill (in index order) up to
    ``m = min_keep`` (default max(1, G // 4)); groups with no positive push are then topped up with the
    least negative pushes up to m. In a group with positive pushes the count can stay below m (the
    reference never adds more negatives there).

    Groups whose pushes are all zero (every all-zero-advantage group, and groups with equal s) keep
    **all** G rollouts by default: this is the paper's rule (sum h = 0 >= 0), and when A != 0 with equal s a
    subset would discard real gradient signal. The reference keeps a random max(1, G // 4) instead; pass that
    draw as ``all_zero_keep`` ((P, G) bool, e.g. :func:`seeded_subset` of the zero pushes) to reproduce it: its
    rows are what such a group keeps (with a row-count normaliser or verl's mini-batch count, the number of
    zero-advantage rows kept changes the step, so the authors' structure needs their count).

    Rollouts that are not ``valid`` are in no class (never counted towards m, never backfill) and always kept;
    s_bar is over the valid ones.

    Returns:
        (P, G) bool keep mask. Compose with :func:`restore_removed` for the ``balance_neg``-style restoration.
    """
    A, s = _as64(advantages, surprisal)
    v = _valid(valid, A)
    G = A.shape[1]
    m = min(G, min_keep_count(G) if min_keep is None else int(min_keep))
    push = torch.where(v, A * (s - surprisal_mean(s, v)), 0.0)
    pos, neg = push > eps, push < -eps
    zero = ~(pos | neg) & v
    keep = pos.clone()
    total = torch.where(pos, push, 0.0).sum(dim=1, keepdim=True)
    # negatives first, closest to zero first (push descending), ties in index order
    order = torch.sort(torch.where(neg, -push, math.inf), dim=1, stable=True).indices
    rank = _inverse_permutation(order)
    neg_sorted = neg.gather(1, order)
    running = total + torch.where(neg_sorted, push.gather(1, order), 0.0).cumsum(dim=1)
    n_add = ((running > eps) & neg_sorted).sum(dim=1, keepdim=True)  # running sum decreases: a prefix
    keep |= neg & (rank < n_add)
    need = (m - keep.sum(dim=1, keepdim=True)).clamp(min=0)
    keep |= zero & (zero.cumsum(dim=1) <= need)  # zero pushes by index
    need = (m - keep.sum(dim=1, keepdim=True)).clamp(min=0)
    no_pos = ~pos.any(dim=1, keepdim=True)  # single sign, negatives only: none of them kept yet
    keep |= neg & no_pos & (rank < need)
    degenerate = (zero | ~v).all(dim=1, keepdim=True)
    if all_zero_keep is None:
        keep |= degenerate
    else:
        keep = torch.where(degenerate, all_zero_keep.bool() & v, keep)
    return keep | ~v


def restore_negative_push_negative_advantage(
    advantages: torch.Tensor, surprisal: torch.Tensor, keep: torch.Tensor, eps: float = 1e-12,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """The released ``balance_neg`` variant's restoration on top of :func:`balanced_push_select`: every removed
    rollout with a negative push (< -eps) and a negative advantage (A < -eps) comes back, so a wrong answer is never
    dropped (hexuandeng/GRPODropout@4ad3b3b:verl/examples/grpo_dropout/selector_methods.py,
    select_balanced_push_zero_add_negpush_negadv). ``A`` is the advantage before selection. Returns (P, G) bool."""
    A, s = _as64(advantages, surprisal)
    v = _valid(valid, A)
    push = torch.where(v, A * (s - surprisal_mean(s, v)), 0.0)
    return keep.bool() | ((push < -eps) & (A < -eps) & v)


def restandardize(
    rewards: torch.Tensor, keep: torch.Tensor, scale: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantages recomputed over each group's kept rollouts only (the authors' ``RECOMPUTE_ADV_AFTER_SELECT``:
    verl's ``compute_advantage`` run again on the selected rows, hexuandeng/GRPODropout@4ad3b3b:verl/verl/trainer/
    ppo/ray_trainer.py ``fit``, after ``batch.select_idxs(selected_indices)``).

    verl's ``compute_grpo_outcome_advantage``: per group, ``A = (R - mean) / (std + eps)`` over its kept rows with the
    unbiased std (``scale``; without it ``A = R - mean``), and a group with one kept row has mean 0 and std 1. NaN
    rewards (unscored) are left out of the statistics and get A = 0. ``rewards`` and ``keep`` are (P, G); returns
    (P, G) float64 with 0 outside ``keep``."""
    R = rewards.to(torch.float64)
    live = keep.bool() & ~torch.isnan(R)
    n = live.sum(dim=1, keepdim=True)
    Rz = torch.where(live, R, 0.0)
    mean = Rz.sum(dim=1, keepdim=True) / n.clamp(min=1)
    var = torch.where(live, (R - mean) ** 2, 0.0).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
    single = n == 1
    mean = torch.where(single, 0.0, mean)
    std = torch.where(single, 1.0, var.sqrt())
    A = (R - mean) / (std + eps) if scale else R - mean
    return torch.where(live, A, 0.0)


def _kept_weights(s: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:  # keep: the rows that carry weight
    """softmax(-s) over each group's kept rollouts (P, G) float64; 0 outside I and for empty I.

    Shifted by min_I s, so every exponent is <= 0 and the largest weight's is exactly 0: no overflow,
    and the denominator is >= 1 (no 0/0 when every e^{-s} underflows).
    """
    s_min = torch.where(keep, s, math.inf).amin(dim=1, keepdim=True)
    s_min = torch.where(torch.isfinite(s_min), s_min, 0.0)  # empty I
    e = torch.where(keep, torch.exp(s_min - s), 0.0)
    return e / e.sum(dim=1, keepdim=True).clamp(min=1.0)


def recenter(
    advantages: torch.Tensor,
    surprisal: torch.Tensor,
    keep: torch.Tensor,
    mode: str = "prob_weighted",
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Recentre the original advantages of the retained set, eq. (9) and the Table 2 ablations.

    ``"prob_weighted"``: ``b = sum_{g in I} e^{-s_g} A_g / sum_{g in I} e^{-s_g}``, computed as the
    softmax of -s over I (never raw exponentials, so s ~ 1e4 neither under- nor overflows);
    ``"mean"``: b = equal-weight mean of A over I; ``"none"``: b = 0. Output ``A_g - b`` for g in I and
    0 for removed rollouts (so groups with empty I are all zero). Same dtype as ``advantages``. The baseline
    b is over the kept ``valid`` rollouts (b = 0 when there is none); every kept rollout gets ``A - b``.
    """
    if mode not in RECENTER_MODES:
        raise ValueError(f"mode must be one of {RECENTER_MODES}, got {mode!r}")
    A, s = _as64(advantages, surprisal)
    keep = keep.bool()
    weighted = keep & _valid(valid, A)
    if mode == "prob_weighted":
        b = (_kept_weights(s, weighted) * A).sum(dim=1, keepdim=True)
    elif mode == "mean":
        b = torch.where(weighted, A, 0.0).sum(dim=1, keepdim=True) / weighted.sum(dim=1, keepdim=True).clamp(min=1)
    else:
        b = torch.zeros_like(A[:, :1])
    return torch.where(keep, A - b, 0.0).to(advantages.dtype)


def dropout_metrics(
    advantages: torch.Tensor,
    surprisal: torch.Tensor,
    keep: torch.Tensor,
    recentered: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> dict[str, float]:
    """Selection telemetry for one batch of (P, G) groups (python floats), over the ``valid`` rollouts
    (those with a loss token; every one when None).

    - ``retained_per_question``: mean kept count over groups with any non-zero advantage (Figure 2c);
      NaN when there is no such group -- aggregate across steps/ranks with ``retained_sum`` /
      ``nonzero_groups`` instead.
    - ``kept_ratio``: kept / valid rollouts.  ``groups_with_deletion``: groups with at least one removed
      rollout.  ``untrainable_groups``: groups with no valid rollout (nothing to select; kept as they are).
    - ``h_sum_before``: group mean of sum_g h_g (= Cov(A, s), eq. 3); ``h_sum_after``: group mean of
      sum_{g in I} h_g with the original s_bar (the eq. 4 constraint); ``h_sum_recentered``: the same
      with the recentered advantages (the entropy proxy of the update actually applied).
    - ``weighted_adv_mean_before``: group mean of E_{softmax(-s) over all G}[A]; ``..._after``: group mean
      over non-empty I of E_{softmax(-s) over I}[recentered] (~0 with prob-weighted recentering; NaN if
      every I is empty).
    """
    A, s = _as64(advantages, surprisal)
    v = _valid(valid, A)
    kept = keep.bool() & v
    R = recentered.to(torch.float64)
    G = A.shape[1]
    gap = torch.where(v, s - surprisal_mean(s, v), 0.0)
    h = A * gap / G
    counts = kept.sum(dim=1).to(torch.float64)
    nonzero = (v & (A != 0)).any(dim=1)
    nonempty = kept.any(dim=1)
    n_nonzero = int(nonzero.sum())
    retained_sum = float(counts[nonzero].sum())
    after = (_kept_weights(s, kept) * R).sum(dim=1)[nonempty]
    n_valid = int(v.sum())
    return {
        "retained_per_question": retained_sum / n_nonzero if n_nonzero else math.nan,
        "retained_sum": retained_sum,
        "nonzero_groups": float(n_nonzero),
        "kept_ratio": float(counts.sum() / n_valid) if n_valid else math.nan,
        "groups_with_deletion": float((v & ~keep.bool()).any(dim=1).sum()),
        "untrainable_groups": float((~v).all(dim=1).sum()),
        "h_sum_before": float(h.sum(dim=1).mean()),
        "h_sum_after": float(torch.where(kept, h, 0.0).sum(dim=1).mean()),
        "h_sum_recentered": float(torch.where(kept, R * gap / G, 0.0).sum(dim=1).mean()),
        "weighted_adv_mean_before": float((_kept_weights(s, v) * A).sum(dim=1).mean()),
        "weighted_adv_mean_after": float(after.mean()) if after.numel() else math.nan,
    }
