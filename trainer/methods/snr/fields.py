"""The SNR filter's knobs: a mixin of ``WinnowConfig`` (its fields appear there and in ``--help`` like all others).

Imports only the pure algorithm's option types, so the config can import it while every method imports the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.algorithms.snr_filter import KeepMode, LossScaling, ScoreMetric, Strategy, TopPMode


@dataclass
class SNRFilterFields:
    """RAGEN-2's SNR-aware filtering (``rollout_filter: snr``; docs/ragen.md)."""

    snr_metric: ScoreMetric = field(
        default="reward_variance",
        metadata={
            "help": "Per-group score of the SNR filter: 'reward_variance' (paper §3.4: population variance of the "
            "group's rewards), 'reward_std' (unbiased std: what the released code computes under the name "
            "reward_variance), 'reward_sum', 'reward_mean', 'entropy' (group mean of per-rollout token-mean policy "
            "entropy; costs one no-grad forward per step), 'entropy_variance', 'entropy_std', 'length'."
        },
    )
    snr_strategy: Strategy = field(
        default="top_p",
        metadata={
            "help": "Group selection: 'top_p' (keep groups carrying snr_value of the total score, see "
            "snr_top_p_mode), 'top_k' (keep int(snr_value * groups)), 'top_k_abs' (keep int(snr_value)), 'min_p' "
            "(keep scores >= snr_value * max)."
        },
    )
    snr_value: float = field(
        default=0.9,
        metadata={
            "help": "The strategy's parameter rho: top_p mass (>= 1 keeps every candidate), top_k fraction, "
            "top_k_abs count or min_p ratio. The paper's filter is top_p 0.9."
        },
    )
    snr_top_p_mode: TopPMode = field(
        default="linear",
        metadata={
            "help": "top_p: 'linear' (sort descending, keep the shortest prefix whose cumulative score reaches "
            "rho * sum - snr_eps, stopping at non-positive scores; keep nothing if unreachable -- the docs' "
            "recommendation) or 'softmax' (cumulative softmax probability of the scores; always keeps >= 1 group; "
            "the paper's main table)."
        },
    )
    snr_keep: KeepMode = field(
        default="largest",
        metadata={
            "help": "Keep the 'largest' scores (the method) or the 'smallest' (the paper's ablation; not implemented "
            "for linear top_p, docs/ragen.md)."
        },
    )
    snr_include_zero: bool = field(
        default=False,
        metadata={
            "help": "Whether groups scoring 0 (e.g. all-equal rewards) can be kept. False (the docs' "
            "recommendation) drops them even at snr_value >= 1 -- DAPO-style filtering without resampling; the "
            "released code defaults to True."
        },
    )
    snr_eps: float = field(
        default=0.01,
        metadata={"help": "selection_eps of linear top_p: the threshold is rho * sum(scores) - snr_eps."},
    )
    snr_loss_scaling: LossScaling = field(
        default="none",
        metadata={
            "help": "Scale the final advantages by the kept fraction of groups: 'none', 'linear' (x kept/total) or "
            "'sqrt' (x sqrt(kept/total)); the released code's filter_loss_scaling."
        },
    )
