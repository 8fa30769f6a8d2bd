"""The terms of TRL 1.16's GRPO loss that winnow's losses share, copied from ``GRPOTrainer._compute_loss``
(trl==1.16.0:trl/trainer/grpo_trainer.py:3020-3290) and kept in step with it (docs/trl-contacts.md): the loss type's
aggregation with gradient accumulation, the k3 reference KL, the entropy term and an MoE router's load-balancing
loss. They read only public trainer attributes; trainer/loss/trl_loss.py (TRL's loss with winnow's arguments), the
loss variants (trainer/methods/surrogate.py) and the PPO critic build on them.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.algorithms.normalisers import aggregate, normaliser


def trl_normalise(trainer: Any, per_token: torch.Tensor, mask: torch.Tensor, inputs: dict[str, Any],
                  training: bool = True) -> torch.Tensor:
    """TRL 1.16's aggregation of a per-token loss term for ``trainer.loss_type`` (the normaliser table,
    trainer/algorithms/normalisers.py), gradient accumulation included in training.

    Version note: TRL 1.16's ``dapo`` normaliser is the generation batch's token count (``num_items_in_batch``,
    clamped to >= 1) per process, scaled by ``gradient_accumulation_steps / steps_per_generation`` in training.
    Earlier TRL releases divided by the micro-batch's own token count, later ones by ``num_items_in_batch`` per
    process without the accumulation factor: the same ``loss_type`` gives a different loss scale across releases."""
    loss_type = trainer.loss_type
    accum = trainer.current_gradient_accumulation_steps if training else 1  # TRL: no accumulation in eval
    if normaliser(loss_type).divisor == "batch_tokens":  # token mean over the generation batch's tokens
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
        batch_tokens = normalizer * accum / trainer.args.steps_per_generation if training else normalizer
        return aggregate(per_token, mask, loss_type, max_completion_length=trainer.max_completion_length,
                         batch_tokens=batch_tokens)
    return aggregate(per_token, mask, loss_type, max_completion_length=trainer.max_completion_length) / accum


def trl_reference_kl(logp: torch.Tensor, ref: torch.Tensor, importance_weight: torch.Tensor | None) -> torch.Tensor:
    """TRL 1.16's per-token reference KL: the k3 estimator ``exp(ref - logp) - (ref - logp) - 1``, times the
    (differentiable, unclipped) importance weight when ``use_bias_correction_kl`` -- TRL's ``coef_1``: the token ratio
    ``exp(logp - old)``, or the sequence one at ``importance_sampling_level: sequence``; None: no correction."""
    per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
    if importance_weight is not None:
        per_token_kl = per_token_kl * importance_weight
    return per_token_kl


def token_mean_bonus(entropies: torch.Tensor, mask: torch.Tensor, accumulation: float) -> torch.Tensor:
    """TRL's entropy term: the token mean of ``entropies`` over ``mask``, scaled for gradient accumulation only."""
    return (entropies * mask).sum() / mask.sum().clamp(min=1.0) / accumulation


def with_router_aux_loss(trainer: Any, loss: torch.Tensor, aux_loss: torch.Tensor | None, accumulation: float,
                         record: Any) -> torch.Tensor:
    """``loss`` plus an MoE router's load-balancing loss as TRL adds it (scaled for gradient accumulation only), and
    its ``aux_loss`` metric; ``loss`` itself without TRL's ``aux_loss_enabled``."""
    if not trainer.aux_loss_enabled:
        return loss
    record.rank_value("aux_loss", aux_loss.detach())
    return loss + trainer.router_aux_loss_coef * aux_loss / accumulation
