"""No NaN reaches the weights (issue "Reliability", numerics).

1. The guard (trainer/guards/step_skip.py): a step whose loss -- or, with a finite loss, whose gradient -- is
   not finite is skipped: weights, Adam's moments and the LR schedule are unchanged, a warning names the step,
   and training goes on with normal updates.
2. The stages on hostile-but-legal batches (unscorable groups, zero-variance groups, single-token completions,
   identical and extreme sampler log-probs): every configured stage keeps the loss finite by itself, so the
   guard never has to fire and every weight stays finite.
"""

from __future__ import annotations

import logging

import pytest
import torch
from harness import BASE_ARGS, prompt_dataset, reward_token_parity, tiny_model_path
from transformers import TrainerCallback

from trainer import WinnowConfig, WinnowGRPOTrainer, trl_contact


class Snapshots(TrainerCallback):
    """Weights, Adam's moments and the LR after every optimizer step."""

    def __init__(self, trainer):
        self.trainer, self.steps = trainer, []

    def on_step_end(self, args, state, control, **kwargs):
        opt = (
            self.trainer.optimizer.optimizer
            if hasattr(self.trainer.optimizer, "optimizer")
            else self.trainer.optimizer
        )
        moments = [s["exp_avg"].clone() for s in opt.state.values() if "exp_avg" in s]
        weights = {n: p.detach().clone() for n, p in self.trainer.model.named_parameters()}
        self.steps.append((weights, moments, self.trainer.lr_scheduler.get_last_lr()[0]))


def _trainer(tmp_path, rollout_func=None, reward_funcs=None, **overrides):
    from harness import deterministic_rollout_func

    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "max_steps": 3, "lr_scheduler_type": "linear",
                                                      **overrides})
    return WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=reward_funcs or [reward_token_parity], args=args,
                             train_dataset=prompt_dataset(), rollout_func=rollout_func or deterministic_rollout_func)


def _assert_step_two_skipped(trainer, snaps, caplog, cause):
    (w1, m1, lr1), (w2, m2, lr2), (w3, _, lr3) = snaps.steps
    assert all(torch.equal(w1[n], w2[n]) for n in w1), "weights moved on the skipped step"
    assert all(torch.equal(a, b) for a, b in zip(m1, m2)), "Adam's moments moved on the skipped step"
    assert lr2 == lr1 and lr3 < lr2  # the schedule paused for the skipped step, then resumed
    assert any(not torch.equal(w2[n], w3[n]) for n in w2), "training did not resume after the skip"
    assert all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    assert any("step 2" in r.message and cause in r.message and "skipped" in r.message for r in caplog.records)
    logged = [
        h["numerics/skipped_steps_total"] for h in trainer.state.log_history if "numerics/skipped_steps_total" in h
    ]
    assert logged == [0.0, 1.0, 1.0]


def test_nonfinite_loss_skips_the_step(tmp_path, caplog, monkeypatch):
    trainer = _trainer(tmp_path)
    snaps = Snapshots(trainer)
    trainer.add_callback(snaps)
    original, calls = trl_contact.trl_loss, []

    def poisoned(tr, model, inputs):
        loss = original(tr, model, inputs)
        calls.append(1)
        return loss * float("nan") if len(calls) == 2 else loss

    monkeypatch.setattr(trl_contact, "trl_loss", poisoned)
    with caplog.at_level(logging.WARNING, logger="trainer.guards.step_skip"):
        trainer.train()
    _assert_step_two_skipped(trainer, snaps, caplog, "non-finite loss")


def test_nonfinite_gradient_with_a_finite_loss_skips_the_step(tmp_path, caplog):
    trainer = _trainer(tmp_path)
    snaps = Snapshots(trainer)
    trainer.add_callback(snaps)
    param = trainer.model.model.embed_tokens.weight
    state = {"backwards": 0}

    def poison(grad):
        state["backwards"] += 1
        return grad * float("nan") if state["backwards"] == 2 else grad

    param.register_hook(poison)
    with caplog.at_level(logging.WARNING, logger="trainer.guards.step_skip"):
        trainer.train()
    _assert_step_two_skipped(trainer, snaps, caplog, "non-finite gradient")


def edge_rollout_func(prompts, trainer):
    """Completions of 1 token, identical or extreme sampler log-probs (surprisal up to 1e4 nats per token)."""
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
    tok = trainer.processing_class
    for i, prompt in enumerate(prompts):
        n = 1 if i % 3 == 0 else 4
        out["prompt_ids"].append(tok(prompt, add_special_tokens=False)["input_ids"])
        out["completion_ids"].append([100 + (i % 5) * 7 + k for k in range(n)])
        out["logprobs"].append([-1e4 if i % 2 else -0.5] * n)
    return out


def edge_rewards(prompts, completions, completion_ids, **kwargs):
    """Group 0 unscorable (None), group 1 constant (zero variance), the others vary."""
    group = lambda i: i // BASE_ARGS["num_generations"]  # noqa: E731
    return [
        None if group(i) == 0 else 1.0 if group(i) == 1 else float(len(ids) % 2)
        for i, ids in enumerate(completion_ids)
    ]


STAGES = {
    "grpo": {},
    "grpodropout_policy": {"rollout_dropout": "grpodropout"},
    "grpodropout_sampler": {"rollout_dropout": "grpodropout", "old_logps_source": "sampler"},
    "snr_filter": {"rollout_filter": "snr", "snr_include_zero": True, "snr_value": 0.9},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "clip_cov": {"loss_type": "dapo", "loss_variant": "clip_cov", "clip_cov_ratio": 0.5, "clip_cov_lb": -1e9,
                 "clip_cov_ub": 1e9, "num_iterations": 2},
    "kl_cov": {"loss_type": "dapo", "loss_variant": "kl_cov", "kl_cov_ratio": 0.5, "num_iterations": 2},
    "beyond8020": {"loss_type": "dapo", "top_entropy_quantile": 0.2},
    "uecr": {"advantage": "uecr", "loss_type": "dapo", "beta": 0.01},
    "puu": {"advantage": "puu", "loss_type": "dapo"},
    "pg_opd": {"advantage": "pg_opd", "loss_type": "dapo"},
    "distilled_rl": {"advantage": "distilled_rl", "loss_type": "dapo"},
    "atod": {"advantage": "atod", "loss_type": "dapo"},
    "naive_hybrid": {"loss_variant": "naive_hybrid", "loss_type": "dapo"},
    "dynamic_sampling": {"loss_type": "dapo", "dynamic_sampling": True, "max_num_gen_batches": 2},
}
TEACHER_STAGES = {"uecr", "puu", "pg_opd", "distilled_rl", "atod", "naive_hybrid"}


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_stage_stays_finite_on_hostile_batches(tmp_path, name):
    overrides = dict(STAGES[name])
    if name in TEACHER_STAGES:
        overrides["teacher_model_name_or_path"] = tiny_model_path()
    trainer = _trainer(tmp_path, rollout_func=edge_rollout_func, reward_funcs=[edge_rewards], max_steps=2, **overrides)
    trainer.train()
    assert all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    skipped = [
        h["numerics/skipped_steps_total"] for h in trainer.state.log_history if "numerics/skipped_steps_total" in h
    ]
    assert skipped and skipped[-1] == 0.0  # the stage handled the batch itself; the guard never fired


def test_the_guard_can_be_turned_off(tmp_path):
    trainer = _trainer(tmp_path, skip_nonfinite_steps=False, max_steps=1)
    assert trainer._numerics is None
    trainer.train()
    assert not any("numerics/skipped_steps_total" in h for h in trainer.state.log_history)
