"""``rollout_dropout: grpodropout`` -- GRPODropout (paper §3, eqs. 2-9) as a pipeline stage.

Reads the configured estimator's per-rollout advantages and the old-policy token log-probs, selects the
retained set per group (``dropout_selector``/``dropout_delete``), recenters the retained advantages
(``dropout_recenter``) and returns both; the trainer removes the dropped rollouts from the loss and its
normaliser. All formulas live in trainer/algorithms/dropout.py.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch

from trainer.algorithms.dropout import (
    all_zero_push_groups,
    balanced_push_select,
    dropout_metrics,
    min_keep_count,
    recenter,
    restandardize,
    restore_negative_push_negative_advantage,
    seeded_subset,
    select_rollouts,
    sequence_surprisal,
)
from trainer.config.errors import ConfigError
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.stages import StageResult, register_config_check, register_stage

BALANCED = ("balanced_push", "balanced_push_neg")


@register_config_check
def validate_dropout_fields(args: Any) -> None:
    """How the ``dropout_*`` fields combine, checked whether or not the method is selected (each option field's value
    is checked against its Literal type by WinnowConfig: the options live in trainer/algorithms/dropout.py)."""
    if args.dropout_selector in BALANCED and args.dropout_delete != "positive":
        # the balanced selectors keep by their own push-balance rule (the released `balance` / `balance_neg`
        # variants); the restoration rule of dropout_delete belongs to the paper's selector, so it would be ignored.
        raise ConfigError("dropout_delete", f"{args.dropout_delete!r} applies to dropout_selector 'paper' only; "
                          f"{args.dropout_selector!r} decides which rollouts stay by its own rule",
                          "remove dropout_delete, or use dropout_selector: paper for the Table 2 deletion rows")
    if args.dropout_zero_push_groups != "keep_all" and args.dropout_selector not in BALANCED:
        raise ConfigError("dropout_zero_push_groups", f"{args.dropout_zero_push_groups!r} is the released "
                          "selector's rule; the paper's selector keeps a group whose pushes are all zero (sum h = 0)",
                          "use dropout_selector: balanced_push (or balanced_push_neg), or remove the field")
    if args.dropout_restandardize and (args.advantage != "grpo" or args.scale_rewards == "batch"
                                       or args.multi_objective_aggregation == "normalize_then_sum"):
        raise ConfigError("dropout_restandardize", "re-standardising over the kept rollouts is verl's per-group GRPO "
                          f"advantage, but advantage={args.advantage!r}, scale_rewards={args.scale_rewards!r}, "
                          f"multi_objective_aggregation={args.multi_objective_aggregation!r}",
                          "use advantage: grpo with scale_rewards group (or none) and sum aggregation, or set "
                          "dropout_restandardize: false")


@register_stage("rollout_dropout", "grpodropout", needs={"old_logps"}, group_level=True, metric_prefix="dropout")
def grpodropout(batch: RolloutBatch, args: Any) -> StageResult:
    """Keep mask and recentered advantages of GRPODropout on the global batch."""
    A = batch.base_advantages()
    if A.dim() != 1:
        raise ValueError(
            f"rollout_dropout='grpodropout' needs one advantage per rollout, but advantage={args.advantage!r} gives "
            "per-token advantages"
        )
    # Unscorable padding positions can carry NaN sampler log-probs; they are outside the mask anyway.
    logps = torch.where(batch.mask > 0, batch.old_logps, torch.zeros_like(batch.old_logps))
    s = batch.groups(sequence_surprisal(logps, batch.mask, basis=args.dropout_surprisal_basis))
    A_pg = batch.groups(A)
    # Rollouts without a loss token are never trained: no deletion candidates, no weight in s_bar or b.
    valid = batch.groups(batch.trainable)
    if args.dropout_selector in BALANCED:
        drawn = None
        if args.dropout_zero_push_groups == "random_min_keep":
            zero_push = valid & all_zero_push_groups(A_pg, s, valid=valid).unsqueeze(1)
            drawn = seeded_subset(zero_push, min_keep_count(batch.G), _group_keys(batch, args.seed))
        keep = balanced_push_select(A_pg, s, valid=valid, all_zero_keep=drawn)
        if args.dropout_selector == "balanced_push_neg":
            keep = restore_negative_push_negative_advantage(A_pg, s, keep, valid=valid)
    else:
        keep = select_rollouts(A_pg, s, delete=args.dropout_delete, valid=valid)
    A_sel = A_pg
    restandardized = args.dropout_restandardize and not bool(keep.all())  # verl recomputes only if a row went
    if restandardized:
        A_sel = restandardize(batch.groups(batch.R), keep, scale=args.scale_rewards != "none",
                              eps=args.advantage_eps).to(A_pg.dtype)
    A_bar = recenter(A_sel, s, keep, mode=args.dropout_recenter, valid=valid)
    # Undefined metrics (e.g. retained per question when every group has zero advantage) are NaN; leave them
    # out rather than let one NaN erase the logged mean of a whole logging window.
    metrics = {k: v for k, v in dropout_metrics(A_pg, s, keep, A_bar, valid).items() if math.isfinite(v)}
    metrics["restandardized"] = float(restandardized)
    return StageResult(keep=keep.reshape(-1), advantages=A_bar.reshape(-1), metrics=metrics)


def _group_keys(batch: RolloutBatch, seed: int) -> list[str]:
    """One seed string per group for the all-zero-push draw: the run seed and a digest of the group's model tokens
    (identical on every process and in a resumed or repeated run; the released code seeds with a fresh uuid)."""
    ids = torch.where(batch.mask > 0, batch.completion_ids, -1).to(torch.int64).cpu()
    keys = []
    for group in batch.groups(ids):
        digest = hashlib.sha256()
        for row in group:
            digest.update(row[row >= 0].numpy().tobytes() + b"|")
        keys.append(f"{seed}:{digest.hexdigest()}:balanced_push_zero:all_zero")
    return keys
