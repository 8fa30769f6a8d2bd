"""``advantage: puu | uecr`` -- UECR-GRPO's unified utility (PUU) and entropy-calibrated credit (ECR) as stages.

Inputs (computed by the trainer when a stage needs ``teacher``, on every process's rows, then gathered):
``batch.extras["teacher_logps"]`` / ``["teacher_entropy"]`` (frozen teacher, T = 1, float32) and
``["old_logps_t1"]`` (the old policy at raw T = 1). The task reward R_task is the weighted total of the
recipe's reward functions. Formulas live in trainer/algorithms/uecr.py; telemetry follows the paper's F.8/F.9
(prefix ``uecr/``).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.algorithms.uecr import (
    audit_metrics,
    ecr_terms,
    puu,
    separate_normalization,
    teacher_score,
    uecr_advantages,
)
from trainer.methods.uecr.inputs import TEACHER, teacher_gap
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.stages import StageResult, register_stage


def task_rewards(batch: RolloutBatch) -> torch.Tensor:
    """R_task per rollout; an unscorable rollout (NaN) takes its group's mean so it moves no statistic."""
    R = batch.groups(batch.R.double())
    mean = torch.nanmean(R, dim=1, keepdim=True).nan_to_num(0.0)
    return torch.where(torch.isnan(R), mean, R).reshape(-1)


def teacher_scores(batch: RolloutBatch) -> torch.Tensor:
    """R_T per rollout (N,) float64. A rollout without a loss token has no teacher evidence (its token mean would
    read 0, a fabricated score): it takes the mean R_T of its group's rollouts that have one, so it moves neither
    the group's R_T mean nor its range; a group with none gets 0 throughout (no teacher contrast)."""
    R_T = teacher_score(teacher_gap(batch), batch.mask).double()
    valid = batch.groups(batch.trainable)
    grouped = batch.groups(R_T)
    mean = torch.where(valid, grouped, 0.0).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp(min=1)
    return torch.where(valid, grouped, mean).reshape(-1)


def _masked_stats(prefix: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    values = x[mask.bool()].double()
    if values.numel() == 0:
        return {}
    # q on the values' device: torch.quantile refuses a CPU q with CUDA values (tests/gpu/test_gpu_devices.py)
    q = torch.quantile(values[:100_000], torch.tensor([0.1, 0.5, 0.9], dtype=values.dtype, device=values.device))
    return {f"{prefix}_mean": float(values.mean()), f"{prefix}_std": float(values.std(unbiased=False)),
            f"{prefix}_p10": float(q[0]), f"{prefix}_p50": float(q[1]), f"{prefix}_p90": float(q[2])}


def utility(batch: RolloutBatch, args: Any) -> dict[str, Any]:
    """PUU's decomposed group advantages (N,) and the telemetry they share with ECR."""
    delta = teacher_gap(batch)
    R_T = teacher_scores(batch)
    R_task = task_rewards(batch)
    combine = puu if args.uecr_normalization == "joint" else separate_normalization
    parts = combine(batch.groups(R_task), batch.groups(R_T.double()), alpha=args.uecr_alpha, eps=args.uecr_eps)
    flat = {k: v.reshape(-1) for k, v in parts.items()}
    empty = ~batch.trainable
    scored = R_T[~empty]  # telemetry over the rollouts that carry teacher evidence
    metrics = {
        **(
            {"teacher_reward_mean": float(scored.mean()), "teacher_reward_std": float(scored.std(unbiased=False))}
            if scored.numel()
            else {}
        ),
        "A_task_U_abs_mean": float(flat["A_task_U"].abs().mean()),
        "A_T_U_abs_mean": float(flat["A_T_U"].abs().mean()),
        "A_U_abs_mean": float(flat["A_U"].abs().mean()),
        "decomposition_error": _decomposition_error(parts, args) if args.uecr_normalization == "joint" else 0.0,
        "empty_completions": float(empty.sum()),
        "untrainable_groups": float(batch.groups(empty).all(dim=1).sum()),
        **_masked_stats("delta", delta, batch.mask),
        **_masked_stats("teacher_entropy", batch.extras["teacher_entropy"], batch.mask),
        **{
            k: float(v)
            for k, v in audit_metrics(batch.groups(R_task), parts["R_U"], batch.groups(R_T.double())).items()
        },
    }
    return {"delta": delta, **flat, "metrics": metrics}


def _decomposition_error(parts: dict[str, torch.Tensor], args: Any) -> float:
    """max |A_U - (A_task|U + alpha A_T|U)| with A_U recomputed directly from R_U (population std + eps): the
    parts are what the loss uses, the direct formula is what the paper defines (F.9 telemetry)."""
    R_U = parts["R_U"].double()
    direct = (R_U - R_U.mean(1, keepdim=True)) / (R_U.std(1, unbiased=False, keepdim=True) + args.uecr_eps)
    tied = R_U.amax(1, keepdim=True) == R_U.amin(1, keepdim=True)
    direct = torch.where(tied, torch.zeros_like(direct), direct)
    return float((direct - (parts["A_task_U"].double() + args.uecr_alpha * parts["A_T_U"].double())).abs().max())


@register_stage("advantage", "puu", needs=TEACHER, group_level=True, metric_prefix="uecr")
def puu_stage(batch: RolloutBatch, args: Any) -> StageResult:
    """PUU only (ECR off): the unified-utility advantage A_U broadcast over the response's tokens."""
    u = utility(batch, args)
    return StageResult(advantages=u["A_U"].to(batch.R.dtype), metrics=u["metrics"])


@register_stage("advantage", "uecr", needs=TEACHER, group_level=True, metric_prefix="uecr")
def uecr_stage(batch: RolloutBatch, args: Any) -> StageResult:
    """UECR-GRPO: A_hat = w * A_task|U + alpha * A_T|U per token, w from ECR (``uecr_*`` knobs)."""
    u = utility(batch, args)
    mask = batch.mask
    terms = ecr_terms(
        u["delta"],
        batch.extras["teacher_entropy"],
        mask,
        u["A_task_U"],
        tau_delta=args.uecr_tau_delta,
        tau_H=args.uecr_tau_h,
        rho=args.uecr_rho,
        use_entropy=args.uecr_use_entropy,
        use_projection=args.uecr_use_projection,
        signed_gap=args.uecr_signed_gap,
        direction=args.uecr_direction,
        confidence=args.uecr_confidence,
        projection_norm=args.uecr_projection_norm,
    )
    w = terms["w"]
    A = uecr_advantages(
        u["A_task_U"], u["A_T_U"], w, mask, alpha=args.uecr_alpha, weight_full=args.uecr_weight_full_advantage
    )
    valid = mask.bool()
    nonempty = valid.any(dim=1)
    mean_w = (w * mask).sum(1) / mask.sum(1).clamp(min=1)
    metrics = dict(u["metrics"])
    for name in ("c", "d", "q", "w"):
        metrics.update(_masked_stats(name, terms[name], mask))
    metrics["mu_c_mean"] = float(terms["mu_c"][nonempty].mean()) if nonempty.any() else 0.0
    metrics["budget_error"] = float((mean_w[nonempty] - 1).abs().max()) if nonempty.any() else 0.0
    metrics["w_min"] = float(w[valid].min()) if valid.any() else 1.0
    return StageResult(advantages=A.to(batch.R.dtype), metrics=metrics)
