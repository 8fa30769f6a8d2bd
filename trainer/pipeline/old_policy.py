"""The ``old_logps`` and ``entropies`` row inputs (trainer/pipeline/stages.py): the old policy's per-token log-probs
at the sampling temperature, and its token entropies, on this rank's rows of a generation batch.

Before a generation batch's first update the current policy *is* the old one, so one no-grad forward gives both;
log-probs that already exist are reused instead (TRL's ``old_per_token_logps``, the sampler's with
``old_logps_source: sampler``, or the teacher pass's student log-probs at the sampling temperature).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer import trl_contact
from trainer.config.errors import ConfigError
from trainer.pipeline.token_budget import no_grad_logps


def old_policy_inputs(trainer: Any, output: dict[str, Any], needs: frozenset[str], computed: dict[str, Any]):
    """The row inputs ``old_logps`` (and ``entropies`` when needed): the teacher pass's sampling-temperature log-probs
    when they are the policy's and no entropy is needed, else :func:`old_policy_logps`."""
    sampling_t = computed.get("_old_logps_sampling_t")
    reusable = (sampling_t is not None and "entropies" not in needs and trainer.args.old_logps_source == "policy"
                and output.get("old_per_token_logps") is None)
    if reusable:
        return {"old_logps": sampling_t}
    old_logps, entropies = old_policy_logps(trainer, output, need_entropy="entropies" in needs)
    return {"old_logps": old_logps, "entropies": entropies}


def old_policy_logps(trainer: Any, output: dict[str, Any], need_entropy: bool):
    """Old-policy per-token log-probs (and entropies) at the sampling temperature, local rows: TRL's
    ``old_per_token_logps`` or the sampler's log-probs (``old_logps_source: sampler``) when they exist, else one
    no-grad pass of TRL's log-prob forward (trainer/pipeline/token_budget.py: over token-budget chunks with
    ``micro_batch_tokens``)."""
    args = trainer.args
    sampler = args.old_logps_source == "sampler"
    if sampler and output.get("sampling_per_token_logps") is None:  # a rollout_func that returned no logprobs
        raise ConfigError("old_logps_source", "'sampler' needs per-token log-probs, and the generator returned "
                          "none for this batch", "use old_logps_source='policy' or return 'logprobs' from it")
    if not need_entropy:
        if sampler:
            return output["sampling_per_token_logps"], None
        if output.get("old_per_token_logps") is not None:
            return output["old_per_token_logps"], None
    input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, entropies, _ = no_grad_logps(trainer, trl_contact.trl_logps_forward(trainer),
                                            trainer.round_parts.timer.phase, trainer.model, input_ids,
                                            attention_mask, output["completion_ids"].size(1),
                                            args.per_device_train_batch_size, compute_entropy=need_entropy)
    if sampler:
        logps = output["sampling_per_token_logps"]
    elif output.get("old_per_token_logps") is not None:
        logps = output["old_per_token_logps"]
    return logps, entropies
