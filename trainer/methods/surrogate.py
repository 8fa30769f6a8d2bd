"""Shared pieces of the loss variants that replace TRL's per-token surrogate (Clip-Cov, KL-Cov, the naive hybrid).

A loss variant computes its own per-token policy loss and hands the rest back to TRL's conventions:
``policy_forward`` is TRL's own log-prob pass; ``finish`` applies vLLM importance-sampling correction, TRL's
reference KL (``reference_kl``: k3, exactly once, times the importance ratio when ``use_bias_correction_kl``, as
TRL does), batch compaction's row scale, TRL's normaliser for ``loss_type`` (train mode, gradient accumulation
included), the static entropy bonus and an MoE model's router load-balancing loss, and logs TRL's ``entropy`` /
``kl`` / ``aux_loss``.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.algorithms.losses import clipped_surrogate
from trainer.algorithms.normalisers import ROW_NORMALISED as ROW_NORMALISED_TYPES
from trainer.config.errors import ConfigError
from trainer.loss.call import LossCall
from trainer.loss.forward import PolicyPass
from trainer.loss.trl_terms import token_mean_bonus, trl_normalise, trl_reference_kl, with_router_aux_loss

# TRL loss types whose normaliser ``normalise`` reproduces (the others change the surrogate itself).
SUPPORTED_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
ROW_NORMALISED = ROW_NORMALISED_TYPES & set(SUPPORTED_LOSS_TYPES)  # a MicroBatch's row_scale applies to these
# TRL features whose interaction with a replaced surrogate is undefined; rejected at config time.
UNSUPPORTED = {
    "top_entropy_quantile": (1.0, "Beyond-80/20 token masking is a separate baseline"),
    "off_policy_mask_threshold": (None, "off-policy sequence masking"),
    "importance_sampling_level": ("token", "sequence-level importance ratios"),
    "use_adaptive_entropy": (False, "the adaptive entropy controller"),
    "delta": (None, "two-sided (dual) clipping"),
}


def validate_surrogate_variant(args: Any) -> None:
    """``validate`` hook of the loss variants built on this module: a ``loss_type`` whose normaliser ``finish``
    reproduces, and none of the TRL features whose interaction with a replaced surrogate is undefined."""
    if args.loss_type not in SUPPORTED_LOSS_TYPES:
        raise ConfigError(
            "loss_type",
            f"{args.loss_type!r} changes the surrogate itself; loss_variant {args.loss_variant!r} keeps PPO's",
            f"use one of {list(SUPPORTED_LOSS_TYPES)} (the paper's token-mean is 'dapo')",
        )
    for name, (off, what) in UNSUPPORTED.items():
        if getattr(args, name) != off:
            raise ConfigError(
                name, f"{what} is not combined with loss_variant {args.loss_variant!r}", f"set {name}: {off}"
            )


def ppo_token_loss(p: PolicyPass, A: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """PPO's clipped surrogate per token, ``-min(r A, clip(r) A)`` as TRL writes it, r = exp(logp - old)
    (trainer/algorithms/losses.py :func:`clipped_surrogate`)."""
    return clipped_surrogate(torch.exp(p.logp - p.old), A, eps_low, eps_high)


def normalise(trainer: Any, per_token_loss: torch.Tensor, mask: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
    """TRL's aggregation of a per-token loss for ``loss_type`` (train mode), including gradient accumulation."""
    if trainer.loss_type not in SUPPORTED_LOSS_TYPES:
        raise ValueError(f"loss_variant {trainer.args.loss_variant!r} supports loss_type {SUPPORTED_LOSS_TYPES}, "
                         f"not {trainer.loss_type!r}")
    return trl_normalise(trainer, per_token_loss, mask, inputs, training=True)


def finish(trainer: Any, p: PolicyPass, per_token_loss: torch.Tensor, inputs: dict[str, Any],
           call: LossCall) -> torch.Tensor:
    """The micro-batch loss from a per-token policy loss, with TRL's corrections, KL, normaliser, bonus, aux loss;
    ``call`` brings the row scale and the bonus's weight and takes the logged metrics (trainer/loss/call.py)."""
    record = call.recorder
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction:
        per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
    if trainer.beta != 0.0:
        per_token_kl = reference_kl(trainer, p, inputs)
        per_token_loss = per_token_loss + trainer.beta * per_token_kl
        record.mean("kl", (per_token_kl.detach() * p.mask).sum(), p.mask.sum())
    if call.row_scale is not None and trainer.loss_type in ROW_NORMALISED:
        per_token_loss = per_token_loss * call.row_scale  # dropped rows out of the row count (pipeline/round.py)
    loss = normalise(trainer, per_token_loss, p.mask, inputs)
    accumulation = trainer.current_gradient_accumulation_steps
    if trainer.entropy_coef:
        bonus = token_mean_bonus(p.entropies, p.mask, accumulation)
        loss = loss - trainer.entropy_coef * call.entropy_weight * bonus
    loss = with_router_aux_loss(trainer, loss, p.aux_loss, accumulation, record)  # MoE load balancing, as TRL
    record.mean("entropy", (p.entropies.detach() * p.mask).sum(), p.mask.sum())
    return loss


def reference_kl(trainer: Any, p: PolicyPass, inputs: dict[str, Any]) -> torch.Tensor:
    """TRL 1.16's per-token reference KL, exactly as ``GRPOTrainer._compute_loss`` writes it: the k3 estimator
    ``exp(ref - logp) - (ref - logp) - 1``, multiplied by the (differentiable, unclipped) importance ratio
    ``exp(logp - old)`` when ``use_bias_correction_kl`` (TRL's default; the ratio changes the gradient even
    on-policy, where its value is 1). ``use_bias_correction_kl: false`` is verl's ``low_var_kl`` (no ratio,
    also clamped to [-10, 10] there; the clamp is not reproduced)."""
    ratio = torch.exp(p.logp - p.old) if trainer.args.use_bias_correction_kl else None
    return trl_reference_kl(p.logp, inputs["ref_per_token_logps"], ratio)
