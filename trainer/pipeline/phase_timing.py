"""Where a step goes: per-phase wall time, logged once per optimizer step as ``timing_s/<phase>`` (verl's
``timing_s/*``), so a generation-bound run can be told from a trainer-bound one.

Phases are disjoint wall-clock seconds of this process: ``generation`` (TRL's generation and scoring of a batch,
``_generate_and_score_completions``, less the phases timed inside it: so the generation request, or the wait for an
overlapped one, with TRL's tokenising, decoding and padding around it), ``weight_sync`` (vLLM server weight push),
``reward`` (reward functions), ``old_logps`` / ``ref_logps`` (the no-grad log-prob passes), ``teacher_scoring``,
``collapse_check``, ``stage_pipeline`` (filter -> dropout -> advantage and the batch re-deal), ``loss_fwd_bwd`` (the
micro-steps' forward + backward, everything of ``training_step`` outside the generation phase) and ``optimizer``
(``optimizer.step``). A phase that did not run in a step is not logged for it (generation runs once per generation
batch). Only transformers' callback hooks and the trainer's own methods are used; no CUDA synchronisation is added
(on GPU a phase's time is where the host waited, as in verl's timers).
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

from transformers import TrainerCallback

from trainer import trl_contact

PREFIX = "timing_s/"


class PhaseTimer:
    """Seconds per phase, accumulated over one optimizer step and then flushed into the trainer's metrics."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._optimizer_start: float | None = None
        self.prepare_seconds = 0.0  # running total inside _prepare_inputs (subtracted from loss_fwd_bwd)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    @contextmanager
    def phase_less_inner(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block, less the phases timed inside it, to ``name``."""
        start, inner = time.perf_counter(), sum(self.seconds.values())
        try:
            yield
        finally:
            spent = time.perf_counter() - start - (sum(self.seconds.values()) - inner)
            self.seconds[name] += spent

    def optimizer_started(self) -> None:
        """Mark the start of ``optimizer.step`` (transformers' pre-optimizer hook)."""
        self._optimizer_start = time.perf_counter()

    def optimizer_done(self) -> None:
        """Add the seconds since :meth:`optimizer_started` to ``optimizer`` (nothing if it was not called)."""
        if self._optimizer_start is not None:
            self.seconds["optimizer"] += time.perf_counter() - self._optimizer_start
            self._optimizer_start = None

    def flush(self, metrics: dict[str, list]) -> None:
        """Append this step's totals (``timing_s/*``) and start the next step."""
        for name, seconds in self.seconds.items():
            metrics[PREFIX + name].append(seconds)
        self.seconds.clear()


class PhaseTimingCallback(TrainerCallback):
    """Times ``optimizer.step`` (between transformers' pre/post optimizer hooks) and flushes each step's phases
    before the step is logged."""

    def __init__(self, timer: PhaseTimer, trainer: Any):
        self.timer, self.trainer = timer, trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.timer.optimizer_started()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.timer.optimizer_done()

    def on_step_end(self, args, state, control, **kwargs):
        self.timer.flush(trl_contact.metrics(self.trainer))
