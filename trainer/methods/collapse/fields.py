"""RAGEN-2's collapse detector's knobs (``collapse_detection: true``): a mixin of ``WinnowConfig``.

Imports nothing of the trainer, so the config can import it while every method imports the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class CollapseFields:
    """RAGEN-2's mutual-information template-collapse probe (paper §3.2/§3.5; docs/ragen.md)."""

    collapse_detection: bool = field(
        default=False,
        metadata={
            "help": "Log mutual-information 'template collapse' metrics (collapse/*, paper §3.2/§3.5): reasoning "
            "traces of the unfiltered batch are scored under every distinct prompt of the batch with the current "
            "policy (teacher-forced, no grad)."
        },
    )
    collapse_every: int = field(
        default=5,
        metadata={
            "help": "Run the collapse check at step 1 and then on the first generation of every this many steps."
        },
    )
    collapse_num_samples: int = field(
        default=64,
        metadata={"help": "Reasoning traces sampled (seeded, without replacement) from the batch per check."},
    )
    collapse_max_tokens: int = field(
        default=32768,
        metadata={
            "help": "Cap on tokens fed through the model per sample of a check (sum over all trace x prompt pairs of "
            "prompt + trace length): traces are admitted in sampling order while they fit. Cost = #prompts x #traces "
            "teacher-forced sequences. RAGEN has no cap; to score its full 64 x 64 trajectory sample set it to >= "
            "collapse_num_samples^2 x the longest prompt + completion (the RAGEN recipes do)."
        },
    )
    collapse_micro_batch_size: int = field(
        default=32,
        metadata={"help": "Sequences per forward pass of the collapse check (per process). Ignored when "
                  "micro_batch_tokens is set: the token budget then sizes these forwards."},
    )
    collapse_turns: Literal["first", "all"] = field(
        default="first",
        metadata={
            "help": "Which collapse samples each check computes: 'first' (each rollout's first turn; columns = the "
            "sampled traces' prompts; collapse/*) or 'all' (RAGEN's default, config/base.yaml:151-152: the first-turn "
            "sample and, in the same check, the trajectory-uniform one under collapse/trajectory/*: every model turn "
            "is a trace whose context is everything before it, collapse_num_samples (episode, turn) draws with "
            "replacement, each its own column; trainer/methods/collapse/hook.py)."
        },
    )
