"""Shared pieces of the loss variants that replace TRL's per-token surrogate (Clip-Cov, KL-Cov, the naive hybrid).

A loss variant computes its own per-token policy loss and hands the rest back to TRL's conventions:
``policy_forward`` is TRL's own log-prob pass; ``finish`` applies vLLM importance-sampling correction, TRL's
reference KL (``reference_kl``: k3, exactly once, times the importance ratio when ``use_bias_correction_kl``, as
TRL does), batch compaction's row scale, TRL's normaliser for ``loss_type`` (train mode, gradient accumulation
included), the static entropy bonus and an MoE model's router load-balancing loss, and logs TRL's ``entropy`` /
``kl`` / ``aux_loss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainer import trl_contact
from trainer.algorithms.losses import clipped_surrogate
from trainer.algorithms.normalisers import ROW_NORMALISED as ROW_NORMALISED_TYPES
from trainer.config.errors import ConfigError

# TRL loss types whose normaliser ``normalise`` reproduces (the others change the surrogate itself).
SUPPORTED_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
ROW_NORMALISED = ROW_NORMALISED_TYPES & set(SUPPORTED_LOSS_TYPES)  # compaction's winnow_loss_scale applies to these
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


@dataclass
class PolicyPass:
    """One micro-batch through the policy: per-token log-probs (with grad), entropies, loss mask, per-token
    advantages, old log-probs (TRL's, or the detached current ones on-policy), and the MoE router's
    load-balancing loss (None unless TRL's ``aux_loss_enabled``)."""

    logp: torch.Tensor
    entropies: torch.Tensor
    mask: torch.Tensor
    A: torch.Tensor
    old: torch.Tensor
    aux_loss: torch.Tensor | None = None


# The multimodal inputs TRL's _compute_loss forwards to _get_per_token_logps_and_entropies (TRL 1.16).
MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def policy_forward(trainer: Any, model: Any, inputs: dict[str, Any]) -> PolicyPass:
    """TRL's forward for one micro-batch (same helper, same alignment as TRL's own loss)."""
    prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    logp, entropies, aux_loss = trl_contact.per_token_logps_and_entropies(
        trainer,
        model,
        torch.cat([prompt_ids, completion_ids], dim=1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
        completion_ids.size(1),
        compute_entropy=True,
        compute_aux_loss=trainer.aux_loss_enabled,
        **{key: inputs.get(key) for key in MULTIMODAL_KEYS},
    )
    A = inputs["advantages"]
    A = (A.unsqueeze(1) if A.dim() == 1 else A).expand_as(logp)
    old = inputs.get("old_per_token_logps")
    return PolicyPass(logp, entropies, mask, A, logp.detach() if old is None else old, aux_loss)


def ppo_token_loss(p: PolicyPass, A: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """PPO's clipped surrogate per token, ``-min(r A, clip(r) A)`` as TRL writes it, r = exp(logp - old)
    (trainer/algorithms/losses.py :func:`clipped_surrogate`)."""
    return clipped_surrogate(torch.exp(p.logp - p.old), A, eps_low, eps_high)


def normalise(trainer: Any, per_token_loss: torch.Tensor, mask: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
    """TRL's aggregation of a per-token loss for ``loss_type`` (train mode), including gradient accumulation."""
    if trainer.loss_type not in SUPPORTED_LOSS_TYPES:
        raise ValueError(f"loss_variant {trainer.args.loss_variant!r} supports loss_type {SUPPORTED_LOSS_TYPES}, "
                         f"not {trainer.loss_type!r}")
    return trl_contact.trl_normalise(trainer, per_token_loss, mask, inputs, training=True)


def finish(trainer: Any, p: PolicyPass, per_token_loss: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
    """The micro-batch loss from a per-token policy loss, with TRL's corrections, KL, normaliser, bonus, aux loss."""
    args = trainer.args
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction:
        per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
    if trainer.beta != 0.0:
        per_token_kl = reference_kl(trainer, p, inputs)
        per_token_loss = per_token_loss + trainer.beta * per_token_kl
        trl_contact.metrics(trainer)["kl"].append(global_mean(trainer, per_token_kl, p.mask))
    scale = inputs.get("winnow_loss_scale")
    if scale is not None and trainer.loss_type in ROW_NORMALISED:
        per_token_loss = per_token_loss * scale  # dropped rollouts out of the row count (see compaction.py)
    loss = normalise(trainer, per_token_loss, p.mask, inputs)
    entropy_coef = getattr(trainer, "entropy_coef", args.entropy_coef)
    if entropy_coef:
        bonus = (
            (p.entropies * p.mask).sum() / p.mask.sum().clamp(min=1.0) / trainer.current_gradient_accumulation_steps
        )
        loss = loss - entropy_coef * bonus
    if trainer.aux_loss_enabled:  # MoE load balancing, as TRL adds it (scaled for gradient accumulation only)
        loss = loss + trainer.router_aux_loss_coef * p.aux_loss / trainer.current_gradient_accumulation_steps
        trl_contact.metrics(trainer)["aux_loss"].append(trainer.accelerator.gather_for_metrics(p.aux_loss).mean().item())
    trl_contact.metrics(trainer)["entropy"].append(global_mean(trainer, p.entropies, p.mask))
    return loss


def reference_kl(trainer: Any, p: PolicyPass, inputs: dict[str, Any]) -> torch.Tensor:
    """TRL 1.16's per-token reference KL, exactly as ``GRPOTrainer._compute_loss`` writes it: the k3 estimator
    ``exp(ref - logp) - (ref - logp) - 1``, multiplied by the (differentiable, unclipped) importance ratio
    ``exp(logp - old)`` when ``use_bias_correction_kl`` (TRL's default; the ratio changes the gradient even
    on-policy, where its value is 1). ``use_bias_correction_kl: false`` is verl's ``low_var_kl`` (no ratio,
    also clamped to [-10, 10] there; the clamp is not reproduced)."""
    return trl_contact.trl_reference_kl(p.logp, p.old, inputs["ref_per_token_logps"],
                                        trainer.args.use_bias_correction_kl)


def global_mean(trainer: Any, x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``x`` over the valid tokens of every process (one all-reduce)."""
    totals = trainer.accelerator.reduce(torch.stack([(x.detach() * mask).sum(), mask.sum().float()]), reduction="sum")
    return float(totals[0] / totals[1].clamp(min=1.0))
