"""UECR-GRPO App. F.4's alpha sweep (trainer/eval/alpha_sweep.py, launch/alpha_sweep.py): hand-computed ordering
metrics, grid transitions at the analytical thresholds, and a bootstrap that really resamples whole questions."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.algorithms.uecr import alpha_safety
from trainer.eval.alpha_sweep import Group, alpha_star_summary, clustered_bootstrap, refinement_grid, sweep

ROOT = Path(__file__).resolve().parents[2]


def G(R, S, question="q", checkpoint="c"):
    return Group(checkpoint, question, np.asarray(R, float), np.asarray(S, float))


def test_hand_computed_group():
    # correct 0; incorrect 1, 2. R^U = R + alpha S. Pair (0,1) inverts for alpha > 1/0.5 = 2, pair (0,2) for
    # alpha > 1/0.2 = 5 (teacher scores 0, 0.5, 0.2).
    g = G([1, 0, 0], [0.0, 0.5, 0.2])
    rows = {r["alpha"]: r for r in sweep([g], [0.0, 1.0, 3.0, 6.0])}
    assert [rows[a]["conflict_rate"] for a in (0.0, 1.0, 3.0, 6.0)] == [0.0, 0.0, 0.5, 1.0]
    assert [rows[a]["any_inversion_rate"] for a in (0.0, 1.0, 3.0, 6.0)] == [0.0, 0.0, 1.0, 1.0]
    assert rows[1.0]["pairs"] == 2 and rows[1.0]["mixed_groups"] == 1
    assert rows[1.0]["rule_of_three_groups"] == 3.0 and rows[1.0]["rule_of_three_pairs"] == 1.5
    # sign of A^U vs centred task reward (+2/3, -1/3, -1/3): at alpha 3, U = (1, 1.5, 0.6), mean 1.033 -> signs
    # (-, +, -): responses 0 and 1 flip
    assert rows[3.0]["sign_flip_rate"] == pytest.approx(2 / 3) and rows[0.0]["sign_flip_rate"] == 0.0
    assert alpha_star_summary([g])["min"] == pytest.approx(2.0)


def test_tied_groups_are_left_out_and_all_tied_is_an_error():
    rows = sweep([G([1, 0], [0.0, 1.0]), G([1, 1], [0.0, 5.0], question="tied")], [2.0])
    assert rows[0]["mixed_groups"] == 1 and rows[0]["conflict_rate"] == 1.0
    with pytest.raises(ValueError, match="no mixed group"):
        sweep([G([0, 0], [1.0, 2.0])], [1.0])


def test_grid_transitions_match_the_analytical_threshold():
    """A group inverts at alpha exactly when alpha > alpha*_g (alpha_safety, strict at the tie)."""
    rng = np.random.default_rng(0)
    alphas = np.round(np.linspace(0, 8, 161), 6).tolist()
    for n in range(40):
        R = rng.integers(0, 2, size=8).astype(float)
        R[0], R[1] = 1.0, 0.0  # mixed
        S = rng.normal(0, 0.4, size=8)
        star = alpha_safety(torch.as_tensor(R), torch.as_tensor(S))
        rows = sweep([G(R, S)], alphas)
        assert [r["any_inversion_rate"] > 0 for r in rows] == [a > star for a in alphas], n


def test_bootstrap_resamples_whole_questions():
    """Each question has three checkpoint groups that all invert or none do: resampling questions (not groups)
    makes every replicate's any-inversion rate a multiple of 1/Q -- and the interval brackets the estimate."""
    groups = []
    for q in range(5):
        inverts = q < 2
        for c in range(3):
            groups.append(G([1, 0], [0.0, 1.0 if inverts else -1.0], question=f"q{q}", checkpoint=f"c{c}"))
    point = sweep(groups, [2.0])[0]["any_inversion_rate"]
    assert point == pytest.approx(0.4)
    ci = clustered_bootstrap(groups, [2.0], replicates=400, seed=42)[0]["any_inversion_rate_ci"]
    assert ci[0] <= point <= ci[1] and ci[0] < ci[1]
    assert all(abs(v * 5 - round(v * 5)) < 1e-9 for v in ci)  # percentiles of multiples of 1/5 (no interpolation)
    assert clustered_bootstrap(groups, [2.0], replicates=400, seed=42) == clustered_bootstrap(
        groups, [2.0], replicates=400, seed=42
    )
    assert clustered_bootstrap(groups, [0.5], replicates=200)[0]["conflict_rate_ci"] == [0.0, 0.0]  # zero events


def test_refinement_grid_sits_below_the_first_10_percent_alpha():
    groups = [G([1, 0], [0.0, 1.0 / (k + 1)], question=f"q{k}") for k in range(10)]  # alpha*_k = k + 1
    grid = refinement_grid(groups, [0.0, 0.5, 1.0, 1.5, 2.0, 3.0])
    assert len(grid) == 10 and 1.0 < min(grid) and max(grid) < 1.5  # 1/10 groups invert first at alpha 1.5


def test_cli_on_eval_results_with_teacher_scores(tmp_path, capsys):
    """launch/eval.py's results.jsonl schema + teacher_score, end to end."""
    lines = []
    for ckpt in ("step-30", "step-60"):
        for q, scores in enumerate([[0.1, -0.2, 0.0, -0.4], [0.0, 0.3, -0.1, 0.1]]):
            for i, s in enumerate(scores):
                lines.append({"system": ckpt, "benchmark": "amc23", "id": str(q), "sample": i,
                              "correct": float(i % 2 == 0), "teacher_score": s})
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    sys.path.insert(0, str(ROOT / "launch"))
    from alpha_sweep import main

    report = main(["--results", str(path), "--replicates", "50", "--alphas", "0", "1", "2", "4"])
    assert json.loads((tmp_path / "alpha_sweep.json").read_text()) == json.loads(json.dumps(report))
    assert report["questions"] == 2 and report["checkpoints"] == ["step-30", "step-60"]
    at = {r["alpha"]: r for r in report["sweep"]}
    assert at[0.0]["conflict_rate"] == 0.0 and at[0.0]["sign_flip_rate"] == 0.0  # alpha 0 = the verifier's order
    assert math.isfinite(report["alpha_star"]["min"]) and "alpha*" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"system": "s", "id": "1", "correct": 1.0}) + "\n")
    with pytest.raises(ValueError, match="teacher_score"):
        main(["--results", str(bad)])
