"""RLOO's ``advantage`` stage and its check of its own field."""

from __future__ import annotations

from typing import Any

from trainer.config.errors import ConfigError
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.stages import StageResult, register_stage


def validate(args: Any) -> None:
    """``rloo_scale`` must be positive (a zero or negative scale trains nothing or the wrong way)."""
    if not args.rloo_scale > 0:
        raise ConfigError("rloo_scale", f"must be > 0 (got {args.rloo_scale})", "use e.g. 1.0")


@register_stage("advantage", "test_outside_rloo", group_level=True, metric_prefix="rloo", validate=validate)
def rloo(batch: RolloutBatch, args: Any) -> StageResult:
    """A_i = s * (R_i - (sum_j R_j - R_i) / (G - 1)) within each group (G rollouts of one prompt)."""
    R = batch.groups(batch.R)  # (P, G)
    G = R.shape[1]
    baseline = (R.sum(dim=1, keepdim=True) - R) / (G - 1)
    A = (R - baseline).reshape(-1) * args.rloo_scale
    return StageResult(advantages=A, metrics={"mean_abs": float(A.abs().mean())})
