"""RAGEN's reward-variance collapse early stop (``reward_variance_stop_steps``).

Upstream (mll-lab-nu/RAGEN@20daedc ragen/trainer/agent_trainer.py:251-258, 1209-1242): after every training
iteration that was not skipped as empty, the batch's mean within-group reward standard deviation
(``rollout/in_group_reward_std``: unbiased std of each prompt group's episode rewards, penalties included, averaged
over all groups before filtering) is recorded. The first 10 such values set the baseline (their mean); after that,
training stops once 10 consecutive values are all below 0.1 x baseline. Here one iteration is one generation
batch; the stop takes effect at the end of that batch's last optimizer step, with a message naming the knob.
Upstream checks before the update (agent_trainer.py:1210-1236) and breaks at 1241, so the iteration that triggers the
stop is never trained there; here it is trained, then the run stops and saves (a deliberate difference:
docs/ragen-fidelity.md). "The end of a batch" is read from the trainer's micro-step counter (a
multiple of steps_per_generation x num_iterations after the step; trainer/pipeline/round.py), not from
``global_step``: the counter is what decides when a batch is generated, and it is checkpointed and restored on resume;
when a step spans two batches (S x mu not a multiple of A) the stop waits for the first step that ends on a batch
boundary, so its checkpoint resumes without a saved batch. State is saved in checkpoints
(``winnow_stage_state.json``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch
from transformers import TrainerCallback

from trainer import trl_contact
from trainer.config.errors import ConfigError
from trainer.guards.stopping import stop_training
from trainer.pipeline.stages import register_config_check, register_hook


def mean_group_reward_std(rewards: torch.Tensor, group_size: int) -> float:
    """Mean over prompt groups of the unbiased std of their rewards (rows grouped contiguously, as TRL orders them;
    NaN rewards, i.e. unscorable rollouts, are left out of their group)."""
    groups = rewards.detach().double().reshape(-1, group_size)
    stds = []
    for row in groups:
        row = row[~torch.isnan(row)]
        stds.append(float(row.std(unbiased=True)) if row.numel() > 1 else 0.0)
    return sum(stds) / len(stds)


class RewardVarianceStop:
    """Upstream's baseline-then-window rule on the per-iteration mean group reward std."""

    def __init__(self, steps: int = 10, ratio: float = 0.1):
        self.steps, self.ratio = steps, ratio
        self.first: list[float] = []
        self.base: float | None = None
        self.window: deque[float] = deque(maxlen=steps)
        self.triggered = False

    def observe(self, value: float) -> bool:
        """Record one non-empty iteration's value; True when training should stop."""
        if len(self.first) < self.steps:
            self.first.append(float(value))
            if len(self.first) == self.steps:
                self.base = sum(self.first) / self.steps
                self.window.clear()  # the collapse window starts once the baseline exists
            return self.triggered
        self.window.append(float(value))
        if len(self.window) == self.steps and all(v < self.ratio * self.base for v in self.window):
            self.triggered = True
        return self.triggered

    def after_decision(self, trainer: Any, decision: Any) -> None:
        """The trainer's hook point (trainer/pipeline/stages.py): record the generation batch's mean within-group
        reward std (weighted total reward, all groups before filtering), for non-empty iterations only (upstream
        counts those)."""
        if not bool(decision.keep.any()):
            return
        R_k = trainer.global_rewards_per_func
        rewards = (R_k * trainer.reward_weights.to(R_k.device).unsqueeze(0)).nansum(dim=1)
        value = mean_group_reward_std(rewards, trainer.num_generations)
        self.observe(value)
        trl_contact.metrics(trainer)["reward_variance_stop/mean_group_reward_std"].append(value)

    def state_dict(self) -> dict[str, Any]:
        """Baseline, window and flag, for checkpoints."""
        return {"first": list(self.first), "base": self.base, "window": list(self.window), "triggered": self.triggered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` on resume."""
        self.first = [float(v) for v in state["first"]]
        self.base = state["base"]
        self.window = deque((float(v) for v in state["window"]), maxlen=self.steps)
        self.triggered = bool(state["triggered"])


class RewardVarianceStopCallback(TrainerCallback):
    """Stops training at the end of the generation batch in which :class:`RewardVarianceStop` triggered."""

    def __init__(self, monitor: RewardVarianceStop, batch_ended: Callable[[], bool]):
        self.monitor, self.batch_ended = monitor, batch_ended  # batch_ended: the step just taken ends a batch

    def on_step_end(self, args, state, control, **kwargs):
        if self.monitor.triggered and self.batch_ended() and not control.should_training_stop:
            m = self.monitor
            message = (
                f"winnow-rl: stopping at step {state.global_step}: reward variance collapsed -- the mean within-group "
                f"reward std stayed below {m.ratio:g} x its baseline {m.base:.6g} (mean of the first {m.steps} "
                f"non-empty iterations) for {m.steps} iterations in a row: {[round(v, 6) for v in m.window]} "
                "(RAGEN's early stop). Set reward_variance_stop_steps=0 to keep going."
            )
            stop_training(state, control, message)
        return control


class EvaluateBeforeTrainingCallback(TrainerCallback):
    """``val_before_train``: one evaluation before the first update (RAGEN's trainer.val_before_train, set True in
    its main-table script, agent_trainer.py:972-973), so a run's curve starts at the untrained policy. Skipped on
    resume (global_step > 0), as upstream validates only at step 0 of a fresh run's loop."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.trainer.evaluate()
        return control


@register_hook("reward_variance_stop", enabled=lambda args: args.reward_variance_stop_steps > 0,
               points=("after_decision",))
def build_reward_variance_stop(trainer: Any) -> RewardVarianceStop:
    """RAGEN's reward-variance stop, and its callback ending training at the end of a generation batch (the
    trainer's micro-step counter decides when it generates)."""
    args = trainer.args
    stop = RewardVarianceStop(args.reward_variance_stop_steps, args.reward_variance_stop_ratio)
    trainer.add_callback(RewardVarianceStopCallback(stop, trainer.generation_buffer.at_batch_boundary))
    return stop


@register_hook("val_before_train", enabled=lambda args: args.val_before_train)
def build_evaluate_before_training(trainer: Any) -> None:
    """``val_before_train``: a callback only (nothing to checkpoint)."""
    trainer.add_callback(EvaluateBeforeTrainingCallback(trainer))


@register_config_check
def check_reward_variance_stop_fields(args: Any) -> None:
    """The stop's window and ratio; the evaluation before training needs an evaluation schedule."""
    if args.reward_variance_stop_steps < 0 or not 0 < args.reward_variance_stop_ratio < 1:
        raise ConfigError("reward_variance_stop_steps", f"needs steps >= 0 and 0 < reward_variance_stop_ratio < 1 "
                          f"(got {args.reward_variance_stop_steps}, {args.reward_variance_stop_ratio})",
                          "use RAGEN's 10 and 0.1, or 0 steps to turn it off")
    if args.val_before_train and str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "no":
        raise ConfigError("val_before_train", "needs an evaluation set and schedule", "set eval_strategy: steps "
                          "(environment tasks then validate on env_eval_levels held-out levels)")
