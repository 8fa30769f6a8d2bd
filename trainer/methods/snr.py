"""``rollout_filter: snr`` -- RAGEN-2's SNR-aware prompt-group filtering (paper §3.4) as a pipeline stage.

Scores every prompt group of the global batch (``snr_metric``), selects groups (``snr_strategy``,
``snr_value``, ...), and returns the rollout keep mask; the trainer takes the rollouts of unselected groups
out of the loss and its normaliser. Optional ``snr_loss_scaling`` multiplies the final advantages by the
kept fraction of groups. An empty selection leaves nothing to train on: the trainer skips that optimizer
step (see trainer/empty_steps.py). All formulas live in trainer/algorithms/snr_filter.py.
"""

from __future__ import annotations

from typing import Any

from ..algorithms.snr_filter import filter_loss_scale, group_scores, select_groups, selection_metrics
from ..rollout_batch import RolloutBatch
from ..stages import StageResult, register_stage

ENTROPY_METRICS = frozenset({"entropy", "entropy_variance", "entropy_std"})


def snr_needs(args: Any) -> frozenset[str]:
    """Entropy scores need the old policy's token entropies (one no-grad forward); the others need nothing."""
    return frozenset({"entropies"}) if args.snr_metric in ENTROPY_METRICS else frozenset()


@register_stage("rollout_filter", "snr", needs=snr_needs, group_level=True, metric_prefix="snr")
def snr_filter(batch: RolloutBatch, args: Any) -> StageResult:
    """Keep mask of the SNR-aware filter on the global batch, plus its telemetry (``snr/*``)."""
    entropies = None
    if args.snr_metric in ENTROPY_METRICS:
        # Per-rollout token-mean entropy over the loss tokens (env tokens and padding excluded).
        token_mean = (batch.entropies * batch.mask).sum(dim=1) / batch.lengths.clamp(min=1)
        entropies = batch.groups(token_mean)
    scores = group_scores(
        batch.groups(batch.R), metric=args.snr_metric, entropies=entropies, lengths=batch.groups(batch.lengths)
    )
    selected = select_groups(
        scores,
        strategy=args.snr_strategy,
        value=args.snr_value,
        top_p_mode=args.snr_top_p_mode,
        keep=args.snr_keep,
        include_zero=args.snr_include_zero,
        eps=args.snr_eps,
    )
    scale = filter_loss_scale(int(selected.sum()), batch.P, args.snr_loss_scaling)
    return StageResult(
        keep=selected.repeat_interleave(batch.G),
        metrics=selection_metrics(scores, selected),
        advantage_scale=None if scale == 1.0 else scale,
    )
