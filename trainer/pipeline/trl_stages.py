"""TRL's own GRPO as the stages that are on when no method is: ``none`` filter and dropout, the ``grpo``
advantage, the ``none`` loss variant (TRL's loss), and the per-row inputs every method may ask for (the teacher's
scores, the old policy's log-probs and entropies). The methods catalog (trainer/methods/catalog.py) lists it first,
so these are registered before any method's.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer import trl_contact
from trainer.algorithms.grpo import grpo_advantages, normalize_then_sum_advantages
from trainer.loss.call import LossCall
from trainer.loss.trl_loss import trl_policy_loss
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.old_policy import old_policy_inputs
from trainer.pipeline.stages import StageResult, register_input, register_stage


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
# policy's, trainer/pipeline/old_policy.py). ``teacher`` comes first: its student pass also yields the old policy's
# log-probs at the sampling temperature, which ``old_logps`` then reuses instead of a second forward.
def _teacher_input(trainer: Any, output: dict[str, Any], needs: frozenset[str], computed: dict[str, Any]):
    """The teacher hook's scores (trainer/methods/uecr/hook.py); its old-policy log-probs at the sampling
    temperature (the same forward as T = 1) are left for ``old_logps`` to reuse, not gathered."""
    scores = trainer.hook("teacher").scores(trainer, output)
    scores["_old_logps_sampling_t"] = scores.pop("old_logps_sampling_t")
    return scores


register_input("teacher", _teacher_input, phase="teacher_scoring")
register_input("old_logps", old_policy_inputs)
register_input("entropies", old_policy_inputs)  # the same forward: one call computes both
