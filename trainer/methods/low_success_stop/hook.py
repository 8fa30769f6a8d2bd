"""RAGEN's low-validation-success early stop (``low_success_stop_steps``).

Upstream (mll-lab-nu/RAGEN@20daedc ragen/trainer/agent_trainer.py:256, 1474-1499): after each periodic validation
(every ``test_freq`` iterations and at the last one; the ``val_before_train`` validation at lines 972-979 does not
count), every ``val-env/<tag>/success`` value -- the share of that environment's validation episodes that succeeded
(es_manager.py:300, averaged in ctx_manager.py:417-420) -- below 0.01 adds one to that environment's counter and any
other value resets it; when a counter reaches 5 the run stops (``early_stopped/low_validation_success``). An
iteration left empty by the filter never reaches the validation (its ``continue`` at line 1186 comes first), so it
neither counts nor resets.

Here a run has one environment, whose validation success is TRL's eval metric ``env/success_rate`` (the share of
the ``env_eval_levels`` held-out episodes that succeeded, trainer/rollout/multi_turn.py). Evaluations at step 0
(``val_before_train``) and evaluations right after an empty generation batch are not counted; without evaluations
the stop never runs (upstream's check sits in its validation branch, line 1475). As the
reward-variance stop (trainer/methods/reward_variance_stop/hook.py), the stop takes effect at the end of a generation
batch -- at once when the evaluation falls on a batch boundary, as the RAGEN recipes' ``eval_steps`` do -- with a
message naming the knob and a checkpoint (upstream breaks at line 1499, before its save at 1501-1503, and keeps
none). The counter is saved in checkpoints (``winnow_stage_state.json``).
"""

from __future__ import annotations

from typing import Any, Callable

from transformers import TrainerCallback

from trainer.config.errors import ConfigError
from trainer.guards.stopping import stop_training
from trainer.pipeline.stages import register_config_check, register_hook

# TRL prefixes evaluation metrics with "eval_"; the multi-turn rollout logs env/success_rate (multi_turn.py _log)
SUCCESS_METRIC = "eval_env/success_rate"


class LowSuccessStop:
    """Upstream's rule: ``steps`` evaluations in a row with success below ``threshold`` stop training."""

    def __init__(self, steps: int = 5, threshold: float = 0.01):
        self.steps, self.threshold = steps, threshold
        self.consecutive = 0
        self.history: list[float] = []  # the counted values of the current run of failures (for the message)
        self.triggered = False

    def observe(self, success: float) -> bool:
        """Count one evaluation's success rate; True when training should stop."""
        if success < self.threshold:
            self.consecutive += 1
            self.history.append(float(success))
        else:
            self.consecutive, self.history = 0, []
        if self.consecutive >= self.steps:
            self.triggered = True
        return self.triggered

    def state_dict(self) -> dict[str, Any]:
        """Counter and flag, for checkpoints."""
        return {"consecutive": self.consecutive, "history": list(self.history), "triggered": self.triggered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` on resume."""
        self.consecutive = int(state["consecutive"])
        self.history = [float(v) for v in state["history"]]
        self.triggered = bool(state["triggered"])


class LowSuccessStopCallback(TrainerCallback):
    """Feeds each counted evaluation to :class:`LowSuccessStop` and stops training at the end of the generation
    batch in which it triggered. ``batch_ended``: the step just taken ends a generation batch; ``after_empty``: the
    latest generation batch had nothing to train on (upstream validates no such iteration)."""

    def __init__(self, monitor: LowSuccessStop, batch_ended: Callable[[], bool], after_empty: Callable[[], bool]):
        self.monitor, self.batch_ended, self.after_empty = monitor, batch_ended, after_empty

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics is None or SUCCESS_METRIC not in metrics:
            raise ConfigError("low_success_stop_steps", f"the evaluation logged no {SUCCESS_METRIC} (only "
                              "environment tasks, dataset_name sokoban | frozenlake, log a success rate)",
                              "set low_success_stop_steps: 0 for this task")
        if state.global_step > 0 and not self.after_empty():
            self.monitor.observe(float(metrics[SUCCESS_METRIC]))
        return self._maybe_stop(state, control)

    def on_step_end(self, args, state, control, **kwargs):
        return self._maybe_stop(state, control)

    def _maybe_stop(self, state, control):
        if self.monitor.triggered and self.batch_ended() and not control.should_training_stop:
            m = self.monitor
            message = (
                f"winnow-rl: stopping at step {state.global_step}: validation success stayed below {m.threshold:g} "
                f"for {m.steps} evaluations in a row: {[round(v, 6) for v in m.history[-m.steps:]]} (RAGEN's "
                "low-validation-success stop). Set low_success_stop_steps=0 to keep going."
            )
            stop_training(state, control, message)
        return control


@register_hook("low_success_stop", enabled=lambda args: args.low_success_stop_steps > 0)
def build_low_success_stop(trainer: Any) -> LowSuccessStop:
    """RAGEN's low-validation-success stop, and its callback (evaluations after an empty generation batch are not
    counted, as upstream validates no such iteration)."""
    args = trainer.args
    stop = LowSuccessStop(args.low_success_stop_steps, args.low_success_stop_threshold)
    trainer.add_callback(LowSuccessStopCallback(stop, trainer.generation_buffer.at_batch_boundary,
                                                trainer.last_generation_was_empty))
    return stop


@register_config_check
def check_low_success_stop_fields(args: Any) -> None:
    """The stop counts evaluations and compares a success rate in [0, 1]."""
    if args.low_success_stop_steps < 0 or not 0 <= args.low_success_stop_threshold <= 1:
        raise ConfigError("low_success_stop_steps", f"needs steps >= 0 and 0 <= low_success_stop_threshold <= 1 "
                          f"(got {args.low_success_stop_steps}, {args.low_success_stop_threshold})",
                          "use RAGEN's 5 and 0.01, or 0 steps to turn it off")
