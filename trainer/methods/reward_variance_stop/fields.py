"""RAGEN's reward-variance collapse stop and its evaluation before training: a mixin of ``WinnowConfig``.

Imports nothing of the trainer, so the config can import it while every method imports the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RewardVarianceStopFields:
    """RAGEN's reward-variance early stop and val_before_train (docs/ragen.md)."""

    reward_variance_stop_steps: int = field(
        default=0,
        metadata={
            "help": "RAGEN's reward-variance collapse early stop (agent_trainer.py:1209-1242): the mean within-group "
            "reward std of the first N non-empty generation batches sets a baseline, and training stops once N "
            "consecutive ones are below reward_variance_stop_ratio x baseline. RAGEN: 10. 0 = off."
        },
    )
    reward_variance_stop_ratio: float = field(
        default=0.1,
        metadata={"help": "Fraction of the baseline below which a batch counts as collapsed (RAGEN: 0.1)."},
    )
    val_before_train: bool = field(
        default=False,
        metadata={"help": "Evaluate once before the first update (RAGEN: trainer.val_before_train True); needs "
                  "eval_strategy != 'no'. Not repeated on resume."},
    )
