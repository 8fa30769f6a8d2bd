"""Batch compaction (trainer/pipeline/compaction.py) through the real trainer: the compacted batch gives exactly the
masked formulation's loss and gradient for every loss type (scalar and per-token advantages), holds only
the kept rows, and a generation batch with nothing kept runs no forward pass at all."""

from __future__ import annotations

import pytest
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    max_abs_diff,
    one_step_loss_and_grads,
    prompt_dataset,
    reward_length,
    reward_parity_flat_at,
    reward_token_parity,
)
from transformers import TrainerCallback

from trainer import StageResult, WinnowConfig, WinnowGRPOTrainer, register_stage

LOSS_TYPES = ["grpo", "dapo", "dr_grpo", "bnpo", "sapo", "luspo", "cispo"]
DROPPED = [0, 3, 4, 5, 6, 7, 9, 14]  # global rows of a 16-row batch; rows 4-7 are a whole group


@register_stage("rollout_dropout", "test_compaction_drop")
def _drop(batch, args) -> StageResult:
    keep = torch.ones(batch.N, dtype=torch.bool)
    keep[DROPPED] = False
    return StageResult(keep=keep)


@register_stage("advantage", "test_compaction_per_token", group_level=True)
def _per_token(batch, args) -> StageResult:
    N, T = batch.mask.shape
    sign = torch.where(torch.arange(N) % 2 == 0, 1.0, -1.0).unsqueeze(1)
    return StageResult(advantages=sign * (torch.arange(T, dtype=torch.float32) + 1).unsqueeze(0) / T * batch.mask)


def build(tmp_path, tiny_model, compact: bool, reward_funcs=None, **overrides):
    args = WinnowConfig(output_dir=str(tmp_path / f"compact-{compact}"),
                        **{**BASE_ARGS, "per_device_train_batch_size": 16, "compact_batch": compact, **overrides})
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=reward_funcs or [reward_token_parity, reward_length],
                             args=args, train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_compacted_equals_masked(tiny_model, tmp_path, loss_type):
    overrides = dict(loss_type=loss_type, beta=0.04, rollout_dropout="test_compaction_drop")
    masked_inputs, masked_loss, masked_grads = one_step_loss_and_grads(build(tmp_path, tiny_model, False, **overrides))
    inputs, loss, grads = one_step_loss_and_grads(build(tmp_path, tiny_model, True, **overrides))
    assert masked_inputs["completion_ids"].shape[0] == 16
    assert inputs["completion_ids"].shape[0] == 16 - len(DROPPED), "only the kept rows are trained"
    assert bool(inputs["tool_mask"].any(dim=1).all()), "no zero-weight filler is needed on one process"
    assert abs(float(loss - masked_loss)) <= 1e-6
    assert max_abs_diff(grads, masked_grads) <= 1e-6
    assert max(g.abs().max() for g in grads.values()) > 0


def test_compacted_equals_masked_per_token_advantages(tiny_model, tmp_path):
    overrides = dict(loss_type="grpo", rollout_dropout="test_compaction_drop", advantage="test_compaction_per_token")
    masked_inputs, masked_loss, masked_grads = one_step_loss_and_grads(build(tmp_path, tiny_model, False, **overrides))
    inputs, loss, grads = one_step_loss_and_grads(build(tmp_path, tiny_model, True, **overrides))
    assert inputs["advantages"].dim() == 2 and inputs["advantages"].shape == inputs["completion_ids"].shape
    assert abs(float(loss - masked_loss)) <= 1e-6
    assert max_abs_diff(grads, masked_grads) <= 1e-6


class ForwardCounter(TrainerCallback):
    """Model forward calls per optimizer step."""

    def __init__(self, model):
        self.calls, self.per_step = 0, []
        model.register_forward_hook(lambda *a: setattr(self, "calls", self.calls + 1))

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(self.calls)
        self.calls = 0


def test_nothing_kept_runs_no_forward_and_no_backward(tiny_model, tmp_path):
    """Step 2's rewards are flat: the SNR filter keeps nothing, so step 2 does no forward pass (hence no
    backward) and no optimizer update; steps 1 and 3 train normally. Two micro-steps per optimizer step."""
    # (the entropy-before-selection metric would add its own no-grad forward at generation time: off here, so
    # every forward counted is a training one)
    tr = build(tmp_path, tiny_model, True, reward_funcs=[reward_parity_flat_at(2)], rollout_filter="snr",
               per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=3,
               log_entropy_before_selection=False)
    counter = ForwardCounter(tr.model)
    tr.add_callback(counter)
    tr.train()
    assert counter.per_step[0] > 0 and counter.per_step[2] > 0
    assert counter.per_step[1] == 0
    history = tr.state.log_history
    assert [h["stages/empty_step"] for h in history if "stages/empty_step" in h] == [0.0, 1.0, 0.0]
