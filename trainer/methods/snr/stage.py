"""``rollout_filter: snr`` -- RAGEN-2's SNR-aware prompt-group filtering (paper §3.4) as a pipeline stage.

Scores every prompt group of the global batch (``snr_metric``), selects groups (``snr_strategy``,
``snr_value``, ...), and returns the rollout keep mask; the trainer takes the rollouts of unselected groups
out of the loss and its normaliser. Optional ``snr_loss_scaling`` multiplies the final advantages by the
kept fraction of groups. An empty selection leaves nothing to train on: the trainer skips that optimizer
step (see trainer/guards/step_skip.py). All formulas live in trainer/algorithms/snr_filter.py.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.algorithms.snr_filter import filter_loss_scale, group_scores, select_groups, selection_metrics
from trainer.config.errors import ConfigError
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.stages import StageResult, register_config_check, register_stage

ENTROPY_METRICS = frozenset({"entropy", "entropy_variance", "entropy_std"})


@register_config_check
def validate_snr_fields(args: Any) -> None:
    """The ``snr_*`` fields, checked whether or not the filter is selected (each option field's value is checked
    against its Literal type by WinnowConfig: the options live in trainer/algorithms/snr_filter.py)."""
    if not args.snr_value > 0:
        raise ConfigError("snr_value", f"must be > 0 (got {args.snr_value})", "use e.g. 0.9 (top_p) or 0.5 (top_k)")
    if args.snr_strategy == "top_p" and args.snr_top_p_mode == "linear" and args.snr_keep == "smallest":
        raise ConfigError(
            "snr_keep",
            "'smallest' with linear top_p is not implemented (upstream's ascending sum stops at the first score "
            "<= 0: with snr_include_zero true a zero-score group keeps nothing; with it false the rule is defined "
            "but not built here)",
            "use snr_strategy 'top_k', 'top_k_abs' or 'min_p', or snr_top_p_mode 'softmax' (the paper's "
            "keep-smallest ablation is top_k 0.5)",
        )
    if args.snr_eps < 0:
        raise ConfigError("snr_eps", f"must be >= 0 (got {args.snr_eps})", "use a non-negative value")


def snr_needs(args: Any) -> frozenset[str]:
    """Entropy scores need the old policy's token entropies (one no-grad forward); the others need nothing."""
    return frozenset({"entropies"}) if args.snr_metric in ENTROPY_METRICS else frozenset()


@register_stage("rollout_filter", "snr", needs=snr_needs, group_level=True, metric_prefix="snr")
def snr_filter(batch: RolloutBatch, args: Any) -> StageResult:
    """Keep mask of the SNR-aware filter on the global batch, plus its telemetry (``snr/*``)."""
    # Rollouts without a loss token have no entropy and no length to score: NaN, which the group statistics leave
    # out (their rewards stay in the reward scores, as in TRL's group statistics).
    trainable = batch.trainable
    nan = torch.full_like(batch.lengths, float("nan"))
    entropies = None
    if args.snr_metric in ENTROPY_METRICS:
        # Per-rollout token-mean entropy over the loss tokens (env tokens and padding excluded).
        token_mean = (batch.entropies * batch.mask).sum(dim=1) / batch.lengths.clamp(min=1)
        entropies = batch.groups(torch.where(trainable, token_mean, nan))
    lengths = batch.groups(torch.where(trainable, batch.lengths, nan))
    scores = group_scores(batch.groups(batch.R), metric=args.snr_metric, entropies=entropies, lengths=lengths)
    # A group with no trainable rollout carries no gradient: it is not ranked (it would take a top-k slot or top-p
    # mass from a group that trains) and is named in the metrics.
    untrainable = ~batch.groups(trainable).any(dim=1)
    ranked = ~untrainable
    selected = torch.zeros_like(ranked)
    selected[ranked] = select_groups(
        scores[ranked],
        strategy=args.snr_strategy,
        value=args.snr_value,
        top_p_mode=args.snr_top_p_mode,
        keep=args.snr_keep,
        include_zero=args.snr_include_zero,
        eps=args.snr_eps,
    )
    scale = filter_loss_scale(int(selected.sum()), batch.P, args.snr_loss_scaling)
    metrics = selection_metrics(scores, selected)
    metrics["untrainable_groups"] = float(untrainable.sum())
    return StageResult(
        keep=selected.repeat_interleave(batch.G),
        metrics=metrics,
        advantage_scale=None if scale == 1.0 else scale,
    )
