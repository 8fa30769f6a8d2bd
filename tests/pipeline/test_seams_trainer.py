"""The seams of issue 25 through the real trainer (tiny Qwen3, CPU): truncated rollouts masked by
``mask_truncated_completions`` under GRPODropout at temperature != 1, the completions table and the
entropy-before-selection metric, and DAPO dynamic sampling's logged metrics. Expected values come from TRL's own
batch (its advantages, masks and rewards) and an independent forward of the model, computed here by hand."""

from __future__ import annotations

import statistics

import pytest
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    on_rollout_batch,
    prompt_dataset,
    reward_length,
    reward_token_parity,
)
from test_seams_statistics import _hand_grpodropout

from trainer import WinnowConfig, WinnowGRPOTrainer
from trainer.pipeline import stages

G = 4
TEMPERATURE = 0.7


def snapshot_pipeline(tr, monkeypatch):
    """Record TRL's batch dict as it reached the pipeline (a copy: compaction rewrites it later) and the decision."""
    seen = {}

    def record(output, batch):
        seen["output"] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in output.items()}
        seen["batch"] = batch

    run = stages.run_pipeline

    def spy_run(batch, args):
        seen["decision"] = run(batch, args)
        return seen["decision"]

    on_rollout_batch(tr, record)
    monkeypatch.setattr(stages, "run_pipeline", spy_run)
    return seen


def old_policy(model, out, temperature):
    """Per-token log-probs of the sampled tokens and full-vocabulary entropies at ``temperature``, by hand."""
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    attn = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    T = out["completion_ids"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, -T - 1:-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    tok = logp.gather(2, out["completion_ids"].unsqueeze(2)).squeeze(2)
    return tok, -(logp.exp() * logp).sum(-1)


def test_grpodropout_with_masked_truncations_at_temperature(tiny_model, tmp_path, monkeypatch):
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "per_device_train_batch_size": 32,
                        "temperature": TEMPERATURE, "mask_truncated_completions": True,
                        "rollout_dropout": "grpodropout"})
    tr = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, reward_length], args=args,
                           train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
    seen = snapshot_pipeline(tr, monkeypatch)
    tr.model.train()
    tr._prepare_inputs(next(iter(tr.get_train_dataloader())))
    out, decision = seen["output"], seen["decision"]
    A = out["advantages"].tolist()  # TRL's own GRPO advantages (its rewards, truncated rows included)
    loss_mask = out["completion_mask"] * out["tool_mask"]
    valid = (loss_mask.sum(1) > 0).tolist()
    assert 0 < valid.count(False) < len(valid), "the batch must hold truncated (masked) rollouts and trained ones"
    logps, entropy = old_policy(tr.model, out, TEMPERATURE)
    s = ((-logps * loss_mask).sum(1) / loss_mask.sum(1).clamp(min=1)).tolist()
    deleted = 0
    for g in range(len(A) // G):
        rows = slice(g * G, (g + 1) * G)
        keep, want = _hand_grpodropout(A[rows], s[rows], valid[rows])
        assert decision.keep[rows].tolist() == keep, g
        for i, w in enumerate(want):
            got = float(decision.advantages[g * G + i])
            assert abs(got - w) <= 1e-4 * max(abs(w), 1e-2), (g, i, got, w)
        deleted += keep.count(False)
    assert deleted > 0 and decision.keep[~torch.tensor(valid)].all(), "deletions happen; a masked row is never one"

    metrics = tr._metrics["train"]
    # the completions table shows the advantages the loss uses, not TRL's
    assert list(tr._logs["advantages"]) == pytest.approx(decision.advantages.tolist(), rel=1e-6, abs=1e-9)
    # the old policy's entropy over every sampled loss token, before any rollout was removed
    want_entropy = float((entropy * loss_mask).sum() / loss_mask.sum())
    assert metrics["stages/entropy_before_selection"][-1] == pytest.approx(want_entropy, rel=1e-4)
    assert metrics["stages/untrainable_rollouts"][-1] == valid.count(False)


class Acc:
    """1.0 for every rollout of prompts whose answer is a multiple of 3 (an all-correct group), token parity
    otherwise: the first batch holds constant groups, so dynamic sampling generates more rounds."""

    __name__ = "acc"

    def __call__(self, completions, completion_ids, answer, **kwargs):
        parity = reward_token_parity(completions, completion_ids)
        return [1.0 if int(a) % 3 == 0 else p for a, p in zip(answer, parity)]


def test_dynamic_sampling_metrics_describe_the_trained_batch(tiny_model, tmp_path, monkeypatch):
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "per_device_train_batch_size": 16, "max_steps": 1,
                        "dynamic_sampling": True, "dynamic_sampling_metric": "acc"})
    tr = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[Acc()], args=args, train_dataset=prompt_dataset(48),
                           rollout_func=deterministic_rollout_func)
    seen = snapshot_pipeline(tr, monkeypatch)
    tr.train()
    log = next(h for h in tr.state.log_history if "reward" in h)
    assert log["dynamic_sampling/gen_batches"] > 1, "the first batch had constant groups: more rounds were generated"
    batch = seen["batch"]
    R = batch.R.tolist()
    groups = [R[i:i + G] for i in range(0, len(R), G)]
    assert log["reward"] == pytest.approx(statistics.mean(R), rel=1e-6)
    assert log["reward_std"] == pytest.approx(statistics.stdev(R), rel=1e-5)
    assert log["frac_reward_zero_std"] == 0.0  # only mixed groups are trained
    assert log["rewards/acc/mean"] == pytest.approx(statistics.mean(R), rel=1e-6)
    lengths = batch.mask.sum(1).tolist()  # TRL's completion length counts model (env-mask) tokens
    assert log["completions/mean_length"] == pytest.approx(statistics.mean(lengths), rel=1e-6)
    assert log["completions/max_length"] == max(lengths)
    # what was generated in all rounds stays visible under its own name
    assert log["dynamic_sampling/all_rounds/frac_reward_zero_std"] > 0
    assert all(max(g) > min(g) for g in groups)
    # the completions table holds the trained rows (their rewards and the pipeline's advantages), in batch order
    assert list(tr._logs["rewards"]["acc"]) == pytest.approx(batch.R_k[:, 0].tolist())
    assert list(tr._logs["advantages"]) == pytest.approx(seen["decision"].advantages.tolist(), rel=1e-6, abs=1e-9)
