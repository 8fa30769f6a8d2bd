"""The frozen teacher as a method hook (trainer/pipeline/stages.py): loaded when a configured stage scores with it.

:class:`TeacherScorer` holds the teacher and scores a generation batch: the teacher's per-token log-probs and
full-vocabulary entropy, and the old policy's log-probs, at T = 1 (trainer/methods/uecr/teacher.py does the forwards).
The ``teacher`` row input (trainer/pipeline/stages.py) calls :meth:`TeacherScorer.scores`.
"""

from __future__ import annotations

import resource
import time
from typing import Any

import torch

from trainer import trl_contact
from trainer.methods.uecr.fields import validate_teacher_fields
from trainer.methods.uecr.teacher import load_teacher, score_tokens
from trainer.pipeline import stages
from trainer.pipeline.stages import register_config_check, register_hook


class TeacherScorer:
    """The frozen teacher of a run and its scoring pass."""

    def __init__(self, trainer: Any):
        self.model = load_teacher(trainer.args, trainer.accelerator, trl_contact.tokenizer(trainer))

    def scores(self, trainer: Any, output: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Teacher log-probs and full-vocabulary entropy, and the old policy's log-probs at T = 1 and at the sampling
        temperature, on this rank's rows (collective under ZeRO-3: every rank runs the same number of forwards). The
        student pass happens before this batch's first update, so the current policy *is* the old one."""
        args = trainer.args
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        T = output["completion_ids"].shape[1]
        common = dict(chunk_tokens=args.teacher_chunk_tokens, micro_batch_size=args.teacher_micro_batch_size,
                      token_budget=args.micro_batch_tokens, accelerator=trainer.accelerator)
        start = time.perf_counter()
        teacher = score_tokens(self.model, input_ids, attention_mask, T, with_entropy=True, **common)
        seconds = time.perf_counter() - start
        student = score_tokens(trainer.model, input_ids, attention_mask, T, temperatures=(1.0, trainer.temperature),
                               **common)
        metrics = trl_contact.metrics(trainer)
        metrics["teacher/score_seconds"].append(seconds)
        metrics["teacher/forwards"].append(float(teacher["forwards"]))
        metrics["tokens/padded_teacher"].append(float(teacher["padded"]))  # the student's T = 1 pass pays the same
        metrics["tokens/real_teacher"].append(float(teacher["real"]))
        metrics["teacher/peak_memory_mb"].append(peak_memory_mb(input_ids.device))
        return {"teacher_logps": teacher["logps"][0], "teacher_entropy": teacher["entropy"],
                "old_logps_t1": student["logps"][0], "old_logps_sampling_t": student["logps"][1]}


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory (CUDA) or, on CPU, the process's peak resident set size, in MB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@register_hook("teacher", enabled=lambda args: "teacher" in stages.required_inputs(args))
def build_teacher_scorer(trainer: Any) -> TeacherScorer:
    """The frozen teacher exists only when a configured stage scores with it (off means off)."""
    return TeacherScorer(trainer)


@register_config_check
def check_teacher_fields(args: Any) -> None:
    """The teacher's knobs, and a teacher model wherever a configured stage reads the teacher's scores."""
    validate_teacher_fields(args, "teacher" in stages.required_inputs(args))
