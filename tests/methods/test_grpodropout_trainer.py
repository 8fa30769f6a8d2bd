"""GRPODropout through the real trainer (tiny Qwen3, CPU): dropped rollouts get zero gradient, the kept
count metric matches the batch, advantages are the recentered ones, and `old_logps_source: sampler`
removes the extra old-policy forward."""

from __future__ import annotations

import math

import pytest
from grpodropout_oracle import released_balance_neg, released_grpo
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    kept_rows_only,
    loss_and_grads,
    max_abs_diff,
    one_step_loss_and_grads,
    prompt_dataset,
    reward_length,
    reward_token_parity,
    spy_batches,
    trl_trainer,
)
from trl import GRPOTrainer

from trainer import WinnowConfig, WinnowGRPOTrainer
from trainer.algorithms.dropout import recenter, select_rollouts, sequence_surprisal
from trainer.algorithms.grpo import grpo_advantages

ROWS = 32  # 8 prompt groups of 4: enough groups that GRPODropout removes something in this batch


def build(cls, cfg_cls, tiny_model, tmp_path, **overrides):
    args = cfg_cls(
        output_dir=str(tmp_path / cls.__name__), **{**BASE_ARGS, "per_device_train_batch_size": ROWS, **overrides}
    )
    return cls(model=tiny_model, reward_funcs=[reward_token_parity, reward_length], args=args,
               train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_dropped_rollouts_get_zero_gradient(tiny_model, tmp_path, loss_type):
    tr = build(
        WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, rollout_dropout="grpodropout", loss_type=loss_type
    )
    inputs, loss, grads = one_step_loss_and_grads(tr)
    sliced, kept = kept_rows_only(inputs)
    metrics = tr._metrics["train"]
    assert 0 < int(kept.sum()) < ROWS, "this batch must exercise a deletion"
    assert metrics["stages/kept_rollouts"][-1] == int(kept.sum())
    assert metrics["dropout/kept_ratio"][-1] == pytest.approx(int(kept.sum()) / ROWS)
    assert metrics["dropout/groups_with_deletion"][-1] >= 1
    assert float(inputs["advantages"][~kept].abs().sum()) == 0.0

    # the gradient is TRL's loss on the kept rollouts alone: dropped rollouts contribute exactly nothing
    ref = trl_trainer(tiny_model, str(tmp_path / "ref"), per_device_train_batch_size=ROWS, loss_type=loss_type)
    ref_loss, ref_grads = loss_and_grads(ref, sliced)
    assert abs(float(ref_loss - loss)) <= 1e-6
    assert max_abs_diff(ref_grads, grads) <= 1e-6


def test_advantages_are_the_recentered_selection(tiny_model, tmp_path):
    """Recompute the decision from the batch the trainer saw (rewards, old-policy log-probs) with the pure
    functions: the trainer's advantages are those numbers, and the weighted mean over each kept set is 0."""
    tr = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, rollout_dropout="grpodropout")
    seen = spy_batches(tr)
    inputs, _, _ = one_step_loss_and_grads(tr)
    batch = seen[-1]
    A, _ = grpo_advantages(batch.R, batch.G)
    s = sequence_surprisal(batch.old_logps, batch.mask).view(-1, batch.G)
    keep = select_rollouts(A.view(-1, batch.G), s, delete="positive")
    A_bar = recenter(A.view(-1, batch.G), s, keep).reshape(-1)
    # shuffled, compacted rows (dropped rollouts are gone, zero-weight filler rows have an all-zero loss mask):
    # compare the trained rows with the kept ones as multisets of (advantage, completion) pairs
    pad = tr.processing_class.pad_token_id
    ids_key = lambda ids: ids.masked_fill(ids == pad, 0).sum(1).tolist()  # noqa: E731  (padding-width free)
    trained = inputs["tool_mask"].bool().any(dim=1)
    got = sorted(zip(inputs["advantages"][trained].tolist(), ids_key(inputs["completion_ids"][trained])))
    want = sorted(zip(A_bar[keep.reshape(-1)].tolist(), ids_key(batch.completion_ids[keep.reshape(-1)])))
    assert len(got) == len(want)
    assert all(g[1] == w[1] and abs(g[0] - w[0]) <= 1e-6 for g, w in zip(got, want))
    assert bool((A.view(-1, batch.G) <= 0)[~keep].sum() == 0), "paper default deletes positive-advantage rollouts only"


@pytest.mark.parametrize("source, forwards", [("policy", 1), ("sampler", 0)])
def test_sampler_logps_skip_the_old_policy_forward(tiny_model, tmp_path, source, forwards, monkeypatch):
    # (the entropy-before-selection metric needs a forward of its own with sampler log-probs: off here)
    tr = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, rollout_dropout="grpodropout",
               old_logps_source=source, log_entropy_before_selection=False)
    calls = []
    original = GRPOTrainer._get_per_token_logps_and_entropies  # TRL's forward: every log-prob pass runs it
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    tr.model.train()
    batch = next(iter(tr.get_train_dataloader()))
    tr._prepare_inputs(batch)  # generation + scoring + pipeline, no loss
    assert len(calls) == forwards
    assert tr._metrics["train"]["dropout/kept_ratio"], "the stage ran"


def test_authors_balance_neg_with_recomputed_advantages(tiny_model, tmp_path):
    """The released `balance_neg` variant as train.sh runs it (hexuandeng/GRPODropout@4ad3b3b: SELECT_METHOD
    balanced_push_zero_add_negpush_negadv, RECOMPUTE_ADV_AFTER_SELECT True, ADV_P_CENTER_MODE weighted_center): the
    trained advantages are, per group, verl's GRPO advantage recomputed over the kept rows, minus its softmax(log p)-
    weighted mean over them -- recomputed here with the plain-Python restatements of the released rules."""
    tr = build(WinnowGRPOTrainer, WinnowConfig, tiny_model, tmp_path, rollout_dropout="grpodropout",
               dropout_selector="balanced_push_neg", dropout_zero_push_groups="random_min_keep",
               dropout_restandardize=True, advantage_eps=1e-6)
    seen = spy_batches(tr)
    inputs, _, _ = one_step_loss_and_grads(tr)
    batch = seen[-1]
    A, _ = grpo_advantages(batch.R, batch.G, eps=1e-6)
    s = sequence_surprisal(batch.old_logps, batch.mask).double()
    want, dropped = [], 0
    for g in range(batch.P):
        rows = range(g * batch.G, (g + 1) * batch.G)
        kept = released_balance_neg([float(A[r]) for r in rows], [float(s[r]) for r in rows])
        assert kept is not None, "this batch has no all-zero group"
        dropped += batch.G - len(kept)
        a = released_grpo([float(batch.R[rows[k]]) for k in kept], eps=1e-6)
        w = [math.exp(-float(s[rows[k]])) for k in kept]
        baseline = sum(wi * ai for wi, ai in zip(w, a)) / sum(w)
        want += [(ai - baseline, rows[k]) for ai, k in zip(a, kept)]
    assert dropped > 0, "this batch must exercise a deletion"
    pad = tr.processing_class.pad_token_id
    ids_key = lambda ids: ids.masked_fill(ids == pad, 0).sum(1).tolist()  # noqa: E731  (padding-width free)
    trained = inputs["tool_mask"].bool().any(dim=1)
    got = sorted(zip(inputs["advantages"][trained].tolist(), ids_key(inputs["completion_ids"][trained])))
    keys = ids_key(batch.completion_ids)
    want = sorted((a, keys[r]) for a, r in want)
    assert len(got) == len(want)
    assert all(g[1] == w[1] and abs(g[0] - w[0]) <= 1e-5 * max(1.0, abs(w[0])) for g, w in zip(got, want))
    assert tr._metrics["train"]["dropout/restandardized"] == [1.0]


@pytest.mark.parametrize("overrides, field", [
    (dict(dropout_selector="paper", dropout_zero_push_groups="random_min_keep"), "dropout_zero_push_groups"),
    (dict(dropout_selector="balanced_push", dropout_zero_push_groups="some"), "dropout_zero_push_groups"),
    (dict(dropout_selector="balanced_push_neg", dropout_delete="both"), "dropout_delete"),
    (dict(dropout_restandardize=True, scale_rewards="batch"), "dropout_restandardize"),
    (dict(dropout_restandardize=True, multi_objective_aggregation="normalize_then_sum"), "dropout_restandardize"),
])
def test_authors_options_refuse_what_they_cannot_mean(tmp_path, overrides, field):
    """The released rules' options name the field and the fix when combined with something they do not apply to."""
    from trainer import ConfigError

    with pytest.raises(ConfigError) as err:
        WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "rollout_dropout": "grpodropout", **overrides})
    assert err.value.field_name == field and "Fix:" in str(err.value)
