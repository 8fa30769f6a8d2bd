"""Integration tests through the real trainer on a tiny random Qwen3 (CPU, fp32).

- Off means off: with every stage off, WinnowGRPOTrainer's loss and gradients equal TRL's GRPOTrainer.
- Removed means removed: dropping a fixed set of rollouts gives the gradient of training on the kept
  rollouts alone (TRL's loss on the kept rows, with their advantages and token count).
- Per-token advantages (N, T) reach the loss.
"""

from __future__ import annotations

import pytest
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    grads_of,
    kept_rows_only,
    loss_and_grads,
    max_abs_diff,
    one_step_loss_and_grads,
    prompt_dataset,
    reward_length,
    reward_token_parity,
)
from trl import GRPOConfig, GRPOTrainer

from trainer import StageResult, WinnowConfig, WinnowGRPOTrainer, register_stage

LOSS_TYPES = ["grpo", "dapo", "dr_grpo", "bnpo"]
DROPPED = [1, 2, 6, 8, 9, 10, 11, 15]  # global row ids of a 16-row batch; rows 8-11 are a whole group


@register_stage("rollout_dropout", "test_drop_fixed")
def _drop_fixed(batch, args) -> StageResult:
    keep = torch.ones(batch.N, dtype=torch.bool)
    keep[DROPPED] = False
    return StageResult(keep=keep, metrics={"dropped": float(len(DROPPED))})


def per_token_pattern(N: int, T: int) -> torch.Tensor:
    """A known (N, T) advantage: sign alternates by row, magnitude grows along the sequence."""
    sign = torch.where(torch.arange(N) % 2 == 0, 1.0, -1.0).unsqueeze(1)
    return sign * (torch.arange(T, dtype=torch.float32) + 1).unsqueeze(0) / T


@register_stage("advantage", "test_per_token", group_level=True)
def _per_token(batch, args) -> StageResult:
    return StageResult(advantages=per_token_pattern(*batch.mask.shape) * batch.mask)


def build(cls, cfg_cls, model, tmp_path, *, rollout=False, **overrides):
    args = cfg_cls(output_dir=str(tmp_path / cls.__name__), **{**BASE_ARGS, **overrides})
    return cls(
        model=model,
        reward_funcs=[reward_token_parity, reward_length],
        args=args,
        train_dataset=prompt_dataset(),
        rollout_func=deterministic_rollout_func if rollout else None,
    )


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_off_means_off_matches_trl(tiny_model, tmp_path, loss_type):
    """Real generation (model.generate, same seed): identical batches, loss and gradients to TRL (<= 1e-6)."""
    overrides = dict(loss_type=loss_type, beta=0.04 if loss_type == "grpo" else 0.0)
    trl_inputs, trl_loss, trl_grads = one_step_loss_and_grads(
        build(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, **overrides)
    )
    win_inputs, win_loss, win_grads = one_step_loss_and_grads(
        build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, **overrides)
    )
    assert torch.equal(trl_inputs["completion_ids"], win_inputs["completion_ids"])
    assert torch.equal(trl_inputs["advantages"], win_inputs["advantages"]), "grpo advantage must be TRL's, bit for bit"
    assert float(trl_inputs["advantages"].abs().sum()) > 0, "degenerate batch: no advantage signal to compare"
    assert "winnow_loss_scale" not in win_inputs and ("tool_mask" in win_inputs) == ("tool_mask" in trl_inputs)
    assert abs(float(trl_loss - win_loss)) <= 1e-6
    assert max_abs_diff(trl_grads, win_grads) <= 1e-6


@pytest.mark.parametrize("scale_rewards", ["batch", "none"])
def test_off_means_off_scale_rewards(tiny_model, tmp_path, scale_rewards):
    """``scale_rewards`` is honoured exactly by the grpo advantage stage."""
    trl_inputs, _, _ = one_step_loss_and_grads(
        build(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, scale_rewards=scale_rewards)
    )
    win_inputs, _, _ = one_step_loss_and_grads(
        build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, scale_rewards=scale_rewards)
    )
    assert torch.equal(trl_inputs["advantages"], win_inputs["advantages"])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_removed_means_removed(tiny_model, tmp_path, loss_type):
    """Dropping rollouts == training on the kept ones alone: same loss and gradient (<= 1e-6)."""
    overrides = dict(loss_type=loss_type, beta=0.04, rollout_dropout="test_drop_fixed", per_device_train_batch_size=16)
    win = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, rollout=True, **overrides)
    inputs, win_loss, win_grads = one_step_loss_and_grads(win)
    sliced, kept = kept_rows_only(inputs)
    assert int(kept.sum()) == win.args.per_device_train_batch_size - len(DROPPED)
    assert win._metrics["train"]["stages/kept_rollouts"][-1] == 16 - len(DROPPED)
    assert win._metrics["train"]["test_drop_fixed/dropped"][-1] == len(DROPPED)

    ref_overrides = {k: v for k, v in overrides.items() if k != "rollout_dropout"}
    ref = build(GRPOTrainer, GRPOConfig, tiny_model, tmp_path, rollout=True, **ref_overrides)
    sliced["ref_per_token_logps"] = inputs["ref_per_token_logps"][kept]
    ref_loss, ref_grads = loss_and_grads(ref, sliced)
    assert abs(float(ref_loss - win_loss)) <= 1e-6
    assert max_abs_diff(ref_grads, win_grads) <= 1e-6
    # and the dropped rows really were dropped: with them kept the gradient differs
    assert float(inputs["advantages"][~kept].abs().sum()) == 0.0


def test_per_token_advantages_reach_the_loss(tiny_model, tmp_path):
    """A known (N, T) pattern: on-policy ratio is 1, so the grpo loss is -mean_i mean_t A_it over the mask,
    and the gradient is that of -mean_i mean_t A_it log pi(y_t)."""
    tr = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, rollout=True, advantage="test_per_token",
               loss_type="grpo")
    inputs, loss, grads = one_step_loss_and_grads(tr)
    A = inputs["advantages"]
    assert A.dim() == 2 and A.shape == inputs["completion_ids"].shape
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    expected = -((A * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    assert abs(float(loss - expected)) <= 1e-6
    # gradient of the explicit formula through a fresh forward
    tr.model.zero_grad(set_to_none=True)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logps, _, _ = tr._get_per_token_logps_and_entropies(tr.model, ids, attn, inputs["completion_ids"].size(1))
    explicit = -((A * logps * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    explicit.backward()
    explicit_grads = grads_of(tr.model)
    assert max_abs_diff(grads, explicit_grads) <= 1e-6
    # a scalar advantage with the same row means would give a different gradient: the pattern matters
    assert float(A[:, 0].abs().sum()) > 0 and not torch.allclose(A[:, 0], A[:, -1])
