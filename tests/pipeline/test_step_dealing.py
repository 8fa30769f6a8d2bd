"""Optimizer steps of a generation batch after stages removed rollouts (trainer/algorithms/deal_plan.py and
trainer/guards/step_skip.py), with several optimizer steps per generation batch (steps_per_generation >
gradient_accumulation_steps):

- fixed: the i-th kept rollout trains in step i mod U, so a step is empty only when the batch kept fewer
  rollouts than it has steps; each step's loss is TRL's loss on that step's kept rollouts (hand count and
  TRL's own GRPOTrainer as the references), and such a run is never stopped as empty;
- the empty-batch stop counts generation batches (RAGEN counts iterations) and its save lands on a batch
  boundary;
- proportional (RAGEN's agent_trainer.py adjust_batch): ceil(K*G / mini-batch) updates per generation, each
  TRL's loss on a batch of exactly its rollouts, the rest skipped without counting.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    kept_rows_only,
    loss_and_grads,
    max_abs_diff,
    near_policy_rollout_func,
    on_rollout_batch,
    prompt_dataset,
    reward_length,
    reward_parity_flat_at,
    reward_token_parity,
    trl_trainer,
    use_vllm_importance_sampling,
)

from trainer import ConfigError, StageResult, WinnowConfig, WinnowGRPOTrainer, register_stage
from trainer.algorithms.deal_plan import FIXED, PROPORTIONAL, DealPlan, compacted_micro_rows

KEEP_ROWS: list[int] = []  # global rows the test dropout keeps (set per test)


@register_stage("rollout_dropout", "test_dealing_keep_rows")
def _keep_rows(batch, args) -> StageResult:
    keep = torch.zeros(batch.N, dtype=torch.bool)
    keep[KEEP_ROWS] = True
    return StageResult(keep=keep)


# --- the placement rule, by hand ------------------------------------------------------------------------

def _windows(plan: DealPlan) -> list[int]:
    per_micro = plan.kept_per_micro_batch()
    per_window = [0] * (plan.micro_batches // plan.accumulation)
    for i, n in enumerate(per_micro):
        per_window[plan.window(i)] += n
    return per_window


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("S, A", [(4, 1), (8, 2), (6, 3), (8, 8)])
def test_fixed_step_i_gets_kept_rows_i_mod_u(world, S, A):
    """Global kept row i trains in step i mod U: every step holds floor(K/U) or ceil(K/U) kept rows, so a step
    is empty exactly when K < U; no micro-batch overflows."""
    b, U = 4, S // A
    gen = torch.Generator().manual_seed(world * 100 + S)
    for _ in range(30):
        counts = tuple(int(c) for c in torch.randint(0, S * b + 1, (world,), generator=gen))
        plan = DealPlan(FIXED, counts, S, A, micro_rows=b, first_micro_step=0)
        K = sum(counts)
        per_window = _windows(plan)
        assert sorted(per_window) == sorted([K // U + (1 if j < K % U else 0) for j in range(U)])
        assert sum(1 for n in per_window if n == 0) == max(0, U - K)
        for rank in range(world):
            load = [0] * S
            for micro in plan.placement(rank):
                load[micro] += 1
            assert max(load) <= b
        assert plan.updates() == min(K, U)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_proportional_compacted_takes_ceil_k_over_m_full_steps(world):
    """With compaction (kept rows dealt round-robin over processes) K kept rows take ceil(K/M) updates of M =
    b*A*world rows, every one but the last full."""
    S, A, b = 8, 2, 2
    M = b * A * world
    for K in range(0, S * b * world + 1):
        rows = compacted_micro_rows(K, world, S, A, b, PROPORTIONAL)
        counts = tuple(len(range(r, K, world)) for r in range(world))
        plan = DealPlan(PROPORTIONAL, counts, S, A, micro_rows=rows, first_micro_step=0)
        n = math.ceil(K / M)
        per_window = _windows(plan)
        assert plan.updates() == n
        assert per_window[: max(n - 1, 0)] == [M] * max(n - 1, 0)
        assert sum(per_window) == K and all(v == 0 for v in per_window[n:])


# --- through the trainer ----------------------------------------------------------------------------------

def build(tmp_path, tiny_model, name, reward_funcs=None, **overrides):
    args = WinnowConfig(output_dir=str(tmp_path / name), **{**BASE_ARGS, **overrides})
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=reward_funcs or [reward_token_parity, reward_length],
                             args=args, train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


def micro_batches(tr, generation_seed: int = 1234) -> list[dict]:
    """One generation batch through the trainer's real _prepare_inputs, one micro-batch per micro-step (the
    micro-step counter advanced as the trainer's training_step does)."""
    tr.model.train()
    if tr.optimizer is None:  # an empty step arms the optimizer's skip
        tr.create_optimizer()
    batch = next(iter(tr.get_train_dataloader()))
    torch.manual_seed(generation_seed)
    out = []
    for _ in range(tr.args.steps_per_generation):
        out.append(tr._prepare_inputs(batch))
        tr.generation_buffer.advance()
    return out


def _concat_kept(batches: list[dict]) -> dict:
    parts = [kept_rows_only(b)[0] for b in batches]
    keys = [k for k, v in parts[0].items() if torch.is_tensor(v) and v.dim() > 0]
    merged = {k: torch.cat([p[k] for p in parts]) for k in keys}
    merged["num_items_in_batch"] = (merged["completion_mask"] * merged["tool_mask"]).sum()
    return merged


@pytest.mark.parametrize("compact", [True, False])
def test_fixed_one_kept_rollout_per_step_each_trl_loss(tiny_model, tmp_path, compact):
    """4 optimizer steps per generation (S=4, A=1), 4 kept rollouts: each step trains on exactly one, and its loss
    and gradient are TRL's GRPOTrainer's on that rollout alone (TRL's random split would leave some steps with
    none and others with two)."""
    KEEP_ROWS[:] = [1, 6, 11, 12]
    tr = build(tmp_path, tiny_model, f"fixed-{compact}", rollout_dropout="test_dealing_keep_rows", loss_type="grpo",
               per_device_train_batch_size=4, steps_per_generation=4, compact_batch=compact, beta=0.04)
    ref = trl_trainer(tiny_model, str(tmp_path / "ref"), per_device_train_batch_size=4, loss_type="grpo", beta=0.04)
    for inputs in micro_batches(tr):
        sliced, kept = kept_rows_only(inputs)
        assert int(kept.sum()) == 1
        loss, grads = loss_and_grads(tr, inputs)
        ref_loss, ref_grads = loss_and_grads(ref, sliced)
        assert abs(float(loss - ref_loss)) <= 1e-6 * max(1.0, abs(float(ref_loss)))
        assert max_abs_diff(grads, ref_grads) <= 1e-6 * max(float(g.abs().max()) for g in ref_grads.values())
    assert tr._metrics["train"]["stages/optimizer_steps"] == [4.0]


@pytest.mark.parametrize("keep, compact, empty_per_generation",
                         [([1, 6, 11, 12], False, 0), ([1, 6, 11, 12, 14], True, 0), ([5, 9], True, 2)])
def test_fixed_never_stops_a_run_that_keeps_rollouts(tiny_model, tmp_path, keep, compact, empty_per_generation):
    """empty_batch_stop_steps=1 with 4 optimizer steps per generation: K >= U kept rows leave no step empty; K=2 < U=4
    leaves exactly U-K=2 steps of each generation empty, skipped and not counted: the run reaches max_steps."""
    KEEP_ROWS[:] = keep
    tr = build(tmp_path, tiny_model, f"nostop-{len(keep)}", rollout_dropout="test_dealing_keep_rows",
               per_device_train_batch_size=4, steps_per_generation=4, empty_batch_stop_steps=1, max_steps=8,
               compact_batch=compact)
    tr.train()
    assert tr.state.global_step == 8
    empty = [h["stages/empty_step"] for h in tr.state.log_history if "stages/empty_step" in h]
    assert len(empty) == 8
    assert [sum(empty[:4]), sum(empty[4:])] == [empty_per_generation] * 2
    updates = [
        h["stages/optimizer_steps"] for h in tr.state.log_history if "stages/optimizer_steps" in h
    ]
    assert updates == [4.0 - empty_per_generation] * 2
    assert not any("winnow_stop_reason" in h for h in tr.state.log_history)


def test_stop_counts_generation_batches_and_saves_on_a_boundary(tiny_model, tmp_path):
    """Generation batches 2 and 3 (steps 5-12; 4 optimizer steps each) keep nothing: with empty_batch_stop_steps=2
    training stops after step 12 -- the last step of batch 3, not after two empty optimizer steps -- and the
    stop's checkpoint is on a batch boundary like the scheduled ones."""
    tr = build(tmp_path, tiny_model, "stop", reward_funcs=[reward_parity_flat_at(5, 9)], rollout_filter="snr",
               per_device_train_batch_size=4, steps_per_generation=4, empty_batch_stop_steps=2, max_steps=16,
               save_strategy="steps", save_steps=4)
    tr.train()
    assert tr.state.global_step == 12
    saved = sorted(int(d.split("-")[1]) for d in os.listdir(tmp_path / "stop") if d.startswith("checkpoint-"))
    assert saved and all(step % 4 == 0 for step in saved) and saved[-1] == 12
    history = tr.state.log_history
    assert [h["stages/empty_generation"] for h in history if "stages/empty_generation" in h] == [0.0, 1.0, 1.0]
    assert any("winnow_stop_reason" in h and "generation batches" in h["winnow_stop_reason"] for h in history)


def _check_updates(tr, ref, batches: list[dict], kept_per_step: list[int], step_weight) -> None:
    """Steps of two micro-batches each: step j holds ``kept_per_step[j]`` kept rows; an empty one runs no forward;
    the others' loss and gradient (summed over their micro-batches) equal TRL's GRPOTrainer on one batch of exactly
    the step's kept rows, times ``step_weight(rows)``."""
    for step, rows in enumerate(kept_per_step):
        pair = batches[2 * step: 2 * step + 2]
        assert sum(int(kept_rows_only(b)[1].sum()) for b in pair) == rows
        if rows == 0:
            assert all(not b.trains for b in pair)
            continue
        losses, grads = zip(*(loss_and_grads(tr, b) for b in pair))
        loss, grad = sum(losses), {k: grads[0][k] + grads[1][k] for k in grads[0]}
        ref_loss, ref_grads = loss_and_grads(ref, _concat_kept(pair))
        w = step_weight(rows)
        ref_loss, ref_grads = ref_loss * w, {k: g * w for k, g in ref_grads.items()}
        assert abs(float(loss - ref_loss)) <= 1e-6 * max(1.0, abs(float(ref_loss)))
        assert max_abs_diff(grad, ref_grads) <= 1e-5 * max(float(g.abs().max()) for g in ref_grads.values())


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
@pytest.mark.parametrize("compact", [True, False])
def test_proportional_update_is_trl_loss_on_its_rows(tiny_model, tmp_path, loss_type, compact):
    """S=8 micro-steps, A=2 -> 4 steps of M=4 rollouts; 6 kept: ceil(6/4)=2 updates. Each update's loss and gradient
    (summed over its micro-batches) equal TRL's GRPOTrainer on one batch of exactly the update's kept rollouts;
    the last two steps hold none and run no forward."""
    KEEP_ROWS[:] = [0, 3, 4, 9, 10, 15]
    tr = build(tmp_path, tiny_model, f"prop-{loss_type}-{compact}", rollout_dropout="test_dealing_keep_rows",
               loss_type=loss_type, per_device_train_batch_size=2, gradient_accumulation_steps=2,
               steps_per_generation=8, filtered_updates="proportional", compact_batch=compact, beta=0.04)
    ref = trl_trainer(tiny_model, str(tmp_path / "ref"), per_device_train_batch_size=4, loss_type=loss_type, beta=0.04)
    batches = micro_batches(tr)
    assert tr._metrics["train"]["stages/optimizer_steps"] == [2.0]
    _check_updates(tr, ref, batches, [4, 2, 0, 0], step_weight=lambda rows: 1.0)


@pytest.mark.parametrize("compact, is_correction", [(True, False), (False, False), (True, True)])
def test_verl_minibatch_update_is_its_rows_over_the_full_minibatch(tiny_model, tmp_path, compact, is_correction):
    """verl's dp_actor (hexuandeng/GRPODropout@4ad3b3b:verl/verl/workers/actor/dp_actor.py update_policy: the kept rows
    split into mini-batches of M, each micro-batch loss divided by the fixed accumulation count): S=8, A=2 -> steps of
    M=4 rollouts; 6 kept -> ceil(6/4)=2 updates, the first of 4 rollouts, the second of 2. Every update's loss and
    gradient are TRL's GRPOTrainer's on exactly its rollouts times rows/M: the partial update is half as large (the
    proportional mode would make it a full mean). The last two steps hold none and run no forward. With TRL's vLLM
    importance-sampling correction on (a user's choice; vLLM-like sampler log-probs), each re-dealt row carries its
    own ratio: the same equality holds against TRL's corrected loss."""
    KEEP_ROWS[:] = [0, 3, 4, 9, 10, 15]
    M = 4
    tr = build(tmp_path, tiny_model, f"verl-{compact}", rollout_dropout="test_dealing_keep_rows", loss_type="grpo",
               per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=8,
               filtered_updates="verl_minibatch", compact_batch=compact, beta=0.04)
    ref = trl_trainer(tiny_model, str(tmp_path / "ref"), per_device_train_batch_size=4, loss_type="grpo", beta=0.04)
    outputs = []
    if is_correction:
        tr.rollout_func = near_policy_rollout_func
        use_vllm_importance_sampling(tr)
        use_vllm_importance_sampling(ref)
        # TRL's batch dict as generated, before any row moves
        on_rollout_batch(tr, lambda output, batch: outputs.append(dict(output)))
    batches = micro_batches(tr)
    assert tr._metrics["train"]["stages/optimizer_steps"] == [2.0]
    if is_correction:  # every kept row carries the ratio TRL computed for it, wherever it was dealt
        ratios = {tuple(ids[m > 0].tolist()): r[m > 0] for ids, m, r in zip(
            outputs[0]["completion_ids"], outputs[0]["completion_mask"], outputs[0]["importance_sampling_ratio"])}
        moved = [(ids, m, r) for b in batches for ids, m, r, keep in zip(
            b["completion_ids"], b["completion_mask"], b["importance_sampling_ratio"], b["tool_mask"].bool().any(1))
            if keep]
        assert len(moved) == 6 and len({float(r[m > 0].sum()) for _, m, r in moved}) == 6  # six different ratios
        for ids, m, r in moved:
            assert torch.equal(r[m > 0], ratios[tuple(ids[m > 0].tolist())])
    _check_updates(tr, ref, batches, [4, 2, 0, 0], step_weight=lambda rows: rows / M)


@pytest.mark.parametrize("S, A, mu", [(3, 2, 2), (4, 2, 1), (2, 1, 2)])
def test_optimizer_steps_metric_counts_the_optimizer_steps_taken(tiny_model, tmp_path, S, A, mu):
    """stages/optimizer_steps equals the optimizer steps the real trainer took between two generations
    (counted by a callback's on_step_end against TRL's generation calls). With S=3, A=2 and 2 passes the six
    micro-steps make 3 optimizer steps, the middle one spanning both passes (it was counted once per pass: 4)."""
    from transformers import TrainerCallback

    KEEP_ROWS[:] = list(range(1, 4 * S))  # one row dropped: the step-dealing path, every step keeps rows
    tr = build(tmp_path, tiny_model, f"updates-{S}-{A}-{mu}", rollout_dropout="test_dealing_keep_rows",
               per_device_train_batch_size=4, steps_per_generation=S, gradient_accumulation_steps=A,
               num_iterations=mu, max_steps=2 * S * mu // A)
    generations, step_of_generation = [], []
    generate = tr._generate_and_score_completions

    def counted(inputs):
        generations.append(tr.state.global_step)
        return generate(inputs)

    class StepsTaken(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step_of_generation.append(len(generations) - 1)  # the latest generation this step trained on

    tr._generate_and_score_completions = counted
    tr.add_callback(StepsTaken())
    tr.train()
    history = tr.state.log_history
    assert [h["stages/empty_step"] for h in history if "stages/empty_step" in h] == [0.0] * tr.state.global_step
    taken = [float(step_of_generation.count(g)) for g in range(len(generations))]
    assert len(generations) == 2 and sum(taken) == tr.state.global_step
    logged = [h["stages/optimizer_steps"] for h in history if "stages/optimizer_steps" in h]
    assert logged == taken == [S * mu / A] * 2


# The CPU SNR demo's filter (configs/demo/smollm2-arithmetic-snr.yaml) vs RAGEN's "nofilter" (rho 1, zero-variance
# groups kept), with 4 optimizer steps of one group each per generation.
DEMO_FILTER = dict(rollout_filter="snr", snr_metric="reward_variance", snr_strategy="top_p", snr_top_p_mode="linear",
                   snr_value=0.9, snr_include_zero=False)
NO_FILTER = {**DEMO_FILTER, "snr_value": 1.0, "snr_include_zero": True}


def test_proportional_updates_filtered_vs_unfiltered(tiny_model, tmp_path):
    """Updates per generation are logged and equal ceil(K*G / mini-batch) for every generation, and that is how
    many optimizer steps of the generation actually trained; the filtered run takes fewer than the unfiltered."""
    geometry = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=8,
                    max_steps=12, filtered_updates="proportional", loss_type="dapo", empty_batch_stop_steps=0)
    M, G, U = 2 * 2, 4, 4
    taken = {}
    for name, stage in (("filtered", DEMO_FILTER), ("unfiltered", NO_FILTER)):
        tr = build(tmp_path, tiny_model, name, reward_funcs=[reward_parity_flat_at(5)], **geometry, **stage)
        tr.train()
        history = tr.state.log_history
        kept = [h["snr/kept_groups"] for h in history if "snr/kept_groups" in h]
        updates = [h["stages/optimizer_steps"] for h in history if "stages/optimizer_steps" in h]
        empty = [h["stages/empty_step"] for h in history if "stages/empty_step" in h]
        assert len(kept) == len(updates) == 3 and len(empty) == 12
        assert updates == [math.ceil(k * G / M) for k in kept]
        assert [U - sum(empty[U * g: U * (g + 1)]) for g in range(3)] == updates
        taken[name] = updates
    assert taken["unfiltered"] == [4.0, 4.0, 4.0]
    assert taken["filtered"][1] == 0.0 and 0 < taken["filtered"][0] < 4  # generation 2 has flat rewards


@pytest.mark.parametrize("overrides", [dict(filtered_updates="some"),
                                       dict(filtered_updates="proportional", steps_per_generation=3,
                                            gradient_accumulation_steps=2),
                                       dict(filtered_updates="verl_minibatch", steps_per_generation=3,
                                            gradient_accumulation_steps=2),
                                       dict(filtered_updates="verl_minibatch", loss_type="dapo")])
def test_filtered_updates_config_errors_name_the_field(overrides):
    with pytest.raises(ConfigError) as err:
        WinnowConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to="none", rollout_filter="snr",
                     num_generations=2, per_device_train_batch_size=2, **overrides)
    assert err.value.field_name == "filtered_updates" and "Fix:" in str(err.value)
