"""Optimizer steps that must not train -- an empty one (:class:`EmptyStepGuard`) or a non-finite one
(:class:`NonFiniteGuard`) -- and the skip itself, taken through HF Trainer's callbacks and public torch APIs.

## The skip

A skipped step leaves the weights, the optimizer's moments and step counters, the LR schedule and an
fp16 GradScaler's scale as they were; ``global_step`` advances. HF Trainer has no skip hook: it calls
``optimizer.step()`` and then steps the LR scheduler unless accelerate reports the step skipped. So, outside
DeepSpeed, :class:`StepSkipCallback` acts around that call:

- ``on_pre_optimizer_step``: it saves the LR scheduler's ``state_dict()``, each param group's ``lr`` and the
  scaler's ``state_dict()``, then drops every gradient (``zero_grad(set_to_none=True)``). torch's optimizers skip a
  parameter whose ``.grad`` is None entirely (no moment, step-counter or weight-decay update; so does transformers'
  Adafactor: tests/grpo_trainer/test_step_skip_optimizers.py), so HF's ``optimizer.step()`` that follows changes
  nothing. Under an fp16 scaler the step still runs the scaler's ``step`` / ``update``, which asserts unless an inf
  check was recorded before the gradients went: HF records it, because it reads the gradient norm through accelerate's
  ``clip_grad_norm_`` before this event whatever ``max_grad_norm`` is (with an infinite bound at 0:
  ``Trainer._get_grad_norm`` in transformers 5.10, 5.17, 5.24 and 5.25, the newest on PyPI in pyproject's pin), which
  unscales; an empty window runs its zero-weight rows' forward and backward under a scaler, so there are gradients
  to check (trainer/grpo_trainer.py ``_training_step``). (transformers reads the norm of gradients on several DTensor
  meshes without accelerate, so nothing unscales them: a skip under an fp16 scaler there would reach ``scaler.step``
  with no inf check; untested, as is every such mesh here.)
- ``on_step_end`` (after HF stepped the scheduler): the saved scheduler state and learning rates are loaded back, and
  the scaler's state with them -- unchanged for an empty step, backed off as after the scaler's own overflow step
  (scale x ``backoff_factor``, growth tracker 0) for a non-finite one.

Every object is only read and reloaded through its own public API; the checkpoints keep their format. Under
DeepSpeed the optimizer steps inside ``backward``, before any callback: :func:`arm_zero_skip` routes that one step
through the ZeRO optimizer's own overflow branch, the only skip DeepSpeed has (two stores on DeepSpeed's optimizer,
listed in tests/contracts/test_no_runtime_patches.py).

## Empty steps: nothing to train on

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
optimizer step can be empty while another of the same batch is not: trainer/algorithms/deal_plan.py deals the kept
rollouts so that this happens only when the batch kept fewer rollouts than it has steps (or, with
``filtered_updates: proportional``, for the steps beyond ceil(kept / mini-batch)). Such a step is skipped
but does not count: ``empty_batch_stop_steps`` counts consecutive generation batches with nothing to train on
(RAGEN counts iterations: mll-lab-nu/RAGEN@20daedc:ragen/trainer/agent_trainer.py:1126-1153),
and the stop -- with its checkpoint -- waits for the last optimizer step of the batch, so the save lands
on a generation-batch boundary like every other checkpoint (trainer/config/core.py's save_steps check). The
loss tokens of every micro-batch of the accumulation window, over every process, are summed at the window's last
micro-batch, before its forward (DeepSpeed steps inside ``backward``); the round counted them when it dealt its
micro-batches, in one all-reduce per generation batch (trainer/pipeline/round.py, ``typed_micro_batches``).

## Non-finite steps: no NaN or inf ever reaches the weights

The stages are written to stay finite on every input they can meet (zero-variance groups, unscorable
rollouts, single-token completions, extreme surprisal -- tests/grpo_trainer/test_numerics_guard.py feeds each of them
through every stage), and reward functions that return inf/NaN are stopped by the reward guard. This is the
last line: if a loss or a gradient is ever non-finite anyway -- a numerically broken model, a custom stage,
an overflow -- the optimizer step of that accumulation window is skipped the way an empty step is
(weights, optimizer moments and LR schedule unchanged, ``global_step`` advances),
with one warning line naming the step and the cause, and ``numerics/skipped_steps_total`` counts it.

Detection: the loss of every training micro-batch (collective: one scalar MAX all-reduce, so every rank
skips together) and, outside DeepSpeed, the gradients right before ``optimizer.step`` (after DDP's
all-reduce the gradients are the same on every rank, so every rank decides alike without a collective).
Under DeepSpeed the optimizer steps inside ``backward`` and gradients are partitioned: the loss check arms
the ZeRO optimizer's own overflow path before that.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from torch.nn.utils import get_total_norm
from transformers import TrainerCallback

from trainer import trl_contact
from trainer.guards.stopping import stop_training

logger = logging.getLogger(__name__)

EMPTY, OVERFLOW = "empty", "overflow"


def deepspeed_optimizer(trainer: Any) -> Any | None:
    """The ZeRO optimizer of a DeepSpeed run, None otherwise."""
    engine = getattr(trainer.accelerator, "deepspeed_engine_wrapped", None)
    return None if engine is None else engine.engine.optimizer


class OptimizerStepSkip:
    """The trainer's one pending skip: armed during the window, taken around HF's ``optimizer.step()``."""

    def __init__(self) -> None:
        self.armed: str | None = None  # EMPTY or OVERFLOW until the step is taken (OVERFLOW wins)
        self.taken = False  # the current step was skipped here (read by on_optimizer_step callbacks)
        self._saved: tuple[list[float], dict | None, dict | None] | None = None

    def arm(self, trainer: Any, overflow: bool = False) -> None:
        """Skip the next optimizer step of ``trainer``. ``overflow``: its loss or gradient is non-finite, which an
        fp16 scaler must count as an overflow (backing off its scale) where an empty step leaves it as it was."""
        zero = deepspeed_optimizer(trainer)
        if zero is not None:
            arm_zero_skip(zero)
            return
        self.armed = OVERFLOW if overflow or self.armed == OVERFLOW else EMPTY

    def before_step(self, trainer: Any) -> None:
        """``on_pre_optimizer_step``: save what the step and the scheduler would move, drop the gradients."""
        self.taken = False
        if self.armed is None:
            return
        optimizer = trainer.optimizer  # accelerate's AcceleratedOptimizer
        groups = optimizer.optimizer.param_groups
        lrs = [group["lr"] for group in groups]
        schedule = None if trainer.lr_scheduler is None else copy.deepcopy(trainer.lr_scheduler.state_dict())
        scaler = getattr(trainer.accelerator, "scaler", None)
        scaling = None
        if scaler is not None and scaler.is_enabled():
            # The scaler's inf check is already recorded: HF reads the gradient norm through accelerate's
            # clip_grad_norm_ (max_grad_norm, or inf to only read it), which unscales, before this event.
            scaling = scaler.state_dict()
            if self.armed == OVERFLOW:
                scaling.update(scale=scaling["scale"] * scaling["backoff_factor"], _growth_tracker=0)
        optimizer.zero_grad(set_to_none=True)
        self._saved = (lrs, schedule, scaling)
        self.armed, self.taken = None, True

    def after_step(self, trainer: Any) -> None:
        """``on_step_end``: the scheduler, learning rates and scaler back to the saved (or backed-off) state."""
        if self._saved is None:
            return
        (lrs, schedule, scaling), self._saved = self._saved, None
        if schedule is not None:
            trainer.lr_scheduler.load_state_dict(schedule)
        for group, lr in zip(trainer.optimizer.optimizer.param_groups, lrs):
            group["lr"] = lr
        if scaling is not None:
            trainer.accelerator.scaler.load_state_dict(scaling)

    def step_was_skipped(self, trainer: Any) -> bool:
        """Whether the optimizer step just taken was skipped: here, by the scaler's own overflow check, or by
        DeepSpeed (accelerate's flag covers the last two)."""
        return self.taken or bool(trainer.accelerator.optimizer_step_was_skipped)


class StepSkipCallback(TrainerCallback):
    """Takes an armed skip around HF Trainer's ``optimizer.step()`` (added after the callbacks that arm one there:
    the non-finite gradient check runs on the same event)."""

    def __init__(self, trainer: Any, skip: OptimizerStepSkip):
        self.trainer, self.skip = trainer, skip

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.skip.before_step(self.trainer)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.skip.after_step(self.trainer)
        return control


def arm_zero_skip(optimizer: Any) -> None:
    """One ZeRO optimizer step through its overflow path: gradients cleared, no update, no loss-scale change (the
    policy's skipped step, and PPO's critic engine at the same step: trainer/methods/ppo/critic.py).

    The engine then counts a skipped step and does not advance its scheduler, and accelerate reports
    ``step_was_skipped`` from ``optimizer.overflow`` so HF Trainer keeps its LR too. The ZeRO stages keep
    gradient partitions of their own, so clearing ``param.grad`` alone would not be enough; and ZeRO-3 checks its
    gradients for overflow only under fp16, so a bf16 step cannot be sent down that path by its gradients: the step
    is replaced for one call."""
    if not hasattr(optimizer, "overflow"):
        raise NotImplementedError(
            f"skipping an empty step is implemented for DeepSpeed ZeRO optimizers, not {type(optimizer).__name__}"
        )

    def skipped_step(*args: Any, **kwargs: Any) -> None:
        del optimizer.step
        optimizer.overflow = True
        if trl_contact.zero_overflow_clean_up(optimizer):  # ZeRO-3
            return
        optimizer.zero_grad(set_to_none=True)  # ZeRO-1/2, mirroring its overflow branch
        trl_contact.zero_release_grad_buffers(optimizer)
        if getattr(optimizer, "cpu_offload", False):
            optimizer.reset_cpu_buffers()
        else:
            for key in list(getattr(optimizer, "averaged_gradients", {})):
                optimizer.averaged_gradients[key] = None
                optimizer.all_grad_tensors[key] = None

    optimizer.step = skipped_step


# -- empty steps ------------------------------------------------------------------------------------------------------

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


# -- non-finite steps -------------------------------------------------------------------------------------------------

class NonFiniteGuard:
    """Arms a one-off optimizer-step skip when a loss or gradient of the current window is non-finite."""

    def __init__(self) -> None:
        self.skipped_steps = 0
        self._reason: str | None = None

    def observe_loss(self, trainer: Any, loss: torch.Tensor) -> None:
        """Check one micro-batch's loss (collective: every rank must call it for every training micro-batch)."""
        bad = torch.tensor(float(not bool(torch.isfinite(loss.detach()).all())), device=loss.device)
        acc = trainer.accelerator
        if acc.num_processes > 1:
            bad = acc.reduce(bad, reduction="max")
        if float(bad) > 0 and self._reason is None:
            self._arm(trainer, f"non-finite loss ({float(loss.detach().float().mean())}) on at least one process")

    def check_gradients(self, trainer: Any) -> None:
        """Before the optimizer step (not under DeepSpeed): arm the skip if any gradient is non-finite."""
        if self._reason is not None:
            return
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        # Fast path: one fused L2 norm of every gradient and one host sync (a NaN or inf anywhere makes it non-finite;
        # the max-|g| norm would say the same but is ~15x slower on CPU, bench/step_overhead.py). Only when it is not
        # finite are the gradients checked one by one: that names the bad parameter, and a norm that merely
        # overflowed on huge but finite gradients arms nothing (the check stays "any gradient non-finite").
        if not grads or bool(torch.isfinite(get_total_norm(grads, norm_type=2.0))):
            return
        for name, param in trainer.model.named_parameters():
            if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
                self._arm(trainer, f"non-finite gradient in {name}")
                return

    def end_step(self, trainer: Any) -> None:
        """After the optimizer step: log, and ready the check for the next window."""
        metrics = trl_contact.metrics(trainer)
        metrics["numerics/nonfinite_step"].append(float(self._reason is not None))
        metrics["numerics/skipped_steps_total"].append(float(self.skipped_steps))
        self._reason = None

    def _arm(self, trainer: Any, reason: str) -> None:
        self._reason = reason
        self.skipped_steps += 1
        trainer.step_skip.arm(trainer, overflow=True)
        step = trainer.state.global_step + 1
        logger.warning(
            "winnow-rl: step %d: %s; the optimizer step is skipped (weights, optimizer state and LR schedule "
            "unchanged; %d such step(s) so far). If this repeats, lower the learning rate or check the model's "
            "dtype and the reward functions.", step, reason, self.skipped_steps,
        )

    def state_dict(self) -> dict[str, int]:
        """The counter, for checkpoints."""
        return {"skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore :meth:`state_dict` on resume."""
        self.skipped_steps = int(state["skipped_steps"])


class NonFiniteStepCallback(TrainerCallback):
    """Runs the gradient check right before ``optimizer.step`` and the bookkeeping after it."""

    def __init__(self, trainer: Any, guard: NonFiniteGuard):
        self.trainer, self.guard = trainer, guard

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if not self.trainer.is_deepspeed_enabled:
            self.guard.check_gradients(self.trainer)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.guard.end_step(self.trainer)
        return control
