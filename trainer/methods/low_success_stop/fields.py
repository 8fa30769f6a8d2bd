"""RAGEN's low-validation-success stop's knobs: a mixin of ``WinnowConfig``.

Imports nothing of the trainer, so the config can import it while every method imports the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LowSuccessStopFields:
    """RAGEN's low-validation-success early stop (docs/ragen-fidelity.md)."""

    low_success_stop_steps: int = field(
        default=0,
        metadata={
            "help": "RAGEN's low-validation-success early stop (agent_trainer.py:1482-1499): training stops once this "
            "many evaluations in a row log eval env/success_rate below low_success_stop_threshold (the evaluation "
            "before training and one right after an empty generation batch do not count; the stop saves a "
            "checkpoint). Environment tasks only; without evaluations (eval_strategy 'no') it never runs, as "
            "upstream's check sits in its validation branch. RAGEN: 5. 0 = off."
        },
    )
    low_success_stop_threshold: float = field(
        default=0.01,
        metadata={"help": "Validation success rate below which an evaluation counts as failed (RAGEN: 0.01)."},
    )
