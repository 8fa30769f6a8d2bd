"""One micro-batch through the policy, as TRL's loss runs it: :func:`policy_forward` and its :class:`PolicyPass`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainer import trl_contact

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
