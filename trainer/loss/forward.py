"""One micro-batch through the policy, as TRL's loss runs it: :func:`policy_forward` and its :class:`PolicyPass`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainer import trl_contact
from trainer.loss.call import LossRecorder

# The multimodal inputs TRL's _compute_loss forwards to _get_per_token_logps_and_entropies (TRL 1.16).
MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


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


def policy_forward(trainer: Any, model: Any, inputs: dict[str, Any],
                   recorder: LossRecorder | None = None) -> PolicyPass:
    """TRL's forward for one micro-batch (same helper, same alignment as TRL's own loss); with a ``recorder``, the
    statistics of the policy-to-sampler ratio on its tokens (:func:`record_sampler_ratio`)."""
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
    if recorder is not None and trainer.model.training and inputs.get("sampling_per_token_logps") is not None:
        record_sampler_ratio(recorder, logp, inputs["sampling_per_token_logps"], mask)
    return PolicyPass(logp, entropies, mask, A, logp.detach() if old is None else old, aux_loss)


def record_sampler_ratio(recorder: LossRecorder, logp: torch.Tensor, sampling_logp: torch.Tensor,
                         mask: torch.Tensor) -> None:
    """``async/is_ratio/{mean,min,max}``: ``exp(log pi_theta - log pi_sampler)`` over the loss tokens, the policy
    being trained against the weights that sampled the tokens (the sampler's own log-probs). It is the importance
    weight a full off-policy correction would apply: with ``max_staleness`` s > 0 it holds the s policy updates the
    rollouts lag behind (on the first micro-step of a generation batch, pi_theta is version k, the sampler version
    k - s), at s = 0 only the trainer-vs-sampler numerics and the updates within the generation batch. Logged
    whether or not a correction is applied (TRL logs its ``sampling/importance_sampling_ratio`` only with
    ``vllm_importance_sampling_correction``, and against its old log-probs). Tokens the sampler gave no log-prob
    (NaN) are left out."""
    log_ratio = logp.detach() - sampling_logp
    tokens = (mask > 0) & torch.isfinite(log_ratio)
    ratio = torch.exp(log_ratio[tokens].double())
    recorder.mean("async/is_ratio/mean", ratio.sum(), ratio.numel())
    recorder.mean("async/abs_log_ratio/mean", log_ratio[tokens].double().abs().sum(), ratio.numel())
    recorder.extreme("async/is_ratio/min", ratio, "min")
    recorder.extreme("async/is_ratio/max", ratio, "max")
