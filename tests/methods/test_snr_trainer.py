"""RAGEN-2's SNR filter through the real trainer (tiny Qwen3, CPU): filtered groups get exactly zero
gradient, loss scaling multiplies the advantages, and an all-filtered step changes nothing -- not the
weights, not Adam's moments or step count, not the LR schedule -- and enough of them stop training."""

from __future__ import annotations

import pytest
import torch
from harness import (
    BASE_ARGS,
    StepSnapshots,
    deterministic_rollout_func,
    kept_rows_only,
    loss_and_grads,
    max_abs_diff,
    one_step_loss_and_grads,
    prompt_dataset,
    reward_length,
    reward_parity_flat_at,
    reward_token_parity,
    same_state,
    spy_batches,
    trl_trainer,
)

from trainer import ConfigError, WinnowConfig, WinnowGRPOTrainer
from trainer.algorithms.snr_filter import group_scores, select_groups
from trainer.pipeline.stages import required_inputs

ROWS = 32  # 8 prompt groups of 4


def build(cls, cfg_cls, tiny_model, tmp_path, reward_funcs=None, **overrides):
    args = cfg_cls(
        output_dir=str(tmp_path / cls.__name__), **{**BASE_ARGS, "per_device_train_batch_size": ROWS, **overrides}
    )
    return cls(model=tiny_model, reward_funcs=reward_funcs or [reward_token_parity, reward_length], args=args,
               train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_filtered_groups_get_zero_gradient(tiny_model, tmp_path, loss_type):
    tr = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, rollout_filter="snr", snr_value=0.5,
               loss_type=loss_type)
    seen = spy_batches(tr)
    inputs, loss, grads = one_step_loss_and_grads(tr)
    sliced, kept = kept_rows_only(inputs)
    batch = seen[-1]
    # the decision is the pure functions' decision on the batch the trainer saw
    scores = group_scores(batch.groups(batch.R))
    selected = select_groups(scores, value=0.5)
    assert 0 < int(selected.sum()) < batch.P, "this batch must exercise the filter"
    assert int(kept.sum()) == int(selected.sum()) * batch.G
    metrics = tr._metrics["train"]
    assert metrics["snr/kept_groups"][-1] == int(selected.sum())
    assert metrics["snr/kept_ratio"][-1] == pytest.approx(int(selected.sum()) / batch.P)
    assert float(inputs["advantages"][~kept].abs().sum()) == 0.0

    ref = trl_trainer(tiny_model, str(tmp_path / "ref"), per_device_train_batch_size=ROWS, loss_type=loss_type)
    ref_loss, ref_grads = loss_and_grads(ref, sliced)
    assert abs(float(ref_loss - loss)) <= 1e-6
    assert max_abs_diff(ref_grads, grads) <= 1e-6


@pytest.mark.parametrize("mode", ["linear", "sqrt"])
def test_loss_scaling_multiplies_advantages_by_kept_fraction(tiny_model, tmp_path, mode):
    plain = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path / "plain", rollout_filter="snr", snr_value=0.5)
    scaled = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path / "scaled", rollout_filter="snr",
                   snr_value=0.5, snr_loss_scaling=mode)
    a, _, _ = one_step_loss_and_grads(plain)
    b, _, _ = one_step_loss_and_grads(scaled)
    fraction = plain._metrics["train"]["snr/kept_ratio"][-1]
    assert 0 < fraction < 1
    factor = fraction if mode == "linear" else fraction**0.5
    assert torch.allclose(b["advantages"], a["advantages"] * factor, atol=1e-7)


def test_all_filtered_steps_change_nothing_and_stop_training(tiny_model, tmp_path):
    """Step 1 trains; at step 2 (and 3) every group's reward is flat, so the filter keeps nothing: the
    weights, Adam's moments and step count, and the LR schedule stay exactly as step 1 left them, and after
    snr_empty_stop_steps=2 empty steps training stops with a message (max_steps is 6)."""
    tr = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path,
               reward_funcs=[reward_parity_flat_at(2, 3, 4, 5, 6)], rollout_filter="snr", snr_value=0.9,
               per_device_train_batch_size=8, max_steps=6,
               lr_scheduler_type="linear", weight_decay=0.1, snr_empty_stop_steps=2)
    snaps = StepSnapshots(tr)
    tr.add_callback(snaps)
    initial = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()

    assert tr.state.global_step == 3, "two empty steps in a row must stop training"
    step1, step2, step3 = snaps.after
    assert max_abs_diff(initial, step1["params"]) > 0, "step 1 must train (else the test proves nothing)"
    assert step1["optimizer"]["state"], "Adam state exists after step 1"
    for later in (step2, step3):
        assert same_state(step1["params"], later["params"])
        assert same_state(step1["optimizer"], later["optimizer"])
        assert later["lr"] == step1["lr"] and same_state(step1["scheduler"], later["scheduler"])
    history = tr.state.log_history
    assert [h["stages/empty_step"] for h in history if "stages/empty_step" in h] == [0.0, 1.0, 1.0]
    assert any("winnow_stop_reason" in h and "snr_empty_stop_steps" in h["winnow_stop_reason"] for h in history)
    assert tr._empty_steps.skipped_steps == 2


def test_filter_off_adds_no_step_logic(tiny_model, tmp_path):
    """Off means off: without a filter or dropout the trainer installs no empty-step guard or callback."""
    tr = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path)
    assert tr._empty_steps is None and tr.hook("collapse") is None


def test_entropy_scores_request_entropies_only_when_needed():
    base = dict(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to="none", num_generations=4)
    quiet = dict(base, log_entropy_before_selection=False)  # that metric needs entropies of its own
    assert "entropies" not in required_inputs(WinnowConfig(**quiet, rollout_filter="snr"))
    assert "entropies" in required_inputs(WinnowConfig(**quiet, rollout_filter="snr", snr_metric="entropy"))
    assert "entropies" in required_inputs(WinnowConfig(**base, rollout_filter="snr"))
    assert "entropies" not in required_inputs(WinnowConfig(**base))  # off means off: no extra forward


def test_entropy_metric_runs_through_trainer(tiny_model, tmp_path):
    tr = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, rollout_filter="snr", snr_metric="entropy",
               snr_strategy="top_k", snr_value=0.5)
    seen = spy_batches(tr)
    one_step_loss_and_grads(tr)
    batch = seen[-1]
    assert batch.entropies is not None and batch.entropies.shape == batch.mask.shape
    assert tr._metrics["train"]["snr/kept_groups"][-1] == 4  # top_k 0.5 of 8 groups


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(snr_keep="smallest"), "snr_keep"),
        (dict(snr_value=0.0), "snr_value"),
        (dict(snr_metric="reward_varience"), "snr_metric"),
        (dict(snr_strategy="top_q"), "snr_strategy"),
        (dict(snr_loss_scaling="cube"), "snr_loss_scaling"),
        (dict(snr_empty_stop_steps=-1), "snr_empty_stop_steps"),
        (dict(empty_batch_stop_steps=-1), "empty_batch_stop_steps"),
        (dict(snr_empty_stop_steps=2, empty_batch_stop_steps=3), "snr_empty_stop_steps"),  # both names, two values
        (dict(collapse_num_samples=1), "collapse_num_samples"),
        (dict(collapse_every=0), "collapse_every"),
    ],
)
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        WinnowConfig(
            output_dir="/tmp/x", use_cpu=True, bf16=False, report_to="none", rollout_filter="snr", **overrides
        )
    assert err.value.field_name == field and "Fix:" in str(err.value)


def test_deprecated_empty_stop_name_maps_to_the_new_one_with_a_warning():
    common = dict(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to="none", rollout_filter="snr")
    with pytest.warns(FutureWarning, match="snr_empty_stop_steps is deprecated.*use empty_batch_stop_steps"):
        args = WinnowConfig(**common, snr_empty_stop_steps=2)
    assert (args.empty_batch_stop_steps, args.snr_empty_stop_steps) == (2, None)
    assert WinnowConfig(**common, empty_batch_stop_steps=3).empty_batch_stop_steps == 3


def test_stage_state_survives_a_checkpoint(tiny_model, tmp_path):
    """The empty-step counter and the collapse detector's schedule and EMAs are checkpointed: a run resumed
    after one empty step stops after one more (empty_batch_stop_steps=2), as the uninterrupted run would."""
    common = dict(reward_funcs=[reward_parity_flat_at(2, 3, 4)], rollout_filter="snr", per_device_train_batch_size=8,
                  empty_batch_stop_steps=2, collapse_detection=True, collapse_every=1, collapse_num_samples=4,
                  save_strategy="steps", save_steps=1)
    first = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, max_steps=2, **common)
    first.train()
    assert first._empty_steps.consecutive_empty_generations == 1
    ema = dict(first.hook("collapse")._ema)
    assert ema and first.hook("collapse")._next_due == 3

    resumed = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, max_steps=6, **common)
    loaded = []
    original = resumed.hook("collapse").load_state_dict
    resumed.hook("collapse").load_state_dict = lambda state: (loaded.append(state), original(state))
    resumed.train(resume_from_checkpoint=str(tmp_path / "WinnowGRPOTrainer" / "checkpoint-2"))
    # without the restored counter the run would stop only at step 4 (two new empty steps)
    assert resumed.state.global_step == 3, "one restored + one new empty step must stop training"
    assert loaded and loaded[0]["ema"] == pytest.approx(ema) and loaded[0]["next_due"] == 3
