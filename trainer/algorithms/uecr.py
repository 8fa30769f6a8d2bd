"""UECR-GRPO (PUU + ECR) and the teacher-assisted baselines it is compared against, as pure tensor functions.

Paper: "When and Where to Trust the Teacher: Unifying On-Policy Distillation and GRPO through
Entropy-Calibrated Credit Assignment". Its displayed equations are lost, so the formulas follow
the paper's text; each one is tagged [paper] (stated there, section cited), [derived] (forced by the text) or
[reconstructed] (a design meeting every stated constraint; its form and constants stay configurable).
No TRL / accelerate imports.

Conventions shared by every function:

- Rows are ordered group by group (G consecutive rows per prompt, ``grpo.group_view``); group-level
  functions take (P, G) tensors, token-level ones (N, T) tensors.
- ``mask`` (N, T), bool or float, is read as a boolean: nonzero = actor (loss) token. Values of the
  other inputs at masked-out positions are never read (they may be garbage, -inf or NaN).
- Padding: delta 0, c 0, d 0, q 0, w 1, every advantage 0. A row with no valid token (an empty
  response) gets teacher score 0, mu_c 0, q 0, w 1 and advantage 0 -- never NaN.
- dtype: arithmetic is float64 internally; outputs take the promoted dtype of the floating inputs with a
  float32 floor (bf16/fp16/float32 -> float32, float64 stays float64). The trainer feeds float64 group
  quantities, so its PUU/ECR numbers are float64 end to end.
- Python floats (not tensors) are returned by the scalar functions (:func:`atod_lambda`,
  :func:`alpha_safety`, :func:`audit_metrics`).
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

import torch

# The options of WinnowConfig's uecr_direction / uecr_confidence / uecr_projection_norm (their types); the tuples
# are derived.
Direction = Literal["tanh", "clip"]
Confidence = Literal["exp", "inverse"]
ProjectionNorm = Literal["one_plus_mean", "max"]
DIRECTIONS: tuple[str, ...] = get_args(Direction)
CONFIDENCES: tuple[str, ...] = get_args(Confidence)
PROJECTION_NORMS: tuple[str, ...] = get_args(ProjectionNorm)


# ------------------------------------------------------------------------------------------- helpers


def _out_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        if t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _check_tokens(name: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    if mask.dim() != 2:
        raise ValueError(f"mask must be (N, T), got shape {tuple(mask.shape)}")
    if x.shape != mask.shape:
        raise ValueError(f"`{name}` {tuple(x.shape)} must match mask {tuple(mask.shape)}")


def _check_rows(name: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    if x.dim() != 1 or x.shape[0] != mask.shape[0]:
        raise ValueError(f"`{name}` must be (N,) with N = {mask.shape[0]}, got shape {tuple(x.shape)}")


def _check_groups(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"inputs must all be (P, G) of one shape, got {shapes}")


def _masked_row_mean(x64: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(1/L_i) sum_t m x per row in float64; 0 for a row with L_i = 0."""
    L = valid.sum(dim=1)
    total = torch.where(valid, x64, 0.0).sum(dim=1)
    return torch.where(L > 0, total / L.clamp(min=1), 0.0)


def _group_deviation(x64: torch.Tensor) -> torch.Tensor:
    """x - group mean over dim 1 of a (P, G) float64 tensor; exactly 0 in a group whose values are all equal
    (the mean of equal floats can be off by an ulp, and eps = 1e-6 in the denominator would amplify it)."""
    dev = x64 - x64.mean(dim=1, keepdim=True)
    constant = (x64.amax(dim=1, keepdim=True) == x64.amin(dim=1, keepdim=True))
    return torch.where(constant, 0.0, dev)


def _population_std(dev64: torch.Tensor) -> torch.Tensor:
    """Population std (ddof 0) over dim 1 from group deviations, (P, 1)."""
    return dev64.pow(2).mean(dim=1, keepdim=True).sqrt()


# ---------------------------------------------------------------------------- teacher signal


def token_gap(teacher_logps: torch.Tensor, old_logps_t1: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token gap delta_{i,t} = log pi_T(y_t | s_t) - log pi_old(y_t | s_t), both at raw T = 1 ([derived]).

    Args:
        teacher_logps, old_logps_t1: (N, T) realized-token log-probs of the frozen teacher and of the old
            policy, both at temperature 1 (the PPO-ratio log-probs at T_r = 0.7 are a different tensor).
        mask: (N, T) actor-token mask.
    Returns:
        (N, T) delta, 0 at padding.
    """
    _check_tokens("teacher_logps", teacher_logps, mask)
    _check_tokens("old_logps_t1", old_logps_t1, mask)
    valid = mask.bool()
    delta = teacher_logps.double() - old_logps_t1.double()
    return torch.where(valid, delta, 0.0).to(_out_dtype(teacher_logps, old_logps_t1))


def teacher_score(delta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Teacher score R^T_i = (1/L_i) sum_t m_{i,t} delta_{i,t}: the masked token *mean* ([paper]).

    The theory's path log-ratio (Lemma 1) is the token sum; the paper uses the mean to control reward-length
    correlation (§B). An empty row (L_i = 0) scores 0, never NaN.

    Returns:
        (N,) R^T.
    """
    _check_tokens("delta", delta, mask)
    return _masked_row_mean(delta.double(), mask.bool()).to(_out_dtype(delta))


# ------------------------------------------------------------------------------------------- PUU


def puu(
    task_rewards: torch.Tensor, teacher_scores: torch.Tensor, alpha: float = 1.0, eps: float = 1e-6
) -> dict[str, torch.Tensor]:
    """Path-Utility Unification: the unified utility normalised within each group, and its decomposition
    ([paper F.4 for the normalisation; decomposition derived]).

    R^U_i = R^task_i + alpha R^T_i (combined *before* normalisation); mu_U, sigma_U = group mean and
    population std (ddof 0) of R^U; and, sharing U's denominator,

        A^{task|U}_i = (R^task_i - mean R^task) / (sigma_U + eps)
        A^{T|U}_i    = (R^T_i    - mean R^T)    / (sigma_U + eps)
        A^U_i        = A^{task|U}_i + alpha A^{T|U}_i          (= (R^U_i - mu_U) / (sigma_U + eps) by linearity)

    A^U is *computed* as that sum (in float64 from the two parts as returned), so the decomposition error the
    paper logs, max |A^U - (A^{task|U} + alpha A^{T|U})|, is 0 for float64 outputs; it equals the direct
    formula up to rounding. A group whose values of one quantity are all equal gets exactly 0 deviation for it
    (so a verifier-tied group has A^{task|U} = 0 exactly, which ECR's sign(0) = 0 relies on).

    Args:
        task_rewards: (P, G) verifier rewards R^task (the paper's are {0, 1}); finite.
        teacher_scores: (P, G) R^T from :func:`teacher_score`.
        alpha: teacher coefficient (paper: 1.0); eps: 1e-6 [paper F.4].
    Returns:
        ``{"A_U", "A_task_U", "A_T_U", "R_U"}``, each (P, G).
    """
    _check_groups(task_rewards=task_rewards, teacher_scores=teacher_scores)
    out = _out_dtype(task_rewards, teacher_scores)
    R_task, R_T = task_rewards.double(), teacher_scores.double()
    R_U = R_task + alpha * R_T
    den = _population_std(_group_deviation(R_U)) + eps
    A_task_U = (_group_deviation(R_task) / den).to(out)
    A_T_U = (_group_deviation(R_T) / den).to(out)
    A_U = (A_task_U.double() + alpha * A_T_U.double()).to(out)
    return {"A_U": A_U, "A_task_U": A_task_U, "A_T_U": A_T_U, "R_U": R_U.to(out)}


def separate_normalization(
    task_rewards: torch.Tensor, teacher_scores: torch.Tensor, alpha: float = 1.0, eps: float = 1e-6
) -> dict[str, torch.Tensor]:
    """Table 3's "Separate norm." ablation ([reconstructed]): each signal normalised by its own group
    population std, then summed.

        A^{task|U}_i = (R^task_i - mu_task) / (sigma_task + eps)
        A^{T|U}_i    = (R^T_i - mu_T) / (sigma_T + eps)
        A^U_i        = A^{task|U}_i + alpha A^{T|U}_i,     R^U_i = R^task_i + alpha R^T_i (telemetry only)

    Same keys, shapes, dtype rule and exact-decomposition property as :func:`puu`, so it drops in for it.
    """
    _check_groups(task_rewards=task_rewards, teacher_scores=teacher_scores)
    out = _out_dtype(task_rewards, teacher_scores)
    R_task, R_T = task_rewards.double(), teacher_scores.double()
    dev_task, dev_T = _group_deviation(R_task), _group_deviation(R_T)
    A_task_U = (dev_task / (_population_std(dev_task) + eps)).to(out)
    A_T_U = (dev_T / (_population_std(dev_T) + eps)).to(out)
    A_U = (A_task_U.double() + alpha * A_T_U.double()).to(out)
    return {"A_U": A_U, "A_task_U": A_task_U, "A_T_U": A_T_U, "R_U": (R_task + alpha * R_T).to(out)}


# ------------------------------------------------------------------------------------- ECR


def ecr_terms(
    delta: torch.Tensor,
    teacher_entropy: torch.Tensor,
    mask: torch.Tensor,
    A_task_U: torch.Tensor,
    *,
    tau_delta: float = 1.0,
    tau_H: float = 2.0,
    rho: float = 0.5,
    use_entropy: bool = True,
    use_projection: bool = True,
    signed_gap: bool = True,
    direction: str = "tanh",
    confidence: str = "exp",
    projection_norm: str = "one_plus_mean",
) -> dict[str, torch.Tensor]:
    """Entropy-Calibrated Redistribution: every intermediate of the token weights w ([reconstructed];
    constraints C1-C10 of [paper §4.2, Table 1, F.5]).

    - sign: s_i = sign(A^{task|U}_i), sign(0) = 0 -- a verifier-tied row gets q = 0, w = 1.
    - direction: d = s tanh(delta / tau_delta) (``direction="clip"``: s clip(delta / tau_delta, -1, 1)).
      ``signed_gap=False`` (ablation 6, F.7, [reconstructed]): d = s c -- confidence alone gives the direction.
    - confidence: c = exp(-H^T / tau_H) (``confidence="inverse"``: 1 / (1 + H^T / tau_H)), in (0, 1];
      ``use_entropy=False`` (ablation 2): c = 1 with the projection kept. H^T is clamped at >= 0 (a rounding
      -1e-7 must not push c above 1).
    - projection: mu^c_i = sum_t m c d / sum_t m c (0 when the denominator is 0: empty row or all c = 0);
      ``use_projection=False`` (ablation 3): mu^c = 0, so q = c d, the raw proposal.
      q = c (d - mu^c) / (1 + |mu^c|) (``projection_norm="max"``: divided by max(1, max_t |c (d - mu^c)|)
      over the row's valid tokens instead).
    - weights: w = 1 + rho q.

    Guarantees (tested): C1 sum_t m q = 0 per non-empty row up to rounding (so mean_t w = 1) while the
    projection is on; C2 |q| <= 1 (and |q| <= c for the default normaliser, <= 2c for "max"), hence w > 0 for
    rho < 1, also in floating point (rounding is monotone, so |d - mu^c| never exceeds 1 + |mu^c|); C3 rho = 0
    gives w = 1 exactly; C4 c -> 0 gives q -> 0 (c = 0 gives w = 1 exactly);
    C6 c only scales; C9 everything is recomputed from the given H^T (a shuffle control just passes a permuted
    H^T).

    Args:
        delta, teacher_entropy: (N, T) token gap and full-vocabulary teacher entropy (T = 1, fp32 or better).
        mask: (N, T); A_task_U: (N,) the task part of PUU, only its sign is used.
        rho: must lie in [0, 1); tau_delta, tau_H: > 0.
    Returns:
        ``{"d", "c", "q", "w"}`` (N, T) (d = c = q = 0 and w = 1 at padding) and ``"mu_c"`` (N,), in the
        promoted dtype of delta, teacher_entropy and A_task_U (float32 floor).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if confidence not in CONFIDENCES:
        raise ValueError(f"confidence must be one of {CONFIDENCES}, got {confidence!r}")
    if projection_norm not in PROJECTION_NORMS:
        raise ValueError(f"projection_norm must be one of {PROJECTION_NORMS}, got {projection_norm!r}")
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must be in [0, 1) (C2: w > 0), got {rho!r}")
    if not (tau_delta > 0 and tau_H > 0):
        raise ValueError(f"tau_delta and tau_H must be > 0, got {tau_delta!r}, {tau_H!r}")
    _check_tokens("delta", delta, mask)
    _check_tokens("teacher_entropy", teacher_entropy, mask)
    _check_rows("A_task_U", A_task_U, mask)
    out = _out_dtype(delta, teacher_entropy, A_task_U)
    valid = mask.bool()
    zero = torch.zeros((), dtype=torch.float64, device=delta.device)

    if use_entropy:
        H = torch.where(valid, teacher_entropy.double(), 0.0).clamp(min=0.0)
        c = torch.exp(-H / tau_H) if confidence == "exp" else 1.0 / (1.0 + H / tau_H)
    else:
        c = torch.ones_like(delta, dtype=torch.float64)
    c = torch.where(valid, c, zero)

    s = torch.sign(A_task_U.double()).unsqueeze(1)
    if signed_gap:
        x = torch.where(valid, delta.double(), 0.0) / tau_delta
        d = s * (torch.tanh(x) if direction == "tanh" else x.clamp(-1.0, 1.0))
    else:
        d = s * c
    d = torch.where(valid, d, zero)

    if use_projection:
        den = c.sum(dim=1)  # c is 0 at padding: sum_t m c
        mu_c = torch.where(den > 0, (c * d).sum(dim=1) / torch.where(den > 0, den, 1.0), 0.0)
    else:
        mu_c = torch.zeros(delta.shape[0], dtype=torch.float64, device=delta.device)

    centred = d - mu_c.unsqueeze(1)
    if projection_norm == "one_plus_mean":
        # c * ((d - mu) / (1 + |mu|)), in this order: the quotient is <= 1 in floating point too (monotone
        # rounding), so |q| <= c holds exactly, not just up to an ulp
        q = c * (centred / (1.0 + mu_c.abs()).unsqueeze(1))
    else:
        r = c * centred
        norm = (
            torch.where(valid, r.abs(), zero).amax(dim=1).clamp(min=1.0) if r.shape[1] > 0 else torch.ones_like(mu_c)
        )
        q = r / norm.unsqueeze(1)
    q = torch.where(valid, q, zero)
    w = 1.0 + rho * q  # q = 0 at padding -> w = 1 exactly
    return {"d": d.to(out), "c": c.to(out), "mu_c": mu_c.to(out), "q": q.to(out), "w": w.to(out)}


def ecr_weights(
    delta: torch.Tensor, teacher_entropy: torch.Tensor, mask: torch.Tensor, A_task_U: torch.Tensor, **options: Any
) -> torch.Tensor:
    """ECR token weights w (N, T) = ``ecr_terms(...)["w"]`` ([reconstructed]); 1 at padding. ``options``
    are :func:`ecr_terms`' keyword arguments."""
    return ecr_terms(delta, teacher_entropy, mask, A_task_U, **options)["w"]


def uecr_advantages(
    A_task_U: torch.Tensor,
    A_T_U: torch.Tensor,
    w: torch.Tensor,
    mask: torch.Tensor,
    alpha: float = 1.0,
    weight_full: bool = False,
) -> torch.Tensor:
    """UECR-GRPO actor advantage (the paper's §4.2.3 structure):
    A_hat_{i,t} = w_{i,t} A^{task|U}_i + alpha A^{T|U}_i -- ECR redistributes only the verifier-derived part;
    the teacher sequence component is not modulated (so A_hat may differ in sign from the task part, C8).

    ``weight_full=True`` is ablation 4 (F.7): A_hat = w (A^{task|U} + alpha A^{T|U}) = w A^U.
    ``alpha = 0`` with ECR kept is ablation 5. With w = 1 (rho = 0) the result equals :func:`puu`'s A^U
    broadcast bit for bit (same float64 operations on the same inputs), C3. Since mean_t w = 1, the token
    mean of A_hat over a row's valid tokens is A^U_i.

    Args:
        A_task_U, A_T_U: (N,); w: (N, T) from :func:`ecr_weights`; mask: (N, T).
    Returns:
        (N, T), 0 at padding.
    """
    _check_tokens("w", w, mask)
    _check_rows("A_task_U", A_task_U, mask)
    _check_rows("A_T_U", A_T_U, mask)
    a, b, w64 = A_task_U.double().unsqueeze(1), A_T_U.double().unsqueeze(1), w.double()
    A = w64 * (a + alpha * b) if weight_full else w64 * a + alpha * b
    return torch.where(mask.bool(), A, 0.0).to(_out_dtype(A_task_U, A_T_U, w))


# ------------------------------------------------------------------------------- baselines


def pg_opd_advantages(delta: torch.Tensor, mask: torch.Tensor, coef: float = 1.0) -> torch.Tensor:
    """Vanilla PG-OPD ([source: tinker-cookbook]): per-token advantage coef * delta_{i,t}, the
    negative single-sample reverse KL at sampling time; no discount, no group normalisation.

    Returns:
        (N, T), 0 at padding.
    """
    _check_tokens("delta", delta, mask)
    return torch.where(mask.bool(), coef * delta.double(), 0.0).to(_out_dtype(delta))


def distilled_rl_advantages(
    A: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor, kappa: float = 2.0
) -> torch.Tensor:
    """Distilled RL (Wang et al. 2026; [reconstructed]): positive GRPO advantages reweighted by a
    clipped, geometrically normalised teacher-to-old token ratio.

        rho~_{i,t} = clip(exp(delta_{i,t}), 1/kappa, kappa)        (computed as exp(clip(delta, -log k, log k)))
        w_{i,t}    = rho~_{i,t} / exp((1/L_i) sum_t m log rho~_{i,t})   -- geometric mean 1, prod_t w = 1
        A_{i,t}    = A_i w_{i,t} if A_i > 0 else A_i                  (A = 0 stays 0)

    Args:
        A: (N,) normalised GRPO advantage; delta, mask: (N, T); kappa >= 1 (kappa = 1: plain GRPO).
    Returns:
        (N, T), 0 at padding.
    """
    if not kappa >= 1.0:
        raise ValueError(f"kappa must be >= 1, got {kappa!r}")
    _check_tokens("delta", delta, mask)
    _check_rows("A", A, mask)
    valid = mask.bool()
    bound = math.log(kappa)
    log_rho = torch.where(valid, delta.double(), 0.0).clamp(-bound, bound)
    log_w = log_rho - _masked_row_mean(log_rho, valid).unsqueeze(1)
    A64 = A.double().unsqueeze(1)
    out = torch.where(A64 > 0, A64 * torch.exp(log_w), A64)
    return torch.where(valid, out, 0.0).to(_out_dtype(A, delta))


def atod_lambda(step: int, total_steps: int, lambda_start: float = 1.0, lambda_end: float = 0.1) -> float:
    """ATOD's OPD coefficient, cosine-annealed ([reconstructed]):

        lambda_OPD(k) = lambda_end + (lambda_start - lambda_end) * (1 + cos(pi * min(k / K, 1))) / 2

    ``step <= 0`` gives exactly lambda_start and ``step >= total_steps`` exactly lambda_end. Decision:
    ``total_steps <= 0`` (no horizon known) gives lambda_end -- the limit K -> 0+ of the schedule, i.e. an
    anneal that is already over -- rather than dividing by zero.
    """
    if total_steps <= 0:
        return float(lambda_end)
    progress = min(max(step, 0) / total_steps, 1.0)
    if progress == 0.0:
        return float(lambda_start)
    if progress == 1.0:
        return float(lambda_end)
    return float(lambda_end + (lambda_start - lambda_end) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _standardise_rows(x64: torch.Tensor, rows: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / (population std + eps) over the selected rows; 0 elsewhere, and 0 for every row when fewer
    than 2 rows are selected or their values are all equal."""
    n = int(rows.sum())
    if n < 2:
        return torch.zeros_like(x64)
    sel = x64[rows]
    if bool(sel.amax() == sel.amin()):
        return torch.zeros_like(x64)
    dev = x64 - sel.mean()
    z = dev / (dev[rows].pow(2).mean().sqrt() + eps)
    return torch.where(rows, z, 0.0)


def atod_advantages(
    A: torch.Tensor,
    delta: torch.Tensor,
    old_logps_t1: torch.Tensor,
    mask: torch.Tensor,
    lambda_opd: float,
    kappa_omega: float = 1.0,
    lambda_rl: float = 1.0,
    eps: float = 1e-6,
) -> dict[str, torch.Tensor]:
    """ATOD, single-response ("aligned") adaptation (Tan et al. 2026; [reconstructed]): an OPD token
    advantage added to the already normalised GRPO advantage, with T-DUR response weights.

        a_{i,t} = delta_{i,t};  D_i = (1/L_i) sum_t m |delta|;  U_i = (1/L_i) sum_t m (-log pi_old(y_t | s_t))
        z_i     = std(D)_i + std(U)_i   (each standardised over the batch's non-empty rows: population std,
                                         + eps; a batch with < 2 non-empty rows or zero spread gives 0)
        omega_i = 1 + kappa_omega * sigmoid(z_i)      in (1, 1 + kappa_omega)
        A_hat   = lambda_rl * A_i + lambda_opd * omega_i * a_{i,t}

    omega is not mean-preserving -- the property that distinguishes ATOD from ECR. Empty rows get z = 0
    (omega = 1 + kappa_omega / 2) and advantage 0. ``eps`` (1e-6, as PUU) is an addition to the listed API.

    Args:
        A: (N,) GRPO advantage; delta, old_logps_t1 (T = 1 old-policy log-probs), mask: (N, T);
        lambda_opd: from :func:`atod_lambda`.
    Returns:
        ``{"advantages": (N, T) (0 at padding), "omega": (N,)}``.
    """
    _check_tokens("delta", delta, mask)
    _check_tokens("old_logps_t1", old_logps_t1, mask)
    _check_rows("A", A, mask)
    valid = mask.bool()
    nonempty = valid.any(dim=1)
    delta64 = torch.where(valid, delta.double(), 0.0)
    D = _masked_row_mean(delta64.abs(), valid)
    U = _masked_row_mean(-torch.where(valid, old_logps_t1.double(), 0.0), valid)
    z = _standardise_rows(D, nonempty, eps) + _standardise_rows(U, nonempty, eps)
    omega = 1.0 + kappa_omega * torch.sigmoid(z)
    adv = lambda_rl * A.double().unsqueeze(1) + lambda_opd * omega.unsqueeze(1) * delta64
    out = _out_dtype(A, delta, old_logps_t1)
    return {"advantages": torch.where(valid, adv, 0.0).to(out), "omega": omega.to(out)}


# ----------------------------------------------------------------------------- audits


def alpha_safety(task_rewards: torch.Tensor, teacher_scores: torch.Tensor) -> float:
    """Offline alpha-safety threshold of one group ([derived from F.4]).

    Correct iff the task reward equals the group maximum and the group is mixed (max > min); every other
    response is incorrect. A pair (i correct, j incorrect) swaps order in R^U = R^task + alpha R^T iff
    alpha (R^T_j - R^T_i) > R^task_i - R^task_j, so

        alpha*_g = min over (i correct, j incorrect, R^T_j > R^T_i) of (R^task_i - R^task_j) / (R^T_j - R^T_i),

    which for {0, 1} rewards is the reference's 1 / (R^T_j - R^T_i). Inversion is strict: at alpha = alpha*_g
    the pair ties. +inf when no such pair exists (tied group, or the teacher never prefers an incorrect one).

    Args:
        task_rewards, teacher_scores: (G,) one group.
    """
    R = torch.as_tensor(task_rewards).double()
    S = torch.as_tensor(teacher_scores).double()
    if R.dim() != 1 or R.shape != S.shape:
        raise ValueError(f"one group of (G,) tensors expected, got {tuple(R.shape)} and {tuple(S.shape)}")
    if R.numel() == 0 or not bool(R.amax() > R.amin()):
        return math.inf
    correct = R == R.amax()
    gap = S.unsqueeze(0) - S.unsqueeze(1)  # gap[i, j] = R^T_j - R^T_i
    margin = R.unsqueeze(1) - R.unsqueeze(0)  # margin[i, j] = R^task_i - R^task_j
    pairs = correct.unsqueeze(1) & ~correct.unsqueeze(0) & (gap > 0)
    if not bool(pairs.any()):
        return math.inf
    return float((margin[pairs] / gap[pairs]).min())


def audit_metrics(
    task_rewards: torch.Tensor,
    R_U: torch.Tensor,
    teacher_scores: torch.Tensor,
    std_threshold: float = 0.1,
    range_threshold: float = 0.05,
) -> dict[str, float]:
    """PUU group-signal audit of one batch ("Audit statistics" [paper F.3]), python floats:

    - ``degenerate_frac``: groups whose task rewards are all equal (verifier-degenerate), over all groups;
    - ``unified_variation_frac``: groups with Std(R^U) > std_threshold (0.1 [paper]; population std), over all
      groups as in F.3;
    - ``teacher_range_frac``: groups with max R^T - min R^T > range_threshold (0.05 [paper]), over all groups;
    - ``degenerate_resolved_frac``: among verifier-degenerate groups, those with Std(R^U) > std_threshold
      (the unified utility resolves them); ``degenerate_teacher_range_frac``: among them, those over the
      teacher-range threshold (Fig. 1's "teacher scores distinguish ... degenerate groups"). Both are omitted
      when the batch has no degenerate group (a statistic over no group is left out rather than 0 or NaN).

    Args:
        task_rewards, R_U, teacher_scores: (P, G).
    """
    _check_groups(task_rewards=task_rewards, R_U=R_U, teacher_scores=teacher_scores)
    R, U, S = task_rewards.double(), R_U.double(), teacher_scores.double()
    P = R.shape[0]
    if P == 0:
        return {}
    degenerate = R.amax(dim=1) == R.amin(dim=1)
    unified = _population_std(_group_deviation(U)).squeeze(1) > std_threshold
    teacher_range = (S.amax(dim=1) - S.amin(dim=1)) > range_threshold
    out = {
        "degenerate_frac": float(degenerate.double().mean()),
        "unified_variation_frac": float(unified.double().mean()),
        "teacher_range_frac": float(teacher_range.double().mean()),
    }
    if bool(degenerate.any()):
        out["degenerate_resolved_frac"] = float(unified[degenerate].double().mean())
        out["degenerate_teacher_range_frac"] = float(teacher_range[degenerate].double().mean())
    return out
