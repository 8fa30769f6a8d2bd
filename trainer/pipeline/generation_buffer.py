"""The generation batch being trained (its :class:`~trainer.pipeline.round.Round`) and the micro-step counter that
picks its micro-batch.

TRL 1.16 keeps both as privates of its trainer (``_buffered_inputs``, ``_step``; trl==1.16.0:
trl/trainer/grpo_trainer.py:948-951, 1513, 1538-1546) and fills them inside its ``_prepare_inputs``. winnow re-deals
a batch's rows over its optimizer steps after the split (trainer/pipeline/step_dealing.py), skips micro-batches that
train nothing, and checkpoints the batch for an exact resume (trainer/guards/generation_resume.py); done on TRL's
privates, each of those wrote TRL's state from outside. This object owns them instead: the trainer's
``_prepare_inputs`` asks TRL for a generation batch when :meth:`GenerationBuffer.due`, :meth:`fill`\\s the buffer
with the batch's round (trainer/pipeline/round.py), which deals it, and its ``training_step`` calls :meth:`advance`
after every micro-step, trained or skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the round imports the dealing, which this counter needs none of
    from trainer.pipeline.round import MicroBatch, Round


class GenerationBuffer:
    """A generation batch's ``steps_per_generation`` (S) micro-batches, replayed ``num_iterations`` (mu) times, and
    the run's micro-step counter. A new batch is due every S x mu micro-steps, and when nothing is buffered (a run's
    start, or a resume on a batch boundary). Checkpointed state (the stages.Checkpointed protocol): the counter."""

    def __init__(self, steps_per_generation: int, num_iterations: int):
        self.steps_per_generation = int(steps_per_generation)
        self.num_iterations = int(num_iterations)
        self.micro_step = 0  # micro-steps trained (or skipped) so far in this run
        self.round: Round | None = None  # the generation batch being trained

    @property
    def micro_steps_per_batch(self) -> int:
        """S x mu: the micro-steps one generation batch trains (TRL's ``generate_every``)."""
        return self.steps_per_generation * self.num_iterations

    @property
    def micro_batches(self) -> list[MicroBatch] | None:
        """The round's micro-batches, in order of use (None before the first round)."""
        return None if self.round is None else self.round.micro_batches

    def due(self) -> bool:
        """Whether the next micro-step needs a new generation batch."""
        return self.round is None or self.micro_step % self.micro_steps_per_batch == 0

    def at_batch_boundary(self) -> bool:
        """Whether the micro-steps so far end a generation batch (the next one generates)."""
        return self.micro_step % self.micro_steps_per_batch == 0

    def fill(self, round_: Round) -> None:
        """Buffer a new generation batch's round (dealt by its ``run`` after this, or restored already dealt)."""
        self.round = round_

    def current(self) -> MicroBatch:
        """The micro-batch of the current micro-step."""
        batches = self.micro_batches
        if batches is None:
            raise RuntimeError("no generation batch is buffered: call fill() when due() says so")
        if len(batches) != self.steps_per_generation:
            raise ValueError(f"a generation batch splits into steps_per_generation={self.steps_per_generation} "
                             f"micro-batches, got {len(batches)}")
        return batches[self.micro_step % self.steps_per_generation]

    def advance(self) -> None:
        """Count one micro-step (after its backward, or after it was skipped)."""
        self.micro_step += 1

    def state_dict(self) -> dict[str, int]:
        """The counter (global_step x gradient_accumulation_steps at a checkpoint)."""
        return {"micro_step": self.micro_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Set the counter back to a checkpoint's value (the batch itself is restored by generation_resume)."""
        self.micro_step = int(state["micro_step"])
