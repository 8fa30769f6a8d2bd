"""UECR-GRPO and the teacher-assisted baselines through the real trainer (tiny Qwen3 student and a tiny Qwen3 teacher
of another size, CPU, fp32): the paper's F.9 regression tests -- rho = 0 reproduces PUU's loss and gradient, raw
T=1 teacher and old-policy scores aligned token by token with the sampled ids, the reference KL entering once,
teacher off = native GRPO with no teacher loaded -- plus survival of empty completions and the telemetry."""

from __future__ import annotations

import math

import pytest
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    loss_and_grads,
    max_abs_diff,
    one_step_loss_and_grads,
    prompt_dataset,
    reward_length,
    reward_token_parity,
    spy_batches,
)

from trainer import ConfigError, WinnowConfig, WinnowGRPOTrainer
from trainer.methods.uecr.teacher import score_tokens
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.stages import run_pipeline
from trainer.tools.assets import make_tiny_qwen3

ROWS = 16


@pytest.fixture(scope="module")
def teacher_path() -> str:
    return str(make_tiny_qwen3(seed=7, hidden_size=32, intermediate_size=64))


def build(tiny_model, tmp_path, teacher=None, **overrides):
    extra = {"teacher_model_name_or_path": teacher} if teacher else {}
    args = WinnowConfig(output_dir=str(tmp_path / "out"), **{**BASE_ARGS, "per_device_train_batch_size": ROWS,
                                                               "temperature": 0.7, **extra, **overrides})
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, reward_length], args=args,
                             train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


def test_no_teacher_stage_loads_no_teacher(tiny_model, tmp_path):
    tr = build(tiny_model, tmp_path, teacher="/nonexistent/teacher", max_steps=1)  # would fail if it were loaded
    assert tr.hook("teacher") is None
    tr.train()
    keys = {k for h in tr.state.log_history for k in h}
    assert not any(k.startswith(("teacher/", "uecr/")) for k in keys)  # absent, not zero


def test_teacher_stage_without_teacher_fails_fast(tmp_path):
    with pytest.raises(ConfigError, match="teacher_model_name_or_path"):
        WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, advantage="uecr")
    with pytest.raises(ConfigError, match="uecr_rho"):
        WinnowConfig(
            output_dir=str(tmp_path), **BASE_ARGS, advantage="uecr", teacher_model_name_or_path="x", uecr_rho=1.0
        )


def test_teacher_is_frozen_and_scores_align_with_the_sampled_ids(tiny_model, tmp_path, teacher_path):
    tr = build(tiny_model, tmp_path, teacher=teacher_path, advantage="uecr")
    teacher = tr.hook("teacher").model
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    outputs: list = []
    seen = spy_batches(tr, outputs)
    one_step_loss_and_grads(tr)
    output, batch = outputs[0], seen[0]
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attn = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    T = output["completion_ids"].shape[1]
    valid = batch.mask.bool()
    # T=1 teacher log-probs: the teacher's own (unchunked) log-softmax at the sampled id of each position
    with torch.no_grad():
        logits = teacher(input_ids=ids, attention_mask=attn).logits[:, -T - 1 : -1].float()
        lsm = torch.log_softmax(logits, -1)
        want = lsm.gather(-1, output["completion_ids"].unsqueeze(-1)).squeeze(-1)
        want_h = -(lsm.exp() * lsm).sum(-1)
    assert torch.allclose(batch.extras["teacher_logps"][valid], want[valid], atol=1e-5)
    assert torch.allclose(batch.extras["teacher_entropy"][valid], want_h[valid], atol=1e-5)
    # old policy at T=1: the student's own unchunked log-softmax (no update has happened yet: it is the old policy)
    with torch.no_grad():
        s_lsm = torch.log_softmax(tr.model(input_ids=ids, attention_mask=attn).logits[:, -T - 1 : -1].float(), -1)
    s_want = s_lsm.gather(-1, output["completion_ids"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(batch.extras["old_logps_t1"][valid], s_want[valid], atol=1e-5)
    # the same forward's sampling-temperature log-probs are TRL's own (its fused head at T = 0.7)
    both = score_tokens(tr.model, ids, attn, T, temperatures=(1.0, 0.7))
    trl_tr, _, _ = tr._get_per_token_logps_and_entropies(tr.model, ids, attn, T)
    assert torch.allclose(both["logps"][1][valid], trl_tr.detach()[valid], atol=1e-5)
    assert torch.equal(both["logps"][0], batch.extras["old_logps_t1"])
    assert not torch.allclose(batch.extras["old_logps_t1"][valid], batch.extras["teacher_logps"][valid])


def test_rho_zero_reproduces_puu_loss_and_gradient(tiny_model, tmp_path, teacher_path):
    puu = build(tiny_model, tmp_path / "puu", teacher=teacher_path, advantage="puu")
    uecr = build(tiny_model, tmp_path / "uecr", teacher=teacher_path, advantage="uecr", uecr_rho=0.0)
    a_inputs, a_loss, a_grads = one_step_loss_and_grads(puu)
    b_inputs, b_loss, b_grads = one_step_loss_and_grads(uecr)
    m = b_inputs["completion_mask"] * b_inputs["tool_mask"]  # per-token advantages are 0 outside the loss mask
    A_puu = a_inputs["advantages"].unsqueeze(1).expand_as(b_inputs["advantages"]) * m
    assert torch.allclose(A_puu, b_inputs["advantages"] * m, atol=1e-6)
    assert abs(float(a_loss - b_loss)) <= 1e-6
    assert max_abs_diff(a_grads, b_grads) <= 1e-6
    assert float(a_inputs["advantages"].abs().sum()) > 0


@pytest.mark.parametrize("advantage, loss_variant", [("uecr", "none"), ("grpo", "naive_hybrid")])
def test_reference_kl_enters_once(tiny_model, tmp_path, teacher_path, advantage, loss_variant):
    """The loss with beta minus the loss without it is TRL's single KL term (beta * mean k3), for UECR's per-token
    advantages through TRL's loss and for the naive hybrid's two summed surrogates."""
    common = dict(teacher=teacher_path, advantage=advantage, loss_variant=loss_variant, loss_type="grpo")
    with_kl = build(tiny_model, tmp_path / "kl", beta=0.1, **common)
    inputs, _, _ = one_step_loss_and_grads(with_kl)
    g = torch.Generator().manual_seed(0)  # a reference the policy has drifted from (at step 0 they coincide)
    inputs = {
        **inputs,
        "ref_per_token_logps": inputs["ref_per_token_logps"]
        - torch.rand(inputs["ref_per_token_logps"].shape, generator=g),
    }
    loss_kl, _ = loss_and_grads(with_kl, inputs)
    with_kl.beta = 0.0
    loss_plain, _ = loss_and_grads(with_kl, inputs)
    mask = inputs["completion_mask"] * inputs.get("tool_mask", torch.ones_like(inputs["completion_mask"]))
    logp, _, _ = with_kl._get_per_token_logps_and_entropies(
        with_kl.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), inputs["completion_ids"].shape[1])
    ref = inputs["ref_per_token_logps"]
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    kl_term = (0.1 * ((k3 * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()).detach()
    assert float(kl_term) > 1e-6
    assert abs(float(loss_kl - loss_plain) - float(kl_term)) <= 1e-6


def test_empty_completion_scores_zero_with_unit_weights(tmp_path):
    """A rollout with no actor token: teacher score 0, ECR weights 1, counted -- never NaN."""
    N, T, G = 8, 5, 4
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(N, T)
    mask[2] = 0  # empty completion
    mask[5, 2:] = 0
    args = WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, advantage="uecr", teacher_model_name_or_path="unused")
    batch = RolloutBatch(
        R_k=torch.tensor([[1.0], [0.0], [1.0], [0.0], [1.0], [1.0], [1.0], [1.0]]),
        reward_weights=torch.ones(1), reward_names=["acc"], G=G,
        completion_ids=torch.randint(0, 100, (N, T), generator=g), mask=mask,
        extras={"teacher_logps": -torch.rand(N, T, generator=g) * 3,
                "teacher_entropy": torch.rand(N, T, generator=g) * 4,
                "old_logps_t1": -torch.rand(N, T, generator=g) * 3},
    )
    out = run_pipeline(batch, args)
    assert torch.isfinite(out.advantages).all()
    assert out.metrics["uecr/empty_completions"] == 1.0
    assert torch.all(out.advantages[2] == 0)
    assert math.isfinite(out.metrics["uecr/budget_error"]) and out.metrics["uecr/budget_error"] < 1e-6


@pytest.mark.parametrize("advantage, loss_variant", [("uecr", "none"), ("puu", "none"), ("pg_opd", "none"),
                                                     ("distilled_rl", "none"), ("atod", "none"),
                                                     ("grpo", "naive_hybrid")])
def test_every_teacher_method_trains_and_logs(tiny_model, tmp_path, teacher_path, advantage, loss_variant):
    tr = build(tiny_model, tmp_path, teacher=teacher_path, advantage=advantage, loss_variant=loss_variant, max_steps=2,
               advantage_std="population", advantage_eps=1e-6)
    before = {n: p.detach().clone() for n, p in tr.hook("teacher").model.named_parameters()}
    tr.train()
    steps = [h for h in tr.state.log_history if "loss" in h]
    assert len(steps) == 2 and all(math.isfinite(h["loss"]) for h in steps)
    assert all(h["teacher/forwards"] >= 1 and h["teacher/score_seconds"] > 0 for h in steps)
    if advantage == "uecr":
        assert all(h["uecr/w_std"] > 0 and h["uecr/decomposition_error"] < 1e-9 for h in steps)
    assert all(torch.equal(before[n], p) for n, p in tr.hook("teacher").model.named_parameters())
