"""``WinnowConfig``: TRL's ``GRPOConfig`` plus every winnow-rl knob, each documented by its help text.

Validation runs in ``__post_init__`` -- before any model is loaded -- and raises :class:`ConfigError`
naming the field and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from . import stages
from .algorithms.grpo import STD_KINDS

OLD_LOGPS_SOURCES = ("policy", "sampler")
DROPOUT_DELETE = ("positive", "negative", "both")
DROPOUT_RECENTER = ("prob_weighted", "mean", "none")
DROPOUT_BASIS = ("mean", "sum")
DROPOUT_SELECTORS = ("paper", "balanced_push")


class ConfigError(ValueError):
    """An invalid configuration value: the message names the field and how to fix it."""

    def __init__(self, field_name: str, problem: str, fix: str):
        self.field_name = field_name
        super().__init__(f"WinnowConfig.{field_name}: {problem}. Fix: {fix}")


@dataclass
class WinnowConfig(GRPOConfig):
    """GRPOConfig + the stage pipeline (filter -> dropout -> advantage) and loss variants.

    With ``rollout_filter="none"``, ``rollout_dropout="none"``, ``advantage="grpo"`` and
    ``loss_variant="none"`` (the defaults) training is numerically TRL's ``GRPOTrainer``.
    """

    rollout_filter: str = field(
        default="none",
        metadata={
            "help": "Group-level filter run on the global batch before the loss: rollouts of unselected prompt "
            "groups leave the loss and its normaliser. 'none' keeps every group. Registered names: "
            "trainer.stages.available('rollout_filter')."
        },
    )
    rollout_dropout: str = field(
        default="none",
        metadata={
            "help": "Rollout-level dropout run after the filter: removes single rollouts from the loss and may "
            "re-center the advantages of the rest. 'none' keeps every rollout."
        },
    )
    advantage: str = field(
        default="grpo",
        metadata={
            "help": "Advantage estimator, scalar per rollout or per token. 'grpo' is TRL's group-relative "
            "advantage exactly (scale_rewards and multi_objective_aggregation honoured)."
        },
    )
    loss_variant: str = field(
        default="none",
        metadata={
            "help": "Replacement for TRL's per-micro-batch loss. 'none' uses TRL's clipped surrogate for "
            "loss_type unchanged."
        },
    )
    advantage_std: str = field(
        default="unbiased",
        metadata={
            "help": "Std estimator of the 'grpo' advantage: 'unbiased' (Bessel-corrected, TRL's) or "
            "'population' (ddof=0, for methods whose paper specifies it)."
        },
    )
    advantage_eps: float = field(
        default=1e-4,
        metadata={"help": "Epsilon added to the std before dividing in the 'grpo' advantage (TRL: 1e-4)."},
    )
    old_logps_source: str = field(
        default="policy",
        metadata={
            "help": "Where stages that need old-policy per-token log-probs get them: 'policy' = one no-grad "
            "forward of the policy at the sampling temperature (reused when TRL already computed them); "
            "'sampler' = the log-probs the generator returned (vLLM or a rollout_func), skipping that pass."
        },
    )

    # --- GRPODropout (rollout_dropout: grpodropout) -------------------------------------------------
    dropout_selector: str = field(
        default="paper",
        metadata={
            "help": "GRPODropout selection rule: 'paper' (greedy max-cardinality solution of eq. 4, then the "
            "restoration of dropout_delete) or 'balanced_push' (the released code's selector, without its random "
            "subsets and row duplication)."
        },
    )
    dropout_delete: str = field(
        default="positive",
        metadata={
            "help": "Which removed rollouts stay removed (paper's selector): 'positive' (paper, eq. 7: every removed "
            "rollout with A <= 0 is restored), 'negative' (restore A >= 0), 'both' (restore nothing). Table 2 rows."
        },
    )
    dropout_recenter: str = field(
        default="prob_weighted",
        metadata={
            "help": "Recentering of the kept advantages: 'prob_weighted' (paper, eq. 9: subtract the old-policy "
            "probability-weighted mean, a softmax of -surprisal over the kept set), 'mean' (equal weights), 'none'."
        },
    )
    dropout_surprisal_basis: str = field(
        default="mean",
        metadata={
            "help": "Surprisal of a rollout from old-policy token log-probs: 'mean' (length-normalised, the paper's "
            "practice) or 'sum' (full-sequence surprisal of §3.1)."
        },
    )

    def __post_init__(self) -> None:
        self._validate_winnow()
        super().__post_init__()

    def _validate_winnow(self) -> None:
        """Fail fast on winnow fields (TRL validates its own in super().__post_init__)."""
        for kind in stages.STAGE_KINDS:
            name = getattr(self, kind)
            if name not in stages.available(kind):
                raise ConfigError(
                    kind, f"{name!r} is not a registered {kind} stage", f"use one of {stages.available(kind)}"
                )
        if not self.advantage_eps > 0:
            raise ConfigError("advantage_eps", f"must be > 0 (got {self.advantage_eps})", "use e.g. 1e-4 (TRL) or 1e-6")
        for name, allowed in (
            ("advantage_std", STD_KINDS),
            ("old_logps_source", OLD_LOGPS_SOURCES),
            ("dropout_selector", DROPOUT_SELECTORS),
            ("dropout_delete", DROPOUT_DELETE),
            ("dropout_recenter", DROPOUT_RECENTER),
            ("dropout_surprisal_basis", DROPOUT_BASIS),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(name, f"{getattr(self, name)!r} is not an option", f"use one of {list(allowed)}")
        if self.num_generations is not None and self.num_generations < 2:
            group_stages = [s for s in stages.configured_stages(self) if s.group_level]
            if group_stages:
                names = ", ".join(f"{s.kind}={s.name!r}" for s in group_stages)
                raise ConfigError(
                    "num_generations",
                    f"{names} compare rollouts within a prompt group, which needs at least 2 per prompt "
                    f"(got {self.num_generations})",
                    "set num_generations >= 2",
                )
