"""RAGEN's two collapse samples in one check (issue 20 item 5): with ``collapse_turns: all`` every check computes the
first-turn metrics and the trajectory-uniform multi-turn metrics on the same batch, each with its own EMA, as
mll-lab-nu/RAGEN@20daedc ragen/trainer/collapse_metrics.py:142-219 does (both enabled in config/base.yaml:151-152).

The oracle is upstream's ``_compute_metrics_for_pairs`` (collapse_metrics.py:239-324) ported below: every trajectory
draw is a column of its own (group ids = arange, :174), scored under every drawn context, MI over those columns
(duplicates included), retrieval by column signature (:292-300, :655-689), one EMA store per sample label
(:315-317, :336-342). The policy is replaced by a fixed synthetic scorer, so nothing here needs a model."""

from __future__ import annotations

import math
import random

import pytest
import torch

from trainer.methods.collapse.hook import BatchTraces, CollapseDetector, Trace


def synthetic_logp(context: tuple[int, ...], reasoning: tuple[int, ...]) -> float:
    """A fixed 'policy': summed log-prob of Z after X, a deterministic function of the two id tuples."""
    rng = random.Random(hash((context, reasoning)))
    return sum(rng.uniform(-3.0, -0.1) for _ in reasoning)


def detector(num_samples: int, max_tokens: int = 10**9) -> CollapseDetector:
    d = CollapseDetector.__new__(CollapseDetector)
    d.num_samples, d.max_tokens, d.seed, d._ema, d._warned_budget, d.all_turns = (
        num_samples,
        max_tokens,
        0,
        {},
        False,
        True,
    )

    def score(trainer, sampled, columns, pairs):
        sums = torch.tensor([synthetic_logp(columns[j], sampled[n].reasoning) for n, j in pairs], dtype=torch.float64)
        return sums, torch.tensor([float(len(sampled[n].reasoning)) for n, _ in pairs], dtype=torch.float64)

    d._score = score
    return d


def upstream_metrics(prompts, reasonings, group_ids, store, store_seq, key):
    """collapse_metrics.py:239-324 and :610-691 on the synthetic scorer (per-token and summed matrices)."""
    unique = sorted(set(group_ids))
    col = {g: j for j, g in enumerate(unique)}
    rep = {g: prompts[group_ids.index(g)] for g in unique}  # the group's first sample's prompt (:417-453)
    N = len(unique)
    L_sum = torch.tensor([[synthetic_logp(rep[g], z) for g in unique] for z in reasonings], dtype=torch.float64)
    L = L_sum / torch.tensor([len(z) for z in reasonings], dtype=torch.float64).unsqueeze(1)
    ids = torch.tensor([col[g] for g in group_ids])
    out = {}
    for suffix, M, st in (("", L, store), ("_seq", L_sum, store_seq)):
        matched = M[torch.arange(len(ids)), ids]
        marginal = torch.logsumexp(M, dim=1) - math.log(N)
        std = marginal.std(unbiased=False).item()
        st[key] = std if key not in st else 0.9 * st[key] + 0.1 * std
        out[f"mi_estimate{suffix}"] = (matched.mean() - marginal.mean()).item()
        out[f"mi_zscore{suffix}"] = ((matched - marginal) / (std + 1e-3)).mean().item()
        out[f"mi_zscore{suffix}_ema"] = ((matched - marginal) / (st[key] + 1e-3)).mean().item()
    sigs = {}
    col_sig = torch.tensor([sigs.setdefault(rep[g], len(sigs)) for g in unique])
    true_sig, pred_sig = col_sig[ids], col_sig[L.argmax(dim=1)]
    out["retrieval_accuracy"] = (pred_sig == true_sig).double().mean().item()
    counts = torch.bincount(col_sig)
    out["retrieval_chance_level"] = (counts[true_sig].double() / N).mean().item()
    top2 = col_sig[torch.topk(L, 2, dim=1).indices]
    out["retrieval_at_2"] = (top2 == true_sig.unsqueeze(1)).any(dim=1).double().mean().item()
    out["mi_upper_bound"] = math.log(N)
    return out


def batch() -> BatchTraces:
    """6 episodes in 3 groups (a group shares its level, hence its first-turn context); 1-3 model turns each,
    a turn's context = the level + the earlier turns; episode 5 produced no valid turn."""
    levels = [(1, 2, 3), (4, 5), (6, 7, 8, 9)]
    firsts, turns = [], []
    for m in range(6):
        level = levels[m // 2]
        context = level
        n_turns = 0 if m == 5 else 1 + (m * 7) % 3
        for t in range(n_turns):
            z = tuple(100 + 10 * m + t + k for k in range(1 + (m + t) % 3))
            if m % 2 == 0 and t == 0:
                z = (50 + m, 51)  # the first turn of both episodes of a group can repeat the same reply
            turns.append(Trace(context, z, m))
            context = context + z + (99,)
        firsts.append(next((t for t in turns if t.episode == m), None))
    return BatchTraces(firsts, [levels[m // 2] for m in range(6)], False, turns, 6)


def test_one_check_holds_both_samples_and_each_equals_upstream():
    d, b = detector(num_samples=12), batch()
    store, store_seq = {}, {}
    for step in (1, 6, 11):  # three checks: the EMAs must advance per sample, independently
        m = d.check(None, b, step)
        # first-turn sample: the rows our sampler drew, their groups' prompts as columns
        sampled = d._sample([t for t in b.traces if t is not None], list(dict.fromkeys(b.contexts)), step)
        groups = [{(1, 2, 3): 0, (4, 5): 1, (6, 7, 8, 9): 2}[t.context] for t in sampled]
        assert m["num_prompts"] == len(set(groups))
        first = upstream_metrics([t.context for t in sampled], [t.reasoning for t in sampled], groups,
                                 store, store_seq, "collapse_first_turn_sample")
        for key in ("mi_estimate", "mi_zscore", "mi_zscore_ema", "mi_estimate_seq", "mi_zscore_seq_ema"):
            assert m[key] == pytest.approx(first[key], rel=1e-9, abs=1e-12), key
        # trajectory sample: each draw its own column
        draws = d._trajectory_uniform([t for t in b.turns if t is not None], b.episodes, step)
        assert m["trajectory/num_samples"] == len(draws) >= 2
        traj = upstream_metrics([t.context for t in draws], [t.reasoning for t in draws], list(range(len(draws))),
                                store, store_seq, "collapse_trajectory_sample")
        for key, value in traj.items():
            assert m[f"trajectory/{key}"] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert m["trajectory/num_distinct_prompts"] < m["trajectory/num_prompts"]  # repeated contexts were drawn


def test_trajectory_draws_pick_any_episode_and_drop_those_without_a_valid_turn():
    """Upstream draws min(num_samples, #valid turns) episodes uniformly among all M and keeps a draw only when the
    episode has a valid turn (collapse_metrics.py:815-827): 1 of 4 episodes with 3 valid turns gives 3 x 1/4 draws
    per check on average (re-drawing among valid episodes would give 3)."""
    d = detector(num_samples=64)
    valid = [Trace((1,), (5,), 0), Trace((1, 5), (6,), 0), Trace((1, 5, 6), (7,), 0)]
    counts = [len(d._trajectory_uniform(valid, 4, step)) for step in range(400)]
    n = 400 * 3
    assert abs(sum(counts) - n / 4) < 4 * math.sqrt(n * 0.25 * 0.75)


def test_recipe_budget_holds_64_by_64_worst_case_sequences():
    """At the RAGEN multi-turn recipes' budget (64 x 64 x 3584) 64 draws of distinct, full-length contexts are all
    scored; at the old 262,144 only a handful were."""
    draws = [Trace(tuple(range(m, m + 3184)), tuple(range(400)), m) for m in range(64)]
    assert len(detector(64, 64 * 64 * 3584)._within_budget(draws)) == 64
    assert len(detector(64, 262_144)._within_budget(draws)) == 8
