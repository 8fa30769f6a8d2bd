"""Skipping optimizer steps that have nothing to train on.

When stages remove every rollout that an optimizer step would see (an SNR filter that keeps no group,
GRPODropout on a batch of one-sided groups, ...), the loss of that step is identically zero and so are
the gradients -- but ``optimizer.step()`` would still move the weights: Adam applies its first moment,
AdamW its weight decay, and both advance their moments and step counters. RAGEN's trainer skips such a step;
so do we, and we define "skip" the way HF Trainer treats a skipped fp16-overflow step:

- weights, optimizer moments and the optimizer's step counter do not change;
- the LR scheduler does not advance (HF Trainer only steps it when ``optimizer_step_was_skipped`` is
  False), so the schedule continues from where it was on the next real update;
- ``global_step`` does advance: the skipped step is one of ``max_steps``, and it is logged
  (``stages/empty_step`` = 1).

Skipping is per optimizer step, stopping per generation batch. TRL splits a generation batch over
``steps_per_generation`` micro-steps, so with ``steps_per_generation > gradient_accumulation_steps`` one
optimizer step can be empty while another of the same batch is not: trainer/pipeline/step_dealing.py deals the kept
rollouts so that this happens only when the batch kept fewer rollouts than it has steps (or, with
``filtered_updates: proportional``, for the steps beyond ceil(kept / mini-batch)). Such a step is skipped
but does not count: ``empty_batch_stop_steps`` counts consecutive generation batches with nothing to train on
(RAGEN counts iterations: mll-lab-nu/RAGEN@20daedc:ragen/trainer/agent_trainer.py:1126-1153),
and the stop -- with its checkpoint -- waits for the last optimizer step of the batch, so the save lands
on a generation-batch boundary like every other checkpoint (trainer/config/core.py's save_steps check). The
loss tokens of every micro-batch of the accumulation window, over every process, are summed at the window's last
micro-batch, before its forward (DeepSpeed steps inside ``backward``); the round counted them when it dealt its
micro-batches, in one all-reduce per generation batch (trainer/pipeline/round.py, ``typed_micro_batches``).

The skip itself is trainer/guards/step_skip.py's: plain PyTorch / DDP through HF Trainer's callbacks (gradients
dropped before ``optimizer.step()``, the scheduler's and scaler's state loaded back after it), DeepSpeed ZeRO 1-3
through the ZeRO optimizer's own overflow path (gradients cleared, no update, ``engine.skipped_steps`` + 1).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from trainer import trl_contact
from trainer.guards.stopping import stop_training


class EmptyStepGuard:
    """Skips the optimizer step of an accumulation window without loss tokens; counts empty generation
    batches for the stop."""

    def __init__(self, stop_after: int):
        self.stop_after = stop_after  # consecutive empty generation batches before training stops; 0 = never
        self.consecutive_empty_generations = 0
        self.skipped_steps = 0
        self.window_ends_generation = False  # the step about to be taken is the last of its generation batch
        self._window_tokens = 0.0

    def observe_generation(self, trainer: Any, empty: bool, updates: int) -> None:
        """Account one new generation batch: ``empty`` when no kept rollout has a loss token (the same on
        every rank: the decision is global), ``updates`` its optimizer steps that hold kept rollouts."""
        self.consecutive_empty_generations = self.consecutive_empty_generations + 1 if empty else 0
        metrics = trl_contact.metrics(trainer)
        metrics["stages/empty_generation"].append(float(empty))
        metrics["stages/consecutive_empty_generations"].append(float(self.consecutive_empty_generations))
        metrics["stages/optimizer_steps"].append(float(updates))

    def observe(self, trainer: Any, micro: Any) -> None:
        """Account one training micro-batch (a ``MicroBatch``, its loss tokens over every process counted by its
        round: trainer/pipeline/round.py); at the window's last one, decide and arm the skip. No collective: the round
        counted every micro-batch's tokens once, when it dealt them."""
        self._window_tokens += float(micro.step_tokens)
        if not trainer.accelerator.sync_gradients:
            return
        total, self._window_tokens = self._window_tokens, 0.0
        empty = total == 0.0
        if empty:
            self.skipped_steps += 1
            trainer.step_skip.arm(trainer)
        # the micro-step counter is incremented after this micro-step; a new batch is generated at a multiple
        # of steps_per_generation x num_iterations
        buffer = trainer.generation_buffer
        self.window_ends_generation = (buffer.micro_step + 1) % buffer.micro_steps_per_batch == 0
        metrics = trl_contact.metrics(trainer)
        metrics["stages/empty_step"].append(float(empty))
        metrics["stages/skipped_steps_total"].append(float(self.skipped_steps))

    def state_dict(self) -> dict[str, int]:
        """Counters to checkpoint (the token window is empty at every optimizer-step boundary)."""
        return {"consecutive_empty_generations": self.consecutive_empty_generations,
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore :meth:`state_dict`'s counters on resume."""
        self.consecutive_empty_generations = int(state.get("consecutive_empty_generations", 0))
        self.skipped_steps = int(state["skipped_steps"])

    def should_stop(self) -> bool:
        """Whether ``stop_after`` consecutive generation batches were empty and the last one is done."""
        return (
            self.stop_after > 0
            and self.consecutive_empty_generations >= self.stop_after
            and self.window_ends_generation
        )


class EmptyStepStopCallback(TrainerCallback):
    """Ends training after ``empty_batch_stop_steps`` consecutive empty generation batches, saying why."""

    def __init__(self, guard: EmptyStepGuard, args: Any):
        self.guard = guard
        self.filter_name = args.rollout_filter
        self.dropout_name = args.rollout_dropout

    def on_step_end(self, args, state, control, **kwargs):
        if self.guard.should_stop() and not control.should_training_stop:
            message = (
                f"winnow-rl: stopping at step {state.global_step}: the last "
                f"{self.guard.consecutive_empty_generations} generation batches had no rollout left to train on "
                f"(rollout_filter={self.filter_name!r}, rollout_dropout={self.dropout_name!r}); their optimizer steps "
                "were skipped. Typical cause: every prompt group has (near) zero reward variance -- the task is "
                "solved or hopeless for this policy. Raise the task's difficulty range, set snr_include_zero=True or "
                "a softer snr_strategy, or empty_batch_stop_steps=0 (formerly snr_empty_stop_steps) to keep going."
            )
            stop_training(state, control, message)
        return control
