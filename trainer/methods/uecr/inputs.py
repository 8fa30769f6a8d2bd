"""The teacher's per-row inputs as UECR's stages and the teacher-assisted baselines read them (the ``teacher``
input, scored by trainer/methods/uecr/hook.py): the input set a stage ``needs`` and the per-token gap delta."""

from __future__ import annotations

import torch

from trainer.algorithms.uecr import token_gap
from trainer.pipeline.batch import RolloutBatch

TEACHER = frozenset({"teacher"})


def teacher_gap(batch: RolloutBatch) -> torch.Tensor:
    """delta = log pi_T - log pi_old at T = 1 per token (0 outside the loss mask)."""
    return token_gap(batch.extras["teacher_logps"], batch.extras["old_logps_t1"], batch.mask)
