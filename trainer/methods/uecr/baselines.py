"""The teacher-assisted baselines UECR-GRPO compares against (its Table 2: PG-OPD, the naive hybrid, Distilled RL,
ATOD), on the same T = 1 gap delta, masks and token-mean loss as UECR:

- ``advantage: pg_opd``   -- vanilla on-policy distillation: per-token advantage ``opd_coef * delta``;
- ``loss_variant: naive_hybrid`` -- GRPO's and PG-OPD's clipped surrogates computed separately and summed
  (coefficient 1 on both [reconstructed]); the reference KL enters once;
- ``advantage: distilled_rl`` -- positive GRPO advantages reweighted by clipped, geometrically normalised
  teacher/old ratios [reconstructed];
- ``advantage: atod``    -- the annealed OPD token advantage added to the normalised GRPO advantage, with the
  aligned response weighting [reconstructed].

The group-relative part of each is the configured ``grpo`` advantage (``advantage_std``, ``advantage_eps``,
``scale_rewards``); the UECR recipes set it to PUU's population std + 1e-6 so comparisons change one thing.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer import trl_contact
from trainer.algorithms.uecr import atod_advantages, atod_lambda, distilled_rl_advantages, pg_opd_advantages
from trainer.loss.call import LossCall
from trainer.loss.forward import policy_forward
from trainer.methods.surrogate import finish, ppo_token_loss, validate_surrogate_variant
from trainer.methods.uecr.inputs import TEACHER, teacher_gap
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.stages import StageResult, get_stage, register_stage

TEACHER_DELTA_KEY = "winnow_teacher_delta"  # per-row (B, T) delta the trainer puts in the batch for naive_hybrid


def _grpo(batch: RolloutBatch, args: Any) -> torch.Tensor:
    return get_stage("advantage", "grpo").fn(batch, args).advantages


@register_stage("advantage", "pg_opd", needs=TEACHER, metric_prefix="opd")
def pg_opd_stage(batch: RolloutBatch, args: Any) -> StageResult:
    """PG-OPD (Agarwal et al. 2024; reference §2.6): A_t = opd_coef * (log pi_T - log pi_old), no group statistic."""
    delta = teacher_gap(batch)
    A = pg_opd_advantages(delta, batch.mask, coef=args.opd_coef)
    valid = batch.mask.bool()
    return StageResult(
        advantages=A.to(batch.R.dtype), metrics={"delta_mean": float(delta[valid].mean()) if valid.any() else 0.0}
    )


@register_stage("advantage", "distilled_rl", needs=TEACHER, group_level=True, metric_prefix="distilled_rl")
def distilled_rl_stage(batch: RolloutBatch, args: Any) -> StageResult:
    """Distilled RL (reference §2.8, reconstructed): A > 0 rows get A * clipped, geometrically normalised ratio."""
    A = distilled_rl_advantages(_grpo(batch, args), teacher_gap(batch), batch.mask, kappa=args.distilled_rl_kappa)
    return StageResult(advantages=A.to(batch.R.dtype))


@register_stage("advantage", "atod", needs=TEACHER, group_level=True, metric_prefix="atod")
def atod_stage(batch: RolloutBatch, args: Any) -> StageResult:
    """ATOD aligned (reference §2.9, reconstructed): A_GRPO + lambda_OPD(k) * omega_i * delta, cosine-annealed."""
    total = args.atod_anneal_steps or int(batch.extras.get("max_steps", 0))
    lam = atod_lambda(int(batch.extras.get("global_step", 0)), total, args.atod_lambda_start, args.atod_lambda_end)
    out = atod_advantages(
        _grpo(batch, args),
        teacher_gap(batch),
        batch.extras["old_logps_t1"],
        batch.mask,
        lam,
        kappa_omega=args.atod_kappa_omega,
    )
    return StageResult(
        advantages=out["advantages"].to(batch.R.dtype),
        metrics={"lambda_opd": lam, "omega_mean": float(out["omega"].mean())},
    )


def teacher_delta_rows(batch: RolloutBatch, args: Any) -> dict[str, torch.Tensor]:
    """``loss_inputs`` hook of naive_hybrid: its OPD term needs delta in every micro-batch."""
    return {TEACHER_DELTA_KEY: teacher_gap(batch).float()}


@register_stage("loss_variant", "naive_hybrid", needs=TEACHER, metric_prefix="naive_hybrid",
                validate=validate_surrogate_variant, loss_inputs=teacher_delta_rows)
def naive_hybrid_loss(trainer: Any, model: Any, inputs: dict[str, Any], call: LossCall) -> torch.Tensor:
    """L = L_clip(A_GRPO) + L_clip(opd_coef * delta) (reference §2.7): two clipped surrogates on one forward."""
    if not trainer.model.training:
        return trl_contact.trl_loss(trainer, model, inputs)
    p = policy_forward(trainer, model, inputs, call.recorder)
    A_opd = inputs[TEACHER_DELTA_KEY] * trainer.args.opd_coef
    eps_low, eps_high = trainer.epsilon_low, trainer.epsilon_high
    per_token = ppo_token_loss(p, p.A, eps_low, eps_high) + ppo_token_loss(p, A_opd, eps_low, eps_high)
    return finish(trainer, p, per_token, inputs, call)
