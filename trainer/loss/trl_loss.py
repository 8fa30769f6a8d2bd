"""TRL 1.16's GRPO loss with winnow's differences as arguments: :func:`trl_policy_loss`.

Why a copy of TRL's ``GRPOTrainer._compute_loss`` (trl==1.16.0:trl/trainer/grpo_trainer.py:3020-3290): TRL reads
the KL coefficient, the entropy coefficient and its collectives from the trainer object, so computing TRL's loss on
a thinned batch (rows out of the row count), with the entropy bonus aggregated like the policy term, or over
token-budget chunks (metrics reduced once per micro-step) would mean changing those attributes around each call.
Here they are arguments (:class:`trainer.loss.call.LossCall`) and TRL's loss is unchanged otherwise -- every
``loss_type``, token- and sequence-level importance sampling, two-sided clipping (``delta``), off-policy sequence
masking, the high-entropy token mask, vLLM importance-sampling correction, the k3 reference KL with its bias
correction, the static entropy bonus and an MoE router's load-balancing loss, and TRL's logged metrics.

Where no difference applies (``LossCall.plain``) the trainer calls TRL's own ``_compute_loss`` instead, so a run
with every stage off is TRL's loss, not this copy. tests/pipeline/test_token_budget.py, tests/grpo_trainer/
test_equals_trl_drifted.py and tests/loss/test_trl_loss.py hold this copy to TRL's loss, gradient and metrics.
TRL's adaptive entropy controller (``use_adaptive_entropy``) updates trainer state inside each loss call and is
not reproduced: the configurations that reach this copy refuse it (WinnowConfig).
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer

from trainer import trl_contact
from trainer.algorithms.normalisers import ROW_NORMALISED, normaliser
from trainer.loss.call import LossCall
from trainer.loss.forward import policy_forward
from trainer.loss.trl_terms import token_mean_bonus, trl_normalise, trl_reference_kl, with_router_aux_loss

PPO_CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # TRL's loss types with PPO's clipped surrogate


def trl_policy_loss(trainer: Any, model: Any, inputs: dict[str, Any], call: LossCall) -> torch.Tensor:
    """One micro-batch's loss as TRL 1.16 computes it for ``trainer.loss_type``, with ``call.row_scale`` on the
    policy and KL terms of a row-normalised loss type, the entropy bonus weighted by ``call.entropy_weight`` (and
    aggregated like the policy term with ``call.aggregate_entropy``), and TRL's metrics recorded in
    ``call.recorder`` (reduced by the caller)."""
    if trainer.use_adaptive_entropy:
        raise ValueError("use_adaptive_entropy's controller runs inside TRL's own loss only (refused by WinnowConfig)")
    args, loss_type, record = trainer.args, trainer.loss_type, call.recorder
    training = trainer.model.training
    p = policy_forward(trainer, model, inputs, record)
    logp, entropies, mask, old = p.logp, p.entropies, p.mask, p.old
    entropy_mask = None
    if trainer.top_entropy_quantile < 1.0:  # collective: the quantile is over every process's tokens
        entropy_mask = trainer.get_high_entropy_mask(entropies, mask, 1 - trainer.top_entropy_quantile)
    advantages = inputs["advantages"]
    if advantages.dim() == 1:  # (B,) per row, or (B, T) per token
        advantages = advantages.unsqueeze(1)
    if trainer.off_policy_mask_threshold is not None:
        off_policy_mask = GRPOTrainer.get_off_policy_mask(
            advantages=advantages, per_token_logps=logp,
            sampling_per_token_logps=inputs.get("sampling_per_token_logps", old), mask=mask,
            off_policy_threshold=trainer.off_policy_mask_threshold)

    log_ratio = logp - old
    if trainer.importance_sampling_level == "token":
        log_importance_weights = log_ratio
    elif trainer.importance_sampling_level == "sequence":
        log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        raise ValueError(f"Unknown importance sampling level: {trainer.importance_sampling_level}")
    coef_1 = torch.exp(log_importance_weights)  # (B, T) per token, (B, 1) per sequence
    if trainer.beta != 0.0:  # k3, times coef_1 (token or sequence ratio) with the bias correction
        per_token_kl = trl_reference_kl(logp, inputs["ref_per_token_logps"],
                                                    coef_1 if args.use_bias_correction_kl else None)

    if loss_type == "cispo":
        per_token_loss = -torch.clamp(coef_1, max=trainer.epsilon_high).detach() * advantages * logp
    elif loss_type in PPO_CLIPPED:
        coef_2 = torch.clamp(coef_1, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
        if args.delta is not None:  # two-sided clipping
            coef_1 = torch.clamp(coef_1, max=args.delta)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    elif loss_type == "sapo":
        temperatures = torch.where(advantages > 0, args.sapo_temperature_pos, args.sapo_temperature_neg)
        per_token_loss = -torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures * advantages
    elif loss_type == "vespo":
        phi_seq = GRPOTrainer.get_gamma_weights(
            advantages=advantages, log_ratio_per_token=log_ratio, mask=mask,
            importance_sampling_ratio=inputs.get("importance_sampling_ratio"), k_pos=args.vespo_k_pos,
            lambda_pos=args.vespo_lambda_pos, k_neg=args.vespo_k_neg, lambda_neg=args.vespo_lambda_neg)
        per_token_loss = -phi_seq * advantages * logp
    else:
        raise ValueError(f"Unknown loss type: {loss_type}")
    if trainer.off_policy_mask_threshold is not None:
        per_token_loss = per_token_loss * off_policy_mask
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction and loss_type != "vespo":
        per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
    if trainer.beta != 0.0:
        per_token_loss = per_token_loss + trainer.beta * per_token_kl
    row_scale = call.row_scale if loss_type in ROW_NORMALISED else None
    if row_scale is not None:  # linear in the advantages and beta: dropped rows out of the row count
        per_token_loss = per_token_loss * row_scale

    # TRL's normaliser for the loss type (trainer/algorithms/normalisers.py), gradient accumulation included
    loss = trl_normalise(trainer, per_token_loss, mask, inputs, training=training)
    accumulation = trainer.current_gradient_accumulation_steps if training else 1.0
    # TRL logs the policy term before its division by the accumulation steps (already inside a batch-token divisor)
    policy_loss = loss.detach() * (1.0 if normaliser(loss_type).divisor == "batch_tokens" else accumulation)

    if trl_contact.entropy_bonus_enabled(trainer):
        if call.aggregate_entropy:
            # RAGEN's (verl's) bonus: the entropies aggregated with the policy loss's own normaliser and row scale
            # (mll-lab-nu/RAGEN@20daedc ragen/workers/actor/dp_actor.py:442-446, agg_loss(entropy, response_mask,
            # loss_agg_mode)), so the two terms keep upstream's ratio; TRL's is always the micro-batch token mean.
            bonus = trl_normalise(trainer, entropies, mask, inputs, training=training)
            bonus = bonus if row_scale is None else bonus * row_scale
        else:  # TRL: the token mean over the tokens the policy term acts on
            bonus = token_mean_bonus(entropies, mask if entropy_mask is None else mask * entropy_mask, accumulation)
        loss = loss - trainer.entropy_coef * call.entropy_weight * bonus
        record.rank_value("policy_loss", policy_loss, weight=call.policy_weight)
        if training and trainer.accelerator.sync_gradients:
            record.latest["entropy_coef"] = trainer.entropy_coef
    loss = with_router_aux_loss(trainer, loss, p.aux_loss, accumulation, record)

    if trainer.beta != 0.0:
        record.trl_mean("kl", per_token_kl, mask)
    record.trl_mean("entropy", entropies, mask)
    if loss_type in PPO_CLIPPED:
        is_low_clipped = (coef_1 < 1 - trainer.epsilon_low) & (advantages < 0)
        is_high_clipped = (coef_1 > 1 + trainer.epsilon_high) & (advantages > 0)
        record.trl_mean("clip_ratio/low_mean", is_low_clipped.float(), mask)
        record.trl_mean("clip_ratio/high_mean", is_high_clipped.float(), mask)
        record.trl_mean("clip_ratio/region_mean", (is_low_clipped | is_high_clipped).float(), mask)
        record.extreme("clip_ratio/low_min", _masked_seq_mean(is_low_clipped.float(), mask), "min")
        record.extreme("clip_ratio/high_max", _masked_seq_mean(is_high_clipped.float(), mask), "max")
    elif loss_type == "cispo":
        record.trl_mean("cispo_clip_ratio", ((coef_1 > trainer.epsilon_high) & (advantages > 0)).float(), mask)
    elif loss_type == "vespo":
        record.trl_mean("vespo/phi_seq_mean", phi_seq, mask)
    return loss


def _masked_seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's per-row mean for the clip-ratio extremes (NaN for a row without loss tokens)."""
    if x.shape[1] == 1:
        return x.squeeze(1)
    return (x * mask).sum(-1) / mask.sum(-1)
