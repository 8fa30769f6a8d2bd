"""The entropy bonus aggregated like the policy loss (``entropy_aggregation: loss_type``).

TRL's bonus is always the token mean of the micro-batch's entropies, whatever ``loss_type`` does with the policy
term. verl -- and so RAGEN -- aggregates the entropy with the policy loss's own mode (mll-lab-nu/RAGEN@20daedc
ragen/workers/actor/dp_actor.py:442-446: ``agg_loss(entropy, response_mask, loss_agg_mode)``): Dr. GRPO's
seq-mean-token-sum sums a sequence's entropies, GRPO's seq-mean-token-mean averages per sequence first. Here the
bonus takes exactly the normaliser TRL gives the policy term of ``loss_type`` (dr_grpo: rows x
max_completion_length), so the two terms keep upstream's ratio, and the row factor of the policy term (batch
compaction's, and ``dr_grpo_token_sum``'s max_completion_length, which makes both terms verl's seq-mean-token-sum
exactly) multiplies the bonus too. The entropies are TRL's own (captured from its log-prob pass, no second forward).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from trainer import trl_contact
from trainer.algorithms.normalisers import ROW_NORMALISED


def aggregate_entropy(
    trainer: Any, entropies: torch.Tensor, mask: torch.Tensor, inputs: dict[str, Any]
) -> torch.Tensor:
    """The micro-batch entropy term with the policy loss's normaliser for ``trainer.loss_type`` (train mode,
    gradient accumulation included)."""
    # TRL's own normaliser for the loss type, kept with TRL's other copied code (trainer/trl_contact.py)
    return trl_contact.trl_normalise(trainer, entropies, mask, inputs, training=trainer.model.training)


def loss_with_aggregated_entropy(
    trainer: Any, inputs: dict[str, Any], compute: Callable[[], torch.Tensor], row_scale: Any = None
) -> torch.Tensor:
    """Run TRL's loss (``compute``) without its own entropy bonus, capturing the entropies of its forward, then
    subtract ``entropy_coef`` x :func:`aggregate_entropy`. ``row_scale``: batch compaction's factor for row-count
    normalisers (trainer/pipeline/compaction.py) times ``max_completion_length`` under ``dr_grpo_token_sum``, applied
    to the bonus as to the policy term."""
    captured: dict[str, torch.Tensor] = {}

    def spy(original: Callable[..., Any]) -> Callable[..., Any]:
        def capture(*args: Any, **kwargs: Any):
            out = original(*args, **kwargs)
            captured["entropies"] = out[1]
            return out
        return capture

    with trl_contact.intercepted_logps(trainer, spy), trl_contact.entropy_bonus_off(trainer):
        loss = compute()
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    bonus = aggregate_entropy(trainer, captured["entropies"], mask, inputs)
    if row_scale is not None and trainer.loss_type in ROW_NORMALISED:
        bonus = bonus * row_scale
    return loss - trainer.entropy_coef * bonus
