"""DAPO dynamic sampling's knobs: a mixin of ``WinnowConfig`` (its fields appear there and in ``--help`` like all
others).

Imports nothing of the trainer, so the config can import it while every method imports the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class DynamicSamplingFields:
    """DAPO's dynamic sampling (Yu et al. 2025 §3.2; docs/baselines.md)."""

    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO's dynamic sampling: prompt groups whose dynamic_sampling_metric is constant (all correct or "
            "all wrong) are dropped and replaced by groups from newly generated batches until the generation batch "
            "is full of mixed groups (bounded by max_num_gen_batches). Refill prompts come from a second seeded pass "
            "over the training set. Logged as dynamic_sampling/*."
        },
    )
    dynamic_sampling_metric: str = field(
        default="reward",
        metadata={
            "help": "What must vary within a group for it to be kept: 'reward' (the weighted total reward) or the "
            "name of one reward function of the recipe (e.g. 'math_accuracy': DAPO's 0 < #correct < G rule)."
        },
    )
    max_num_gen_batches: int = field(
        default=10,
        metadata={
            "help": "Most generation batches (of the configured size, the first included) one training batch may "
            "take. DAPO's recipe oversamples 3x per round with 10 rounds: 30 here. See dynamic_sampling_on_limit."
        },
    )
    dynamic_sampling_on_limit: Literal["partial", "error"] = field(
        default="partial",
        metadata={
            "help": "When max_num_gen_batches is reached with too few mixed groups: 'partial' trains on the mixed "
            "groups found (the missing ones are out of the loss and its normaliser; a step with none is skipped), "
            "logging dynamic_sampling/limit_hit; 'error' stops training with an error (verl's DAPO behaviour)."
        },
    )
