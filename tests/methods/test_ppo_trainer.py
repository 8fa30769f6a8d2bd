"""PPO with a learned critic (``advantage: gae``) in the trainer, against hand computations.

The run: the tiny Qwen3, a reward with within-group variance (token parity), gamma = lambda = 1 (RAGEN-2's PPO), the
DAPO token-mean loss (RAGEN-2's loss_agg_mode token-mean, which the critic shares as verl's does). Anchors outside the
code under test: a copy of the critic's initial weights scored with a plain forward (the values), the closed form of
GAE at gamma = lambda = 1 (returns = the episode's reward on every token, advantages = reward - value, whitened), and
an AdamW of torch's own stepped on verl's clipped value loss written out here.
"""

from __future__ import annotations

import copy

import pytest
import torch
from harness import BASE_ARGS, prompt_dataset, reward_token_parity, tiny_model_path
from line_env import Line
from transformers import AutoTokenizer

import rewards
from envs import available, register_env
from envs.episode import EpisodeSettings
from trainer import WinnowConfig, WinnowGRPOTrainer
from trainer.config.errors import ConfigError
from trainer.data.envs import level_dataset
from trainer.rollout.multi_turn import ChatTokens, MultiTurnRollout, training_chat_template

pytestmark = pytest.mark.integration

CRITIC_LR, CLIP_V = 1e-2, 1e-3  # a large step and a narrow clip range: the second update clips


def make_trainer(tmp_path, **overrides):
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "advantage": "gae", "loss_type": "dapo",
                                                     "critic_learning_rate": CRITIC_LR, "cliprange_value": CLIP_V,
                                                     **overrides})
    return WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity], args=args,
                             train_dataset=prompt_dataset())


def spy_micro_batches(trainer) -> list[dict]:
    """Copies of every micro-batch the critic trains on."""
    hook = trainer.hook("ppo_critic")
    train = hook.train_micro_batch
    seen = []

    def spy(tr, inputs, call):
        seen.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in inputs.items()})
        return train(tr, inputs, call)

    hook.train_micro_batch = spy
    return seen


def values_of(model, inputs) -> torch.Tensor:
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    C = inputs["completion_ids"].shape[1]
    return model(input_ids=ids, attention_mask=attention).logits[:, -C - 1:-1, 0]


def test_two_ppo_steps_match_the_hand_computation(tmp_path):
    """Two optimizer steps on one generation batch (num_iterations 2): the old values, returns and advantages the
    policy and critic train on, and the critic's weights after both updates (the second one clipped)."""
    trainer = make_trainer(tmp_path, max_steps=2, num_iterations=2)
    critic = trainer.hook("ppo_critic").critic
    # verl's critic has no dropout (transformers' token-classification head defaults to 0.1): values are a function
    dropouts = [m.p for m in critic.model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(p == 0.0 for p in dropouts)
    reference = copy.deepcopy(critic.model)
    seen = spy_micro_batches(trainer)
    trainer.train()
    assert len(seen) == 2
    first = seen[0]
    mask = first["completion_mask"].float()
    with torch.no_grad():
        V = values_of(reference, first) * mask
    torch.testing.assert_close(first["old_values"], V, rtol=1e-5, atol=1e-6)
    # gamma = lambda = 1: returns are the episode's reward on each of its tokens, advantages reward - value whitened
    R = torch.tensor(reward_token_parity(None, [row[m.bool()].tolist() for row, m in
                                                zip(first["completion_ids"], first["completion_mask"])]))
    torch.testing.assert_close(first["returns"], R[:, None] * mask, rtol=1e-5, atol=1e-6)
    raw = (R[:, None] - V) * mask
    n = mask.sum()
    mean = raw.sum() / n
    var = ((raw - mean) ** 2 * mask).sum() / (n - 1)
    whitened = (raw - mean) * torch.rsqrt(var + 1e-8) * mask
    torch.testing.assert_close(first["advantages"] * mask, whitened, rtol=1e-4, atol=1e-5)
    assert float(raw.abs().max()) > 0.05  # a non-trivial target

    # the critic: verl's clipped value loss, token mean, clip 1.0, AdamW -- written out, on the same micro-batches
    initial = {k: p.detach().clone() for k, p in reference.named_parameters()}
    optimizer = torch.optim.AdamW(reference.parameters(), lr=CRITIC_LR, weight_decay=0.01)
    clipped_tokens = []
    for inputs in seen:
        m = inputs["completion_mask"].float()
        pred = values_of(reference, inputs)
        old, ret = inputs["old_values"], inputs["returns"]
        clipped = old + (pred - old).clamp(-CLIP_V, CLIP_V)
        per_token = torch.maximum((pred - ret) ** 2, (clipped - ret) ** 2)
        clipped_tokens.append(float((((clipped - ret) ** 2 > (pred - ret) ** 2).float() * m).sum()))
        loss = 0.5 * (per_token * m).sum() / m.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    assert clipped_tokens[0] == 0 and clipped_tokens[1] > 0  # the second update runs against the clip
    ours = dict(critic.model.named_parameters())
    theirs = dict(reference.named_parameters())
    moved = max(float((theirs[k].detach() - initial[k]).abs().max()) for k in theirs)
    diff = max(float((ours[k] - theirs[k]).detach().abs().max()) for k in ours)
    assert moved > 1e-3 and diff <= 1e-3 * moved, (diff, moved)
    logs = [e for e in trainer.state.log_history if "critic/vf_loss" in e]
    assert len(logs) == 2 and logs[1]["critic/vf_clipfrac"] > 0 and "critic/vf_explained_var" in logs[0]


def test_ppo_refuses_what_it_does_not_compose_with(tmp_path):
    """GRPODropout recenters group advantages (no group baseline under GAE), and fp16 has no loss scaler for the
    critic: both refused before weights load, naming the field."""
    with pytest.raises(ConfigError, match="rollout_dropout"):
        WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "advantage": "gae", "rollout_dropout": "grpodropout"})


@pytest.mark.parametrize("steps_per_generation", [1, 2])
def test_resume_restores_the_critic_exactly(tmp_path, steps_per_generation):
    """A run resumed from its step-1 checkpoint ends with the same critic (weights and AdamW state: a second step
    from a fresh optimizer would differ) and the same policy as the run that was not interrupted -- also from the
    middle of a generation batch (``steps_per_generation`` 2: step 2 trains on the rows, old values and returns
    generated before the checkpoint)."""
    common = dict(max_steps=2, save_strategy="steps", save_steps=1, steps_per_generation=steps_per_generation,
                  per_device_train_batch_size=8 // steps_per_generation)
    whole = make_trainer(tmp_path / "whole", **common)
    whole.train()
    assert (tmp_path / "whole" / "checkpoint-1" / "critic" / "optimizer.pt").is_file()
    resumed = make_trainer(tmp_path / "resumed", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-1"))
    for a, b in ((whole.hook("ppo_critic").critic.model, resumed.hook("ppo_critic").critic.model),
                 (whole.model, resumed.model)):
        for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
            assert torch.equal(p, q), name


def test_critic_follows_gradient_checkpointing(tmp_path):
    """With gradient_checkpointing the critic recomputes its layers too (its activations are the policy's size):
    one step trains it, and the value loss equals the same step's without checkpointing."""
    losses = []
    for flag in (False, True):
        trainer = make_trainer(tmp_path / str(flag), max_steps=1, gradient_checkpointing=flag)
        assert trainer.hook("ppo_critic").critic.model.is_gradient_checkpointing == flag
        trainer.train()
        losses.append([h["critic/vf_loss"] for h in trainer.state.log_history if "critic/vf_loss" in h])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and len(losses[0]) == 1


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])  # a chunk weighs 1 (global token normaliser) / rows share
def test_critic_in_token_budget_chunks_trains_like_unchunked(tmp_path, loss_type):
    """With ``micro_batch_tokens`` the critic runs the policy's token-budget chunks (each forward and backward within
    the budget) and ends where the unchunked run ends: the same value loss per step, the same critic and policy.
    Two optimizer steps of one generation batch (num_iterations 2): the second runs against the value clip."""
    runs = {}
    for budget in (None, 40):
        trainer = make_trainer(tmp_path / str(budget), max_steps=2, num_iterations=2, micro_batch_tokens=budget,
                               loss_type=loss_type)
        trainer.train()
        runs[budget] = trainer
    logs = {b: [h for h in t.state.log_history if "critic/vf_loss" in h] for b, t in runs.items()}
    assert sum(h["tokens/loss_chunks"] for h in logs[40]) > 2 * len(logs[40])  # really chunked
    assert logs[None][1]["critic/vf_clipfrac"] > 0
    for whole, chunked in zip(logs[None], logs[40], strict=True):
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "loss"):
            assert chunked[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key
    for a, b in ((runs[None].hook("ppo_critic").critic.model, runs[40].hook("ppo_critic").critic.model),
                 (runs[None].model, runs[40].model)):
        for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)


def _verl_gae_loop(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """verl's recursion over one episode's loss tokens only (observation tokens removed beforehand): the advantages
    before whitening, written as a plain loop."""
    advantages, next_value, next_advantage = [0.0] * len(values), 0.0, 0.0
    for t in reversed(range(len(values))):
        delta = rewards[t] + gamma * next_value - values[t]
        next_advantage = delta + gamma * lam * next_advantage
        next_value = values[t]
        advantages[t] = next_advantage
    return advantages


def test_multi_turn_gae_skips_the_observation_tokens(tmp_path):
    """Multi-turn episodes (the Line walk, two turns): the environment's observation tokens between the turns are
    outside the loss mask, and GAE (gamma 0.9, lambda 0.8: the skipping shows only when gamma * lambda < 1) runs over
    the model's tokens alone with the episode's reward on its last one -- the returns and whitened advantages the
    policy and critic train on equal a plain loop over each episode's loss tokens."""
    if "test-line" not in available():
        register_env("test-line")(Line)
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    rollout = MultiTurnRollout("test-line", {}, EpisodeSettings(max_turns=2), 8, 0.5,
                               ChatTokens(tok, training_chat_template(tok)))
    gamma, lam = 0.9, 0.8
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "max_completion_length": 160, "max_steps": 1,
                                                     "advantage": "gae", "loss_type": "dapo", "gae_gamma": gamma,
                                                     "gae_lambda": lam})
    trainer = WinnowGRPOTrainer(model=tiny_model_path(), args=args, rollout_func=rollout,
                                reward_funcs=[rewards.get_reward("env_return"), reward_token_parity],
                                train_dataset=level_dataset("test-line", 8, 0))
    seen = spy_micro_batches(trainer)
    trainer.train()
    (batch,) = seen
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    # observation tokens inside an episode (a masked-out token before the episode's last model token)
    last = [int(row.nonzero().max()) for row in mask]
    assert any(not bool(row[: end + 1].all()) for row, end in zip(mask, last))
    raw, returns = [], torch.zeros_like(batch["returns"])
    R = trainer.state.log_history[0]["reward"]  # the batch's mean total reward, a check on the placement below
    totals = []
    for i, row in enumerate(mask):
        idx = row.nonzero().flatten().tolist()
        V = batch["old_values"][i, idx].tolist()
        total = float(batch["returns"][i, idx[-1]])  # at the last token G_T = A_T + V_T = r_T
        totals.append(total)
        A = _verl_gae_loop([0.0] * (len(idx) - 1) + [total], V, gamma, lam)
        raw.extend(A)
        returns[i, idx] = torch.tensor([a + v for a, v in zip(A, V)])
    assert sum(totals) / len(totals) == pytest.approx(R, abs=1e-5)  # the episode's reward sits on its last token
    torch.testing.assert_close(batch["returns"], returns, rtol=1e-5, atol=1e-6)
    raw = torch.tensor(raw)
    whitened = (raw - raw.mean()) / raw.std()
    torch.testing.assert_close(batch["advantages"][mask], whitened, rtol=1e-4, atol=1e-5)
    assert float(batch["advantages"][~mask].abs().max()) == 0.0
