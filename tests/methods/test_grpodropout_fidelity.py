"""The GRPODropout and RAGEN recipes' loss against their authors' verl, and config guards.

- Dual-clip: TRL's ``delta`` (cap on the unclipped ratio, both advantage signs) gives the loss and gradient of
  verl's vanilla dual-clip PPO at ``clip_ratio_c`` (verl/trainer/ppo/core_algos.py compute_policy_loss), with the
  aggregation both forks' actors run: token-mean over one-sequence micro-batches, each divided by the accumulation
  count = TRL's ``loss_type: grpo``. The GRPODropout fork (hexuandeng/GRPODropout@4ad3b3b) calls it with actor.yaml's
  clip_ratio_c 3.0 (10 in its DAPO row); RAGEN (mll-lab-nu/RAGEN@20daedc ragen/workers/actor/dp_actor.py:420, 430-440)
  with ``self.config.get("clip_ratio_c", 3.0)``, its verl submodule's actor.yaml:69 value 3.0, and clip 0.2/0.28
  (config/base.yaml:38-39). Each case takes the loss settings from a recipe file and the reference's from upstream.
  The reference below is transcribed from verl, not from TRL; the batch is off-policy with ratios far beyond the
  bound in both directions and both advantage signs, so every branch of the dual clip is exercised.
- ``dropout_selector: balanced_push`` refuses a ``dropout_delete`` it would ignore.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from harness import grads_of, one_step_loss_and_grads, trl_trainer
from verl_oracle import verl_dual_clip_token_loss

from trainer.config.core import ConfigError, WinnowConfig
from trainer.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]
# recipe -> upstream (clip_ratio_low, clip_ratio_high, clip_ratio_c), the reference's values
UPSTREAM_CLIPS = {
    "configs/grpo/qwen3-4b-dapo17k.yaml": (0.2, 0.2, 3.0),  # GRPODropout's GRPO baseline (App. B.1)
    "configs/grpodropout/table1/qwen3-4b-dapo.yaml": (0.2, 0.28, 10.0),  # its DAPO row
    "configs/ragen/sokoban-grpo-nofilter.yaml": (0.2, 0.28, 3.0),  # RAGEN main table (GRPO: seq-mean-token-mean)
    "configs/ragen/countdown-dapo-topp0.9.yaml": (0.2, 0.28, 3.0),  # RAGEN main table (DAPO: token-mean)
}


def verl_one_sequence_micro_batches(token_loss, mask):
    """dp_actor.update_policy with ppo_micro_batch_size_per_gpu 1: agg_loss token-mean of each one-row micro-batch
    (= that row's masked mean), divided by the accumulation count (= the number of rows), summed."""
    rows = [(token_loss[i] * mask[i]).sum() / mask[i].sum() for i in range(token_loss.shape[0])]
    return sum(r / len(rows) for r in rows)


@pytest.mark.parametrize("recipe", sorted(UPSTREAM_CLIPS))
def test_trl_delta_is_verls_dual_clip(tiny_model, tmp_path, recipe):
    eps_low, eps_high, delta = UPSTREAM_CLIPS[recipe]
    _, args, _ = parse_recipe(["--config", str(ROOT / recipe), "--bf16", "false", "--use_cpu", "true"])
    assert args.loss_type == "grpo" and args.beta == 0.0  # the aggregation the reference below runs
    trainer = trl_trainer(tiny_model, str(tmp_path / "trl"), loss_type=args.loss_type, delta=args.delta,
                          epsilon=args.epsilon, epsilon_high=args.epsilon_high, beta=0.0)
    inputs, _, _ = one_step_loss_and_grads(trainer)
    prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).float()  # verl's response_mask: sampled tokens only
    assert mask.sum(dim=1).min() > 0
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), completion_ids.size(1))
    # off-policy: log-ratios spread over [-3, 3] (ratios 0.05 .. 20) and advantages of both signs
    g = torch.Generator().manual_seed(0)
    log_ratio = (torch.rand(logp.shape, generator=g) * 6 - 3)
    old = (logp - log_ratio).detach()
    A = torch.randn(logp.shape[0], generator=g)
    A[0], A[1] = 1.5, -1.5
    ratio = torch.exp(log_ratio)
    valid = mask.bool()
    for sign in (A < 0, A > 0):  # ratios on both sides of the bound, for both advantage signs
        rows = sign.unsqueeze(1) & valid
        assert (rows & (ratio > delta)).any() and (rows & (ratio > 1 + eps_high) & (ratio < delta)).any()
        assert (rows & (ratio < 1 - eps_low)).any()

    run = {**inputs, "old_per_token_logps": old, "advantages": A}
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = 1
    trl_loss = trainer.compute_loss(trainer.model, run)
    trl_loss.backward()
    trl_grads = grads_of(trainer.model)

    trainer.model.zero_grad(set_to_none=True)
    logp_live, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, torch.cat([prompt_ids, completion_ids], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), completion_ids.size(1))
    token_loss = verl_dual_clip_token_loss(logp_live, old, A.unsqueeze(1), eps_low, eps_high, delta)
    verl_loss = verl_one_sequence_micro_batches(token_loss, mask)
    verl_loss.backward()
    verl_grads = grads_of(trainer.model)

    assert trl_loss.item() == pytest.approx(verl_loss.item(), rel=1e-5)
    scale = max(float(g.abs().max()) for g in verl_grads.values())
    assert scale > 0
    assert max(float((trl_grads[k] - verl_grads[k]).abs().max()) for k in verl_grads) <= 1e-5 * scale

    # negative control: without the dual clip, verl's loss differs on this batch (the test can see the bound)
    undual = verl_one_sequence_micro_batches(
        verl_dual_clip_token_loss(logp_live.detach(), old, A.unsqueeze(1), eps_low, eps_high, float("inf")), mask)
    assert abs(undual.item() - verl_loss.item()) > 1e-3 * abs(verl_loss.item())


@pytest.mark.parametrize("delete", ["negative", "both"])
def test_balanced_push_rejects_a_dropout_delete_it_would_ignore(tmp_path, delete):
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=4,
                  per_device_train_batch_size=8, rollout_dropout="grpodropout", dropout_selector="balanced_push")
    with pytest.raises(ConfigError, match="dropout_delete"):
        WinnowConfig(**common, dropout_delete=delete)
    assert WinnowConfig(**common).dropout_delete == "positive"  # the default stays accepted
