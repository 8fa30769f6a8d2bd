"""Where stages meet TRL's batch (pure pipeline, no model): removal first, then statistics over what is kept;
rollouts without a loss token weigh nothing in any stage's group statistic; a stage's telemetry covers the groups
it acted on. Every expected value is computed here by hand (python floats, ``statistics``), not by the code under
test."""

from __future__ import annotations

import itertools
import math
import statistics
from types import SimpleNamespace

import pytest
import torch

from trainer import RolloutBatch, WinnowConfig
from trainer.pipeline.stages import run_pipeline

G = 4
EPS = 1e-4  # TRL's advantage epsilon


def args_for(**overrides):
    base = vars(WinnowConfig(output_dir="/tmp/seams", use_cpu=True, bf16=False, report_to="none", num_generations=G,
                             per_device_train_batch_size=16))
    return SimpleNamespace(**{**base, **overrides})


def batch_of(rewards, masks=None, T=3, keep=None, **fields):
    """A RolloutBatch from per-row rewards (list of floats, or of K-tuples) and optional per-row token masks."""
    R_k = torch.tensor(rewards, dtype=torch.float32)
    R_k = R_k.unsqueeze(1) if R_k.dim() == 1 else R_k
    N = R_k.shape[0]
    mask = torch.ones(N, T) if masks is None else torch.tensor(masks, dtype=torch.float32)
    return RolloutBatch(R_k=R_k, reward_weights=torch.ones(R_k.shape[1]),
                        reward_names=[f"r{k}" for k in range(R_k.shape[1])], G=G,
                        completion_ids=torch.arange(N * mask.shape[1]).view(N, -1) % 50 + 100, mask=mask,
                        keep=None if keep is None else torch.tensor(keep), **fields)


def close(got: float, want: float, rel: float = 1e-5) -> bool:
    return abs(got - want) <= rel * max(abs(want), 1e-3)


# --- defect 5: batch-level statistics over the kept groups only ------------------------------------------------

REWARDS = [0.0, 1.0, 0.0, 1.0,  # group 0: variance 0.25 (kept by top-2 variance)
           0.2, 0.3, 0.2, 0.3,  # group 1: variance 0.0025
           0.0, 0.0, 1.0, 0.9,  # group 2: variance 0.2025 (kept)
           0.6, 0.6, 0.7, 0.6]  # group 3: variance 0.001875
KEPT_GROUPS = (0, 2)


def test_scale_rewards_batch_uses_the_std_of_kept_rows_only():
    out = run_pipeline(batch_of(REWARDS), args_for(rollout_filter="snr", snr_strategy="top_k_abs", snr_value=2,
                                                   scale_rewards="batch"))
    kept = [r for g in KEPT_GROUPS for r in REWARDS[g * G:(g + 1) * G]]
    sigma = statistics.stdev(kept)  # TRL's batch std (unbiased) -- over the batch that is trained
    for g in range(4):
        rows = REWARDS[g * G:(g + 1) * G]
        for i, r in enumerate(rows):
            got = float(out.advantages[g * G + i])
            want = (r - statistics.mean(rows)) / (sigma + EPS) if g in KEPT_GROUPS else 0.0
            assert close(got, want), (g, i, got, want)


def test_normalize_then_sum_normalises_over_kept_rows_only():
    R2 = [(r, (i * 7 % 5) / 4) for i, r in enumerate(REWARDS)]  # a second reward function, varying in every group
    out = run_pipeline(batch_of(R2), args_for(rollout_filter="snr", snr_strategy="top_k_abs", snr_value=2,
                                              multi_objective_aggregation="normalize_then_sum"))
    S = {}
    for g in KEPT_GROUPS:
        cols = list(zip(*R2[g * G:(g + 1) * G]))
        z = [[(x - statistics.mean(c)) / (statistics.stdev(c) + EPS) for x in c] for c in cols]
        for i in range(G):
            S[g * G + i] = z[0][i] + z[1][i]
    mu, sd = statistics.mean(S.values()), statistics.stdev(S.values())
    for n in range(len(R2)):
        want = (S[n] - mu) / (sd + EPS) if n in S else 0.0
        assert close(float(out.advantages[n]), want), (n, float(out.advantages[n]), want)


def test_filter_never_ranks_dynamic_sampling_top_ups():
    # groups 2 and 3 are dynamic sampling's top-ups (initial keep False); group 2 has the largest variance of all
    rewards = [0.0, 1.0, 0.0, 0.8] + REWARDS[4:8] + [0.0, 0.0, 1.0, 1.0] + REWARDS[12:]
    keep = [True] * 8 + [False] * 8
    out = run_pipeline(
        batch_of(rewards, keep=keep), args_for(rollout_filter="snr", snr_strategy="top_k_abs", snr_value=1)
    )
    # group 2 (variance 0.25) is not a real group; the best real one is group 0 (0.2075 > 0.0025): it trains alone
    assert out.keep.tolist() == [True] * 4 + [False] * 12
    assert out.metrics["snr/kept_groups"] == 1.0 and out.metrics["snr/score_max"] == pytest.approx(0.2075)


# --- defect 1: rollouts with no loss token ----------------------------------------------------------------------

def _grpo_group(rows):
    mu, sd = statistics.mean(rows), statistics.stdev(rows)
    return [(r - mu) / (sd + EPS) for r in rows]


def _hand_grpodropout(A, s, valid):
    """Paper eqs. (2)-(9) over the valid rollouts, by brute force over subsets: the largest retained set with
    sum h >= 0 (ties: largest sum), positive-advantage rollouts only stay deleted, probability-weighted baseline."""
    idx = [i for i in range(G) if valid[i]]
    if not idx:  # nothing trainable: nothing to select, no baseline
        return [True] * G, list(A)
    s_bar = statistics.mean(s[i] for i in idx)
    h = {i: A[i] * (s[i] - s_bar) / G for i in idx}
    best = max((kept for k in range(len(idx) + 1) for kept in itertools.combinations(idx, k)  # the paper's set I
                if sum(h[i] for i in kept) >= 0),
               key=lambda kept: (len(kept), sum(h[i] for i in kept)))
    keep = [(not valid[i]) or i in best or A[i] <= 0 for i in range(G)]
    w = {i: math.exp(-s[i]) for i in idx if keep[i]}
    b = sum(w[i] * A[i] for i in w) / sum(w.values()) if w else 0.0
    return keep, [A[i] - b if keep[i] else 0.0 for i in range(G)]


def test_grpodropout_ignores_rollouts_without_loss_tokens():
    # group 0: row 3 was truncated and masked (mask_truncated_completions) -- its reward still counts in TRL's A
    # group 1: every row masked -- a group with nothing to train, named in the metrics
    rewards = [1.0, 0.0, 0.6, 1.0, 0.3, 0.8, 0.1, 0.5]
    masks = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]] + [[0, 0, 0]] * 4
    logps = torch.tensor(
        [[-0.1, -0.2, -0.3], [-2.0, -1.0, 0.0], [-0.9, -1.1, -1.0], [-5.0, -5.0, -5.0]] + [[-1.0] * 3] * 4
    )
    batch = batch_of(rewards, masks, old_logps=logps)
    out = run_pipeline(batch, args_for(rollout_dropout="grpodropout"))
    for g in range(2):
        A = _grpo_group(rewards[g * G:(g + 1) * G])
        valid = [any(m) for m in masks[g * G:(g + 1) * G]]
        s = [-sum(lp for lp, m in zip(row, mk) if m) / max(sum(mk), 1)
             for row, mk in zip(logps[g * G:(g + 1) * G].tolist(), masks[g * G:(g + 1) * G])]
        keep, want = _hand_grpodropout(A, s, valid)
        assert out.keep[g * G:(g + 1) * G].tolist() == keep
        for i in range(G):
            assert close(float(out.advantages[g * G + i]), want[i]), (g, i, float(out.advantages[g * G + i]), want[i])
    assert out.keep[:4].tolist() == [False, True, True, True], "this batch must exercise a deletion"
    assert out.metrics["dropout/untrainable_groups"] == 1.0
    assert out.metrics["stages/untrainable_groups"] == 1.0 and out.metrics["stages/untrainable_rollouts"] == 5.0
    assert out.metrics["dropout/kept_ratio"] == pytest.approx(2 / 3)  # of the 3 rollouts that can train


@pytest.mark.parametrize("metric", ["length", "entropy"])
def test_snr_scores_ignore_rollouts_without_loss_tokens(metric):
    # group 0: two trained rows of length 3 / entropy 1.0, two masked rows; group 1: four rows of length 2 /
    # entropy 0.8
    masks = [[1, 1, 1]] * 2 + [[0, 0, 0]] * 2 + [[1, 1, 0]] * 4
    ent = torch.tensor([[1.0] * 3] * 4 + [[0.8] * 3] * 4)
    batch = batch_of([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0], masks, entropies=ent)
    out = run_pipeline(batch, args_for(rollout_filter="snr", snr_metric=metric, snr_strategy="top_k_abs", snr_value=1))
    # group 0 scores 3 (length) / 1.0 (entropy) over its trained rows; it beats group 1 (2 / 0.8)
    assert out.keep.tolist() == [True] * 4 + [False] * 4
    assert out.metrics["snr/score_max"] == pytest.approx(3.0 if metric == "length" else 1.0)


def test_snr_does_not_rank_groups_without_loss_tokens():
    masks = [[0, 0, 0]] * 4 + [[1, 1, 1]] * 4
    batch = batch_of([0.0, 1.0, 0.0, 1.0, 0.4, 0.5, 0.4, 0.5], masks)
    out = run_pipeline(batch, args_for(rollout_filter="snr", snr_strategy="top_k_abs", snr_value=1))
    assert out.keep.tolist() == [False] * 4 + [True] * 4  # the higher-variance group 0 cannot train
    assert out.metrics["snr/untrainable_groups"] == 1.0


def _teacher_batch(rewards, masks, keep=None):
    N = len(rewards)
    g = torch.Generator().manual_seed(3)
    teacher = -torch.rand(N, 3, generator=g) * 2
    old = -torch.rand(N, 3, generator=g) * 2
    extras = {"teacher_logps": teacher, "old_logps_t1": old, "teacher_entropy": torch.rand(N, 3, generator=g)}
    return batch_of(rewards, masks, keep=keep, extras=extras), teacher, old


def _hand_R_T(teacher, old, masks):
    """Token-mean teacher gap of each row with a loss token; None for a row without one."""
    return [statistics.mean(t - o for t, o, m in zip(tr, orow, mk) if m) if any(mk) else None
            for tr, orow, mk in zip(teacher.tolist(), old.tolist(), masks)]


def test_uecr_teacher_statistics_ignore_rollouts_without_loss_tokens():
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    masks = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]] + [[1, 1, 1]] * 4
    batch, teacher, old = _teacher_batch(rewards, masks)
    out = run_pipeline(batch, args_for(advantage="puu", teacher_model_name_or_path="t"))
    R_T = _hand_R_T(teacher, old, masks)
    for g in range(2):
        rt = R_T[g * G:(g + 1) * G]
        known = [x for x in rt if x is not None]
        rt = [statistics.mean(known) if x is None else x for x in rt]  # no evidence: the group's mean, no weight
        U = [r + 1.0 * t for r, t in zip(rewards[g * G:(g + 1) * G], rt)]
        mu, sd = statistics.mean(U), statistics.pstdev(U)
        for i in range(G):
            assert close(float(out.advantages[g * G + i]), (U[i] - mu) / (sd + 1e-6))
    scored = [x for x in R_T if x is not None]
    assert close(out.metrics["uecr/teacher_reward_mean"], statistics.mean(scored))
    assert out.metrics["uecr/empty_completions"] == 1.0


# --- defect 6: a stage's telemetry covers the groups it acted on ------------------------------------------------

def test_dropout_metrics_exclude_groups_the_filter_removed():
    logps = -torch.rand(16, 3, generator=torch.Generator().manual_seed(0)) * 3
    out = run_pipeline(
        batch_of(REWARDS, old_logps=logps),
        args_for(rollout_filter="snr", snr_strategy="top_k_abs", snr_value=1, rollout_dropout="grpodropout"),
    )
    assert out.metrics["dropout/nonzero_groups"] == 1.0  # only group 0 was trained; 4 groups have non-zero advantages
    assert out.metrics["dropout/kept_ratio"] == pytest.approx(float(out.keep[:4].sum()) / 4)


def test_uecr_metrics_exclude_groups_the_filter_removed():
    masks = [[1, 1, 1]] * 16
    batch, teacher, old = _teacher_batch(REWARDS, masks)
    out = run_pipeline(batch, args_for(rollout_filter="snr", snr_strategy="top_k_abs", snr_value=1, advantage="puu",
                                       teacher_model_name_or_path="t"))
    assert out.keep.tolist() == [True] * 4 + [False] * 12
    assert close(out.metrics["uecr/teacher_reward_mean"], statistics.mean(_hand_R_T(teacher, old, masks)[:4]))
