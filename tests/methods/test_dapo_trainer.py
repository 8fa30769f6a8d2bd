"""DAPO's dynamic sampling through the real trainer (tiny Qwen3, CPU, deterministic rollouts).

Groups whose reward is constant are replaced by groups from newly generated batches until the generation batch
holds only mixed groups; the bound (max_num_gen_batches) is respected, and what happens at the bound is what
``dynamic_sampling_on_limit`` says. Overlong shaping through a recipe is covered in test_baseline_recipes_smoke.
"""

from __future__ import annotations

import pytest
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    near_policy_rollout_func,
    prompt_dataset,
    reward_token_parity,
    spy_batches,
    use_vllm_importance_sampling,
)
from trl import GRPOTrainer

from trainer import ConfigError, WinnowConfig, WinnowGRPOTrainer
from trainer.algorithms.dapo import mixed_groups

ROWS = 16  # 4 prompt groups of 4 per generation batch


class Recorder:
    """Reward function: 1.0 for every rollout of prompts whose answer is a multiple of 3 (an all-correct group),
    token parity otherwise; records the answers it scored (one call per generated batch)."""

    __name__ = "acc"

    def __init__(self, constant_everywhere: bool = False):
        self.calls: list[list[int]] = []
        self.rows: list[tuple[list[int], float]] = []  # (completion ids, reward) of every generated row, in order
        self.constant_everywhere = constant_everywhere

    def __call__(self, completions, completion_ids, answer, **kwargs):
        self.calls.append([int(a) for a in answer])
        parity = reward_token_parity(completions, completion_ids)
        out = [1.0 if self.constant_everywhere or int(a) % 3 == 0 else p for a, p in zip(answer, parity)]
        self.rows += [(list(ids), r) for ids, r in zip(completion_ids, out)]
        return out


def build(tiny_model, tmp_path, reward, rollout_func=deterministic_rollout_func, **overrides):
    args = WinnowConfig(
        output_dir=str(tmp_path / "out"),
        **{**BASE_ARGS, "per_device_train_batch_size": ROWS, "dynamic_sampling": True, "max_steps": 2,
           "dynamic_sampling_metric": "acc", **overrides},
    )
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward], args=args, train_dataset=prompt_dataset(48),
                             rollout_func=rollout_func)


def logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_constant_groups_are_replaced_until_the_batch_is_mixed(tiny_model, tmp_path):
    reward = Recorder()
    tr = build(tiny_model, tmp_path, reward)
    seen = spy_batches(tr)
    tr.train()
    assert len(seen) == 2
    gen_batches = logged(tr, "dynamic_sampling/gen_batches")
    first_mixed = logged(tr, "dynamic_sampling/first_batch_mixed_ratio")
    assert [n > 1 for n in gen_batches] == [r < 1 for r in first_mixed]  # refills exactly when a group was constant
    assert max(gen_batches) >= 2, "the data has all-correct groups, so some step needed a refill"
    assert sum(gen_batches) == len(reward.calls)  # one reward call per generated batch: the count is honest
    assert tr.hook("dynamic_sampling").refills_drawn == sum(gen_batches) - len(gen_batches)
    for batch in seen:
        assert batch.N == ROWS and bool(batch.keep.all())  # a full batch, nothing to drop downstream
        assert bool(mixed_groups(batch.R_k[:, 0], 4).all())  # only mixed groups reach the loss
    assert logged(tr, "dynamic_sampling/limit_hit") == [0.0, 0.0]
    assert logged(tr, "dynamic_sampling/mixed_groups") == [4.0, 4.0]
    # the refill stream is not the main stream: its first batch holds other prompts than the main first batch
    assert reward.calls[1] != reward.calls[0]


def test_the_kept_groups_are_the_first_mixed_ones_in_generation_order(tiny_model, tmp_path):
    reward = Recorder()
    tr = build(tiny_model, tmp_path, reward, max_steps=1)
    seen = spy_batches(tr)
    tr.train()
    groups = [reward.rows[i : i + 4] for i in range(0, len(reward.rows), 4)]
    mixed = [g for g in groups if len({r for _, r in g}) > 1][:4]
    assert len(groups) > 4, "this batch needed a refill"
    batch = seen[0]
    for row, (ids, r) in enumerate(row for g in mixed for row in g):
        n = int(batch.mask[row].numel())
        got = batch.completion_ids[row, : len(ids)].tolist()
        assert got == ids[:n], f"row {row}: the pipeline's batch is not the first mixed groups in order"
        assert batch.R_k[row, 0].item() == pytest.approx(r)


class NarrowRefills:
    """:func:`near_policy_rollout_func`, with every batch after the first cut to 4-token completions: refill rounds
    are narrower than the first (TRL pads each generation batch to its own longest completion)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, prompts, trainer):
        out = near_policy_rollout_func(prompts, trainer)
        self.calls += 1
        if self.calls > 1:
            for key in ("completion_ids", "logprobs", "env_mask"):
                out[key] = [v[:4] for v in out[key]]
        return out


def vespo_phi(batch: dict) -> torch.Tensor:
    """TRL 1.16's VESPO weight per row (GRPOTrainer.get_gamma_weights) at the sampling policy (log-ratio 0): set by
    the importance-sampling ratios alone."""
    mask = batch["completion_mask"] * batch["tool_mask"]
    isr = batch["importance_sampling_ratio"]
    A = batch["advantages"].unsqueeze(1)
    return GRPOTrainer.get_gamma_weights(A, torch.zeros_like(isr), mask, isr).squeeze(1)


def test_vespo_token_is_merged_rows_keep_the_phi_of_their_round(tiny_model, tmp_path):
    """The trained batch merges rows of several generation batches, each padded by TRL to its own longest
    completion. With VESPO and TRL's token-level importance-sampling ratios (VESPO sums their log over every column,
    unmasked), each trained row's phi is the one TRL's batch of its own round gives it (TRL's padded ratio is 1;
    padded with 0, phi is ~0), and the step logs TRL's phi mean of those rows."""
    tr = use_vllm_importance_sampling(build(tiny_model, tmp_path, Recorder(), rollout_func=NarrowRefills(),
                                            max_steps=1, loss_type="vespo"))
    rounds, trained, fill = [], [], tr.hook("dynamic_sampling").fill

    def recording_fill(output, generate):
        rounds.append(dict(output))

        def recorded(refill):
            rounds.append(dict(generate(refill)))
            return rounds[-1]

        local, keep, metrics = fill(output, recorded)
        trained.append(dict(local))
        return local, keep, metrics

    tr.hook("dynamic_sampling").fill = recording_fill
    tr.train()
    batch, sources = trained[0], tr.hook("dynamic_sampling").last_sources
    assert len(rounds) >= 2 and sources is not None  # rows of several rounds
    assert batch["importance_sampling_ratio"].shape == batch["completion_ids"].shape  # token-level ratios
    want = torch.stack([vespo_phi(rounds[int(s) // ROWS])[int(s) % ROWS] for s in sources])
    widths = [rounds[int(s) // ROWS]["completion_ids"].shape[1] for s in sources]
    assert any(w < batch["completion_ids"].shape[1] for w in widths), widths  # rows padded wider than TRL made them
    assert float(want.min()) > 0.5
    torch.testing.assert_close(vespo_phi(batch), want, rtol=1e-6, atol=0)
    assert logged(tr, "vespo/phi_seq_mean")[0] == pytest.approx(float(want.mean()), rel=1e-3)  # log-ratio ~0


def test_the_bound_is_respected_and_partial_trains_on_nothing_when_nothing_mixed(tiny_model, tmp_path):
    reward = Recorder(constant_everywhere=True)
    tr = build(tiny_model, tmp_path, reward, max_steps=1, max_num_gen_batches=3)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    assert len(reward.calls) == 3  # exactly max_num_gen_batches generation batches
    assert logged(tr, "dynamic_sampling/gen_batches") == [3.0]
    assert logged(tr, "dynamic_sampling/limit_hit") == [1.0]
    assert logged(tr, "stages/empty_step") == [1.0]  # no mixed group: the step is skipped
    assert all(torch.equal(before[n], p) for n, p in tr.model.named_parameters())


def test_partial_batch_trains_on_the_mixed_groups_found(tiny_model, tmp_path):
    # every prompt except answers 0..2 mod 6 == 1 is constant: few mixed groups exist, the bound is hit
    class Sparse(Recorder):
        def __call__(self, completions, completion_ids, answer, **kwargs):
            self.calls.append([int(a) for a in answer])
            parity = reward_token_parity(completions, completion_ids)
            return [p if int(a) == 7 else 1.0 for a, p in zip(answer, parity)]

    reward = Sparse()
    tr = build(tiny_model, tmp_path, reward, max_steps=1, max_num_gen_batches=2)
    seen = spy_batches(tr)
    tr.train()
    batch = seen[0]
    found = logged(tr, "dynamic_sampling/mixed_groups")[0]
    assert logged(tr, "dynamic_sampling/limit_hit") == [1.0]
    assert int(batch.keep.sum()) == found * 4 and found < 4
    assert logged(tr, "stages/kept_rollouts") == [found * 4]


def test_error_at_the_bound_names_the_knobs(tiny_model, tmp_path):
    tr = build(tiny_model, tmp_path, Recorder(constant_everywhere=True), max_steps=1, max_num_gen_batches=2,
               dynamic_sampling_on_limit="error")
    with pytest.raises(RuntimeError, match="max_num_gen_batches=2.*dynamic_sampling_on_limit"):
        tr.train()


def test_unknown_metric_and_bad_bound_fail_fast(tiny_model, tmp_path):
    with pytest.raises(ConfigError, match="dynamic_sampling_metric"):
        build(tiny_model, tmp_path, Recorder(), dynamic_sampling_metric="math_accuracy")
    with pytest.raises(ConfigError, match="max_num_gen_batches"):
        WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, max_num_gen_batches=0)


def test_refill_stream_resumes_where_it_stopped(tiny_model, tmp_path):
    """The number of refill batches drawn is checkpointed (winnow_stage_state.json); a trainer restored from it
    continues the refill stream instead of replaying it."""
    a = build(tiny_model, tmp_path / "a", Recorder())
    drawn = [[row["answer"] for row in a.hook("dynamic_sampling")._next_refill()] for _ in range(3)]
    assert drawn[0] != drawn[1]
    b = build(tiny_model, tmp_path / "b", Recorder())
    b.hook("dynamic_sampling").load_state_dict({"refills_drawn": 2})
    assert [row["answer"] for row in b.hook("dynamic_sampling")._next_refill()] == drawn[2]
    assert b._stage_state()["dynamic_sampling"] == {"refills_drawn": 3}
