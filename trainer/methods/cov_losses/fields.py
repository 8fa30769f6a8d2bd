"""Clip-Cov / KL-Cov's knobs (``loss_variant: clip_cov | kl_cov``): a mixin of ``WinnowConfig``.

Imports nothing of the trainer, so the config can import it while every method imports the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CovLossFields:
    """Clip-Cov and KL-Cov (Cui et al. 2025 §4.2; docs/baselines.md)."""

    clip_cov_ratio: float = field(
        default=2e-4,
        metadata={
            "help": "Clip-Cov: fraction of the micro-step's valid tokens (all processes) whose gradient is cut."
        },
    )
    clip_cov_lb: float = field(
        default=1.0, metadata={"help": "Clip-Cov: lower bound of the covariance band of candidate tokens (exclusive)."}
    )
    clip_cov_ub: float = field(
        default=5.0, metadata={"help": "Clip-Cov: upper bound of the covariance band of candidate tokens (exclusive)."}
    )
    kl_cov_ratio: float = field(
        default=2e-3,
        metadata={
            "help": "KL-Cov: fraction of the micro-step's valid tokens (all processes), largest covariance first, "
            "that get the |log-ratio| penalty (2e-3 for 7B models, 2e-4 for 32B in the paper; a fraction, not "
            "percent)."
        },
    )
    kl_cov_coef: float = field(
        default=1.0,
        metadata={"help": "KL-Cov: coefficient beta of the |log pi - log pi_old| penalty (the paper's 1)."},
    )
