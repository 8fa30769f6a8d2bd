"""``rollout_dropout: grpodropout`` -- GRPODropout (paper §3, eqs. 2-9) as a pipeline stage.

Reads the configured estimator's per-rollout advantages and the old-policy token log-probs, selects the
retained set per group (``dropout_selector``/``dropout_delete``), recenters the retained advantages
(``dropout_recenter``) and returns both; the trainer removes the dropped rollouts from the loss and its
normaliser. All formulas live in trainer/algorithms/dropout.py.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trainer.algorithms.dropout import (
    balanced_push_select,
    dropout_metrics,
    recenter,
    select_rollouts,
    sequence_surprisal,
)
from trainer.config.errors import ConfigError
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.stages import StageResult, register_config_check, register_stage

DROPOUT_DELETE = ("positive", "negative", "both")
DROPOUT_RECENTER = ("prob_weighted", "mean", "none")
DROPOUT_BASIS = ("mean", "sum")
DROPOUT_SELECTORS = ("paper", "balanced_push")


@register_config_check
def validate_dropout_fields(args: Any) -> None:
    """The ``dropout_*`` fields name options of this method, checked whether or not it is selected."""
    for name, allowed in (
        ("dropout_selector", DROPOUT_SELECTORS),
        ("dropout_delete", DROPOUT_DELETE),
        ("dropout_recenter", DROPOUT_RECENTER),
        ("dropout_surprisal_basis", DROPOUT_BASIS),
    ):
        if getattr(args, name) not in allowed:
            raise ConfigError(name, f"{getattr(args, name)!r} is not an option", f"use one of {list(allowed)}")
    if args.dropout_selector == "balanced_push" and args.dropout_delete != "positive":
        # balanced_push keeps by its own push-balance rule (the released `balance` variant); the restoration
        # rule of dropout_delete belongs to the paper's selector, so a non-default value would be ignored.
        raise ConfigError("dropout_delete", f"{args.dropout_delete!r} applies to dropout_selector 'paper' only; "
                          "'balanced_push' decides which rollouts stay by its own rule",
                          "remove dropout_delete, or use dropout_selector: paper for the Table 2 deletion rows")


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
    if args.dropout_selector == "balanced_push":
        keep = balanced_push_select(A_pg, s, valid=valid)
    else:
        keep = select_rollouts(A_pg, s, delete=args.dropout_delete, valid=valid)
    A_bar = recenter(A_pg, s, keep, mode=args.dropout_recenter, valid=valid)
    # Undefined metrics (e.g. retained per question when every group has zero advantage) are NaN; leave them
    # out rather than let one NaN erase the logged mean of a whole logging window.
    metrics = {k: v for k, v in dropout_metrics(A_pg, s, keep, A_bar, valid).items() if math.isfinite(v)}
    return StageResult(keep=keep.reshape(-1), advantages=A_bar.reshape(-1), metrics=metrics)
