"""TRL's own GRPO as the stages that are on when no method is: ``none`` filter and dropout, the ``grpo``
advantage, the ``none`` loss variant (TRL's loss), and the per-row inputs every method may ask for (the teacher's
scores, the old policy's log-probs and entropies). The methods catalog (trainer/methods/catalog.py) lists it first,
so these are registered before any method's.

The ``old_logps`` and ``entropies`` row inputs are the old policy's per-token log-probs at the sampling temperature,
and its token entropies, on this rank's rows of a generation batch. Before a generation batch's first update the
current policy *is* the old one, so one no-grad forward gives both; log-probs that already exist are reused instead
(TRL's ``old_per_token_logps``, the sampler's with ``old_logps_source: sampler``, or the teacher pass's student
log-probs at the sampling temperature).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer import trl_contact
from trainer.algorithms.grpo import grpo_advantages, normalize_then_sum_advantages
from trainer.config.errors import ConfigError
from trainer.loss.call import LossCall
from trainer.loss.trl_loss import trl_policy_loss
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.stages import StageResult, register_input, register_stage
from trainer.pipeline.token_budget import no_grad_logps


@register_stage("rollout_filter", "none")
def _no_filter(batch: RolloutBatch, args: Any) -> StageResult:
    """Keep every group."""
    return StageResult()


@register_stage("rollout_dropout", "none")
def _no_dropout(batch: RolloutBatch, args: Any) -> StageResult:
    """Keep every rollout."""
    return StageResult()


@register_stage("advantage", "grpo", group_level=True, metric_prefix="advantage")
def _grpo(batch: RolloutBatch, args: Any) -> StageResult:
    """TRL's GRPO advantage, exactly: ``scale_rewards`` and ``multi_objective_aggregation`` honoured,
    std estimator from ``args.advantage_std`` (TRL: unbiased), epsilon ``args.advantage_eps`` (TRL: 1e-4)."""
    std, eps = args.advantage_std, args.advantage_eps
    if args.multi_objective_aggregation == "normalize_then_sum":
        A, sigma = normalize_then_sum_advantages(batch.R_k, batch.reward_weights, batch.G, std=std, eps=eps)
    else:
        A, sigma = grpo_advantages(batch.R, batch.G, scale_rewards=args.scale_rewards, std=std, eps=eps)
    zero_std = torch.isclose(sigma, torch.zeros_like(sigma)).float().mean().item()
    return StageResult(advantages=A, metrics={"frac_zero_std": zero_std})


@register_stage("loss_variant", "none")
def _trl_loss(trainer: Any, model: Any, inputs: dict[str, Any], call: LossCall) -> torch.Tensor:
    """TRL's loss for the configured ``loss_type``: TRL's own ``_compute_loss`` where nothing of winnow changes it
    (``call.plain``), else the same loss with winnow's differences as arguments (trainer/loss/trl_loss.py)."""
    if call.plain:
        return trl_contact.trl_loss(trainer, model, inputs)
    return trl_policy_loss(trainer, model, inputs, call)


# Built-in per-row inputs: model forwards of this rank's rows (the teacher's, trainer/methods/uecr/hook.py; the old
# policy's, below). ``teacher`` comes first: its student pass also yields the old policy's
# log-probs at the sampling temperature, which ``old_logps`` then reuses instead of a second forward.
def _teacher_input(trainer: Any, output: dict[str, Any], needs: frozenset[str], computed: dict[str, Any]):
    """The teacher hook's scores (trainer/methods/uecr/hook.py); its old-policy log-probs at the sampling
    temperature (the same forward as T = 1) are left for ``old_logps`` to reuse, not gathered."""
    scores = trainer.hook("teacher").scores(trainer, output)
    scores["_old_logps_sampling_t"] = scores.pop("old_logps_sampling_t")
    return scores


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


register_input("teacher", _teacher_input, phase="teacher_scoring")
register_input("old_logps", old_policy_inputs)
register_input("entropies", old_policy_inputs)  # the same forward: one call computes both
