"""The ``ppo_critic`` method hook (trainer/pipeline/stages.py) builds the critic when ``advantage: gae`` and trains it.

At the trainer's points: ``train_micro_batch`` (every training micro-batch, after the policy's loss: the critic's
value loss, backward), a callback that steps the critic's optimizer right after the policy's optimizer step (and drops
its gradient when the policy's step was skipped), and ``save_checkpoint`` / ``load_checkpoint`` (its weights and
optimizer state in each checkpoint's ``critic/`` folder).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from trainer import trl_contact
from trainer.methods.ppo.critic import HOOK_KEY, Critic
from trainer.pipeline.stages import register_hook

CHECKPOINT_FOLDER = "critic"


class CriticHook:
    """The critic of a run at the trainer's points (module doc)."""

    def __init__(self, trainer: Any):
        self.critic = Critic(trainer)

    def old_values(self, output: dict[str, Any], rows_per_forward: int):
        """The critic's values of this rank's rows before the update (the ``old_values`` row input)."""
        return self.critic.old_values(output, rows_per_forward)

    def train_micro_batch(self, trainer: Any, inputs: dict[str, Any], call: Any) -> None:
        """The value loss of one training micro-batch, backward into the critic's gradient; its statistics go to
        the step's logged metrics through ``call.recorder`` (reduced over processes once)."""
        stats = self.critic.train_micro_batch(trainer, inputs)
        for key, (total, count) in stats.items():
            call.recorder.mean(key, total, count)

    def save_checkpoint(self, trainer: Any, folder: str) -> None:
        """The critic's weights and optimizer state into ``folder/critic``."""
        self.critic.save(os.path.join(folder, CHECKPOINT_FOLDER))

    def load_checkpoint(self, trainer: Any, folder: str) -> None:
        """Restore the critic from ``folder/critic`` (a checkpoint without one is refused: it was not a PPO run)."""
        path = os.path.join(folder, CHECKPOINT_FOLDER)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{folder} holds no critic ({CHECKPOINT_FOLDER}/): it was not written by a run "
                                    "with advantage: gae, so PPO cannot resume from it")
        self.critic.load(path)


class CriticStepCallback(TrainerCallback):
    """Steps the critic right after the policy's optimizer step, or drops its gradient when that step was skipped."""

    def __init__(self, hook: CriticHook, trainer: Any):
        self.hook, self.trainer = hook, trainer

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.trainer.step_skip.step_was_skipped(self.trainer):
            self.hook.critic.skip_step()
            return
        norm = self.hook.critic.step()
        if norm is not None:
            trl_contact.metrics(self.trainer)["critic/grad_norm"].append(norm)


@register_hook(HOOK_KEY, enabled=lambda args: getattr(args, "advantage", None) == "gae",
               points=("train_micro_batch", "save_checkpoint", "load_checkpoint"))
def build(trainer: Any) -> CriticHook:
    """The critic of a PPO run, and the callback that steps it."""
    hook = CriticHook(trainer)
    trainer.add_callback(CriticStepCallback(hook, trainer))
    return hook
