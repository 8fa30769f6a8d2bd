"""Stage pipeline semantics (pure), config validation (fails before any model loads), and reward failures."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity

from trainer import (
    ConfigError,
    RewardFunctionError,
    RolloutBatch,
    StageResult,
    WinnowConfig,
    WinnowGRPOTrainer,
    register_stage,
)
from trainer.pipeline import stages


def make_batch(N=8, G=4, T=5) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    return RolloutBatch(
        R_k=torch.rand(N, 2, generator=g),
        reward_weights=torch.tensor([1.0, 0.5]),
        reward_names=["a", "b"],
        G=G,
        completion_ids=torch.randint(0, 100, (N, T), generator=g),
        mask=torch.ones(N, T),
    )


def args_for(**kw):
    base = dict(rollout_filter="none", rollout_dropout="none", advantage="grpo", loss_variant="none",
                advantage_std="unbiased", advantage_eps=1e-4, scale_rewards="group",
                multi_objective_aggregation="sum_then_normalize")
    return SimpleNamespace(**{**base, **kw})


@register_stage("rollout_filter", "test_drop_group1", group_level=True, metric_prefix="tf")
def _drop_group1(batch, args):
    keep = batch.group_index != 1
    return StageResult(keep=keep, metrics={"kept": float(keep.sum())})


@register_stage("rollout_dropout", "test_drop_first_and_recenter")
def _drop_first(batch, args):
    A = batch.base_advantages()  # the estimator's output, computed once, seen after the filter
    keep = torch.ones(batch.N, dtype=torch.bool)
    keep[0] = False
    return StageResult(keep=keep, advantages=A + 100.0)


@register_stage("rollout_dropout", "test_bad_shape")
def _bad_shape(batch, args):
    return StageResult(keep=torch.ones(batch.N + 1, dtype=torch.bool))


def test_pipeline_ands_keep_masks_and_zeroes_dropped_advantages():
    batch = make_batch()
    out = stages.run_pipeline(
        batch, args_for(rollout_filter="test_drop_group1", rollout_dropout="test_drop_first_and_recenter")
    )
    expected_keep = torch.tensor([0, 1, 1, 1, 0, 0, 0, 0], dtype=torch.bool)
    assert torch.equal(out.keep, expected_keep)
    # dropout's transformed advantages replaced the estimator's; dropped rows are exactly 0
    from trainer.algorithms.grpo import grpo_advantages

    A, _ = grpo_advantages(make_batch().R, 4)
    assert torch.equal(out.advantages, torch.where(expected_keep, A + 100.0, torch.zeros_like(A)))
    assert out.metrics["tf/kept"] == 4.0
    assert out.metrics["stages/kept_rollouts"] == 3 and out.metrics["stages/kept_groups_ratio"] == 0.5
    assert "advantage/frac_zero_std" in out.metrics  # estimator telemetry is merged even when called lazily


def test_pipeline_off_is_plain_grpo():
    batch = make_batch()
    out = stages.run_pipeline(batch, args_for())
    from trainer.algorithms.grpo import grpo_advantages

    assert torch.equal(out.advantages, grpo_advantages(batch.R, 4)[0]) and bool(out.keep.all())


def test_pipeline_rejects_wrong_shapes():
    with pytest.raises(ValueError, match="test_bad_shape.*shape"):
        stages.run_pipeline(make_batch(), args_for(rollout_dropout="test_bad_shape"))


def test_registry_rejects_unknown_kind_and_needs():
    with pytest.raises(ValueError, match="unknown stage kind"):
        register_stage("rollout_shuffle", "x")
    register_stage("rollout_filter", "test_unknown_needs", needs={"teacher_logits"})(lambda batch, args: StageResult())
    try:
        with pytest.raises(ValueError, match="'test_unknown_needs' needs unknown inputs"):
            stages.check_needs()
    finally:  # the registry is process-wide
        del stages._REGISTRY["rollout_filter"]["test_unknown_needs"]
    stages.check_needs()


def cfg(tmp_path, **kw):
    return WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, **kw})


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(rollout_filter="snrr"), "rollout_filter"),
        (dict(rollout_dropout="grpo_dropout"), "rollout_dropout"),
        (dict(advantage="vtrace"), "advantage"),
        (dict(loss_variant="clip_cov_typo"), "loss_variant"),
        (dict(advantage_std="sample"), "advantage_std"),
        (dict(advantage_eps=0.0), "advantage_eps"),
        (dict(old_logps_source="vllm"), "old_logps_source"),
        (dict(dropout_delete="pos"), "dropout_delete"),
        (dict(dropout_recenter="weighted"), "dropout_recenter"),
        (dict(dropout_surprisal_basis="avg"), "dropout_surprisal_basis"),
        (dict(dropout_selector="balance_neg"), "dropout_selector"),
        (dict(num_generations=1, per_device_train_batch_size=4), "num_generations"),
    ],
)
def test_config_errors_name_field_and_fix(tmp_path, overrides, field):
    with pytest.raises(ConfigError) as err:
        cfg(tmp_path, **overrides)
    assert err.value.field_name == field
    assert f"WinnowConfig.{field}" in str(err.value) and "Fix:" in str(err.value)


def test_unknown_stage_error_lists_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"use one of \['grpodropout', 'none'"):
        cfg(tmp_path, rollout_dropout="nope")


def test_sampler_logps_without_sampler_fails_before_model_load(tmp_path):
    """The model path does not exist: the error must come from validation, not from loading."""
    args = cfg(tmp_path, old_logps_source="sampler")
    with pytest.raises(ConfigError, match="old_logps_source"):
        WinnowGRPOTrainer(model=str(tmp_path / "no-such-model"), reward_funcs=reward_token_parity, args=args,
                          train_dataset=prompt_dataset())


def test_trainer_rejects_args_that_are_no_grpo_config(tiny_model, tmp_path):
    """A plain GRPOConfig is accepted (tests/grpo_trainer/test_drop_in.py); anything else is a TypeError naming
    WinnowConfig."""
    with pytest.raises(TypeError, match="WinnowConfig"):
        WinnowGRPOTrainer(model=tiny_model, reward_funcs=reward_token_parity, args={"output_dir": str(tmp_path)},
                          train_dataset=prompt_dataset())


def broken_reward(completions, **kwargs):
    raise ZeroDivisionError("verifier bug")


def infinite_reward(completions, **kwargs):
    return [math.inf] + [0.0] * (len(completions) - 1)


def unscorable_reward(completions, **kwargs):
    return [None] * len(completions)


@pytest.mark.parametrize("func, match", [
    (broken_reward, r"'broken_reward' raised ZeroDivisionError: verifier bug"),
    (infinite_reward, r"'infinite_reward' returned inf for completion #0"),
])
def test_failing_reward_function_is_reported(tiny_model, tmp_path, func, match):
    trainer = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, func],
                                args=cfg(tmp_path, max_steps=1), train_dataset=prompt_dataset(),
                                rollout_func=deterministic_rollout_func)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(RewardFunctionError, match=match):
        trainer.train()
    after = dict(trainer.model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before), "no update may happen on garbage rewards"


def test_unscorable_is_allowed(tiny_model, tmp_path):
    """None is TRL's 'cannot score': it trains (advantage 0 where nothing scored), no error."""
    trainer = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, unscorable_reward],
                                args=cfg(tmp_path, max_steps=1), train_dataset=prompt_dataset(),
                                rollout_func=deterministic_rollout_func)
    trainer.train()
    assert trainer.state.global_step == 1
