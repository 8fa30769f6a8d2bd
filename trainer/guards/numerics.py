"""Skip an optimizer step whose loss or gradient is not finite, so no NaN or inf ever reaches the weights.

The stages are written to stay finite on every input they can meet (zero-variance groups, unscorable
rollouts, single-token completions, extreme surprisal -- tests/grpo_trainer/test_numerics_guard.py feeds each of them
through every stage), and reward functions that return inf/NaN are stopped by the reward guard. This is the
last line: if a loss or a gradient is ever non-finite anyway -- a numerically broken model, a custom stage,
an overflow -- the optimizer step of that accumulation window is skipped the way an empty step is
(trainer/guards/step_skip.py: weights, optimizer moments and LR schedule unchanged, ``global_step`` advances),
with one warning line naming the step and the cause, and ``numerics/skipped_steps_total`` counts it.

Detection: the loss of every training micro-batch (collective: one scalar MAX all-reduce, so every rank
skips together) and, outside DeepSpeed, the gradients right before ``optimizer.step`` (after DDP's
all-reduce the gradients are the same on every rank, so every rank decides alike without a collective).
Under DeepSpeed the optimizer steps inside ``backward`` and gradients are partitioned: the loss check arms
the ZeRO optimizer's own overflow path before that.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.nn.utils import get_total_norm
from transformers import TrainerCallback

from trainer import trl_contact

logger = logging.getLogger(__name__)


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
