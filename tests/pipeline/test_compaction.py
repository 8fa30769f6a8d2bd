"""Batch compaction (trainer/pipeline/round.py) through the real trainer: the compacted batch gives exactly the
masked formulation's loss and gradient for every loss type (scalar and per-token advantages; VESPO with TRL's
token-level vLLM importance-sampling ratios), holds only the kept rows, re-deals rows over processes padded as TRL
pads them, and a generation batch with nothing kept runs no forward pass at all."""

from __future__ import annotations

import pytest
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    max_abs_diff,
    near_policy_rollout_func,
    on_rollout_batch,
    one_step_loss_and_grads,
    prompt_dataset,
    reward_length,
    reward_parity_flat_at,
    reward_token_parity,
    use_vllm_importance_sampling,
)
from thread_world import ThreadWorld
from transformers import TrainerCallback
from trl import GRPOTrainer

from trainer import StageResult, WinnowConfig, WinnowGRPOTrainer, register_stage
from trainer.pipeline.round import compact

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


def build(tmp_path, tiny_model, compact: bool, reward_funcs=None, rollout_func=deterministic_rollout_func,
          **overrides):
    args = WinnowConfig(output_dir=str(tmp_path / f"compact-{compact}"),
                        **{**BASE_ARGS, "per_device_train_batch_size": 16, "compact_batch": compact, **overrides})
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=reward_funcs or [reward_token_parity, reward_length],
                             args=args, train_dataset=prompt_dataset(), rollout_func=rollout_func)


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


def trl_rank_batch(output: dict, rows: slice) -> dict:
    """Rows ``rows`` of a one-process TRL batch as TRL lays them out on the process that generated them: every
    per-token tensor cut to those rows' longest completion (prompts: longest prompt, on the left)."""
    part = {k: v[rows] for k, v in output.items() if torch.is_tensor(v) and v.dim() >= 1}
    c, p = int(part["completion_mask"].sum(1).max()), int(part["prompt_mask"].sum(1).max())
    T = output["completion_ids"].shape[1]
    for k, v in part.items():
        if k in ("prompt_ids", "prompt_mask"):
            part[k] = v[:, v.shape[1] - p:]
        elif v.dim() == 2 and v.shape[1] == T:
            part[k] = v[:, :c]
    return part


def vespo_phi(batch: dict, advantages: torch.Tensor) -> torch.Tensor:
    """TRL 1.16's VESPO weight per row (GRPOTrainer.get_gamma_weights) at the sampling policy (log-ratio 0): set by
    the importance-sampling ratios alone, as in the first forward of a step."""
    mask = batch["completion_mask"] * batch["tool_mask"]
    isr = batch["importance_sampling_ratio"]
    return GRPOTrainer.get_gamma_weights(advantages.unsqueeze(1), torch.zeros_like(isr), mask, isr).squeeze(1)


def test_vespo_token_is_compacted_equals_masked_and_keeps_trl_ratios_over_processes(tiny_model, tmp_path):
    """VESPO with TRL's token-level importance-sampling ratios (VESPO sums their log over every column, unmasked):
    compacted equals masked on one process; re-dealt over 4 processes (round-robin and token-balanced), every kept
    row's phi is the one TRL's own batch gives it, also where the row lands in a wider batch than it was made in
    (TRL's padded ratio is 1; padded with 0, phi is ~0)."""
    overrides = dict(loss_type="vespo", rollout_dropout="test_compaction_drop", rollout_func=near_policy_rollout_func)
    tr = use_vllm_importance_sampling(build(tmp_path, tiny_model, True, **overrides))
    tr.args.compact_batch = False  # one trainer for both (read per batch; the same batch is generated twice)
    _, masked_loss, masked_grads = one_step_loss_and_grads(tr)
    tr.args.compact_batch = True
    outputs = []
    on_rollout_batch(tr, lambda output, batch: outputs.append(dict(output)))
    inputs, loss, grads = one_step_loss_and_grads(tr)
    assert inputs["completion_ids"].shape[0] == 16 - len(DROPPED)
    assert inputs["importance_sampling_ratio"].shape == inputs["completion_ids"].shape  # token-level ratios
    assert abs(float(loss - masked_loss)) <= 1e-6 * abs(float(masked_loss)) + 1e-9
    assert max_abs_diff(grads, masked_grads) <= 1e-6

    output = outputs[0]  # TRL's batch of all 16 rows (one process)
    A = output["advantages"]
    phi = vespo_phi(output, A)
    assert float(phi.min()) > 0.5 and float((phi - 1).abs().max()) > 0.05  # near 1, not 1
    world, B = 4, 4
    ranks = [{**trl_rank_batch(output, slice(r * B, (r + 1) * B)), "test_row": torch.arange(r * B, (r + 1) * B)}
             for r in range(world)]
    widths = [r["completion_ids"].shape[1] for r in ranks]
    assert len(set(widths)) > 1, widths  # some rows will be re-dealt into a wider batch
    keep = torch.ones(16, dtype=torch.bool)
    keep[[0, 3, 9, 14]] = False
    pad = tr.processing_class.pad_token_id
    for balance in (False, True):
        shares = ThreadWorld(world).run(lambda rank, acc: compact(
            ranks[rank], keep, A, accelerator=acc, pad_token_id=pad, steps_per_generation=1, micro_batch_rows=B,
            balance_tokens=balance))
        widened = 0
        for share in shares:
            kept = share["winnow_kept"]
            rows = share["test_row"][kept]
            got = vespo_phi(share, A[share["test_row"]])[kept]
            torch.testing.assert_close(got, phi[rows], rtol=1e-6, atol=0)
            widened += sum(int(share["completion_ids"].shape[1] > widths[int(r) // B]) for r in rows)
        assert widened >= 1  # the case that breaks is really there
        assert sorted(int(r) for s in shares for r in s["test_row"][s["winnow_kept"]]) == keep.nonzero()[:, 0].tolist()


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
