"""One skipped optimizer step, taken through HF Trainer's callbacks and public torch APIs.

A skipped step (an empty window, trainer/guards/empty_steps.py; a non-finite loss or gradient,
trainer/guards/numerics.py) leaves the weights, the optimizer's moments and step counters, the LR schedule and an
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
"""

from __future__ import annotations

import copy
from typing import Any

from transformers import TrainerCallback

from trainer import trl_contact

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
