"""RAGEN's low-validation-success early stop (issue 34 item 12). The oracle is upstream's loop body, transcribed from
mll-lab-nu/RAGEN@20daedc ragen/trainer/agent_trainer.py:256 (state) and 1482-1494 (update after each periodic
validation; the val_before_train validation at 972-979 never reaches it)."""

from __future__ import annotations

import collections
import json

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity, tiny_model_path
from transformers import TrainerControl, TrainerState

from trainer import trl_contact
from trainer.config.core import ConfigError, WinnowConfig
from trainer.methods.low_success_stop.hook import SUCCESS_METRIC, LowSuccessStop, LowSuccessStopCallback


def upstream_stop_index(validations: list[dict[str, float]]) -> int | None:
    """The index of the periodic validation after which upstream sets early_stopped (None if never)."""
    consecutive_low_success = collections.defaultdict(int)
    for i, val_metrics in enumerate(validations):
        for key, value in val_metrics.items():
            if key.startswith("val-env/") and key.endswith("/success"):
                if value < 0.01:
                    consecutive_low_success[key] += 1
                else:
                    consecutive_low_success[key] = 0
                if consecutive_low_success[key] >= 5:
                    return i
    return None


@pytest.mark.parametrize("seed", range(30))
def test_stop_index_matches_upstream(seed):
    g = torch.Generator().manual_seed(seed)
    # mostly failing validations with occasional successes (some just at and just below the 0.01 threshold)
    choices = torch.tensor([0.0, 0.0, 0.0, 0.005, 0.0099, 0.01, 0.2])
    values = choices[torch.randint(len(choices), (40,), generator=g)].tolist()
    monitor = LowSuccessStop(5, 0.01)
    ours = next((i for i, v in enumerate(values) if monitor.observe(v)), None)
    assert ours == upstream_stop_index([{"val-env/CoordSokoban/success": v} for v in values])


def test_hand_case():
    values = [0.0, 0.0, 0.0, 0.0, 0.01, 0.0, 0.005, 0.0, 0.0, 0.0]  # 0.01 is not below the threshold: a reset
    monitor = LowSuccessStop(5, 0.01)
    stops = [monitor.observe(v) for v in values]
    assert stops.index(True) == len(values) - 1 == upstream_stop_index([{"val-env/X/success": v} for v in values])
    restored = LowSuccessStop(5, 0.01)
    restored.load_state_dict(json.loads(json.dumps(monitor.state_dict())))  # as in winnow_stage_state.json
    assert restored.state_dict() == monitor.state_dict() and restored.triggered


def _callback(after_empty: bool, batch_ended: bool = True):
    monitor = LowSuccessStop(2, 0.01)
    return monitor, LowSuccessStopCallback(monitor, lambda: batch_ended, lambda: after_empty)


def test_step_zero_and_after_an_empty_batch_do_not_count():
    """val_before_train (step 0) and an evaluation after an empty generation batch (which upstream never validates,
    agent_trainer.py:1186) leave the counter as it is; a missing metric is a config error naming the field."""
    state, control = TrainerState(), TrainerControl()
    monitor, cb = _callback(after_empty=False)
    cb.on_evaluate(None, state, control, metrics={SUCCESS_METRIC: 0.0})  # step 0
    assert monitor.consecutive == 0
    state.global_step = 4
    monitor, cb = _callback(after_empty=True)
    cb.on_evaluate(None, state, control, metrics={SUCCESS_METRIC: 0.0})
    assert monitor.consecutive == 0
    with pytest.raises(ConfigError, match="low_success_stop_steps"):
        cb.on_evaluate(None, state, control, metrics={"eval_loss": 0.0})


def test_stop_waits_for_the_end_of_the_generation_batch():
    state, control = TrainerState(global_step=8), TrainerControl()
    ended = {"now": False}
    monitor = LowSuccessStop(1, 0.01)
    cb = LowSuccessStopCallback(monitor, lambda: ended["now"], lambda: False)
    cb.on_evaluate(None, state, control, metrics={SUCCESS_METRIC: 0.0})
    assert monitor.triggered and not control.should_training_stop
    ended["now"] = True
    cb.on_step_end(None, state, control)
    assert control.should_training_stop and control.should_save


# validation success by the step after which the evaluation runs (0 = val_before_train, not counted)
SUCCESS_BY_STEP = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.5, 4: 0.0, 5: 0.005, 6: 0.0}


def scripted_env_rollout(prompts, trainer):
    """The harness rollout, plus an environment's validation success rate logged as the multi-turn rollout logs it
    (trainer/rollout/multi_turn.py: ``env/success_rate`` in the eval metrics)."""
    out = deterministic_rollout_func(prompts, trainer)
    if not trainer.model.training:
        success = SUCCESS_BY_STEP.get(trainer.state.global_step, 0.9)
        trl_contact.metrics(trainer, "eval")["env/success_rate"].append(success)
    return out


def test_training_stops_after_three_failed_validations_and_keeps_a_checkpoint(tmp_path):
    """Evaluations after every step; success 0 before training (not counted: counting it would stop after step 2),
    then 0, 0, 0.5 (reset), 0, 0.005, 0: with low_success_stop_steps 3 the run stops after step 6 of 10, with the
    reason logged and a checkpoint of step 6 holding the counter (save_strategy is 'no': the stop's own save)."""
    from trainer.grpo_trainer import WinnowGRPOTrainer

    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "max_steps": 10}, eval_strategy="steps",
                        eval_steps=1, per_device_eval_batch_size=8, num_generations_eval=1, val_before_train=True,
                        low_success_stop_steps=3)
    trainer = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity], args=args,
                                train_dataset=prompt_dataset(64), eval_dataset=prompt_dataset(8),
                                rollout_func=scripted_env_rollout)
    trainer.train()
    evaluated = [e for e in trainer.state.log_history if SUCCESS_METRIC in e]
    assert [e["step"] for e in evaluated] == [0, 1, 2, 3, 4, 5, 6]
    assert trainer.state.global_step == 6
    reasons = [e["winnow_stop_reason"] for e in trainer.state.log_history if "winnow_stop_reason" in e]
    assert len(reasons) == 1 and "low_success_stop_steps=0" in reasons[0]
    saved = json.loads((tmp_path / "checkpoint-6" / "winnow_stage_state.json").read_text())
    assert saved["low_success_stop"] == {"consecutive": 3, "history": [0.0, 0.005, 0.0], "triggered": True}


def test_bad_settings_are_named(tmp_path):
    # without evaluations the stop never runs (upstream's check sits in its validation branch, line 1475)
    assert WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, low_success_stop_steps=5).eval_strategy == "no"
    with pytest.raises(ConfigError, match="low_success_stop_steps"):
        WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, eval_strategy="steps", eval_steps=1,
                     low_success_stop_steps=5, low_success_stop_threshold=1.5)
