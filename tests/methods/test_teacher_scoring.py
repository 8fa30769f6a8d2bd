"""UECR-GRPO App. F.4's teacher-scoring pass (trainer/eval/teacher_scoring.py, launch/score_teacher.py) end to
end on two tiny Qwen3s: a real evaluation run's responses are scored, and every score equals the teacher-minus-
checkpoint mean token log-ratio at T = 1 computed here directly with transformers (full forward, float64
log-softmax), on a prompt written by hand in Qwen3's chat format."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from trainer.eval.benchmarks import load_benchmark
from trainer.eval.runner import EvalConfig, evaluate_system
from trainer.tools.assets import make_tiny_qwen3

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launch"))


def direct_score(teacher, checkpoint, prompt_ids: list[int], completion: list[int]) -> float:
    """(1/L) sum_t [log pi_T(y_t) - log pi_ckpt(y_t)] at T = 1, straight from the models' logits."""
    ids = torch.tensor([prompt_ids + completion])
    P = len(prompt_ids)
    gaps = 0.0
    for sign, model in ((1.0, teacher), (-1.0, checkpoint)):
        with torch.no_grad():
            logp = model(input_ids=ids).logits[0, P - 1 : -1].double().log_softmax(-1)
        gaps = gaps + sign * logp.gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
    return float(gaps.mean())


@pytest.fixture(scope="module")
def scored_eval(tmp_path_factory, tiny_model):
    """A real launch/eval.py-style run of the tiny model (k 3 on two arithmetic questions, sampled at T 0.6),
    its task labels replaced by hand (a random model solves nothing) so the sweep has mixed groups."""
    out = tmp_path_factory.mktemp("alpha") / "eval"
    cfg = EvalConfig.from_dict(
        {
            "output_dir": str(out),
            "systems": [{"name": "step-0", "model": "offline:tiny-qwen3"}],
            "benchmarks": {"arithmetic": {"k": 3, "num_samples": 2}},
            "entropy": False,
            "token_ids": True,
            "decoding": {"max_tokens": 10, "temperature": 0.6, "top_p": 1.0, "top_k": 0, "seed": 0},
        }
    )
    evaluate_system(cfg, cfg.systems[0], {"arithmetic": load_benchmark("arithmetic", num_samples=2, seed=0)})
    results = out / "step-0" / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    results.write_text("".join(json.dumps({**r, "correct": float(r["sample"] == 0)}) + "\n" for r in rows))
    return out, str(make_tiny_qwen3(seed=1, initializer_range=0.5))  # sharper logits: a gap well above rounding


def load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def check_against_direct(records, teacher_path, tiny_model, cap):
    teacher, _ = load(teacher_path)
    checkpoint, tok = load(tiny_model)
    questions = {it.id: it.question for it in load_benchmark("arithmetic", num_samples=2, seed=0)}
    assert len(records) == 6
    for r in records:
        text = (f"<|im_start|>user\n{questions[r['id']]}\n\nPlease reason step by step, and put your final answer "
                "within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
        completion = r["completion_ids"][:cap]
        expected = direct_score(teacher, checkpoint, tok.encode(text, add_special_tokens=False), completion)
        assert r["teacher_tokens"] == len(completion) > 0
        assert abs(expected) > 1e-2  # two different random models: a real gap, not 0 = 0
        assert r["teacher_score"] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_alpha_sweep_from_an_eval_folder_scores_with_the_teacher(scored_eval, tiny_model, capsys):
    from alpha_sweep import main as sweep

    out, teacher_path = scored_eval
    report = sweep(
        ["--eval_dir", str(out), "--teacher", teacher_path, "--replicates", "20", "--alphas", "0", "1", "50"]
    )
    records = [json.loads(line) for line in (out / "teacher_scored.jsonl").read_text().splitlines()]
    check_against_direct(records, teacher_path, tiny_model, cap=8192)
    assert report["questions"] == 2 and report["checkpoints"] == ["step-0"]
    at = {r["alpha"]: r for r in report["sweep"]}
    assert at[0.0]["conflict_rate"] == 0.0 and at[0.0]["mixed_groups"] == 2
    # hand check at alpha 50: per question, the fraction of (correct 0, incorrect j) pairs with S_j > S_0 + 1/50
    by_q: dict[str, dict[int, float]] = {}
    for r in records:
        by_q.setdefault(r["id"], {})[r["sample"]] = r["teacher_score"]
    expected = sum(sum(s[j] * 50 > 1 + 50 * s[0] for j in (1, 2)) / 2 for s in by_q.values()) / 2
    assert at[50.0]["conflict_rate"] == pytest.approx(expected)


def test_token_cap_and_rerun(scored_eval, tiny_model):
    from score_teacher import main as score

    out, teacher_path = scored_eval
    path = score(
        ["--eval_dir", str(out), "--teacher", teacher_path, "--max_tokens", "4", "--out", str(out / "cap4.jsonl")]
    )
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(r["teacher_max_tokens"] == 4 for r in records) and max(r["teacher_tokens"] for r in records) == 4
    check_against_direct(records, teacher_path, tiny_model, cap=4)
    # a token budget per forward (length-sorted, trimmed chunks) scores the same
    path = score(["--eval_dir", str(out), "--teacher", teacher_path, "--max_tokens", "6", "--micro_batch_tokens",
                  "40", "--out", str(out / "budget.jsonl")])
    check_against_direct([json.loads(line) for line in path.read_text().splitlines()], teacher_path, tiny_model, cap=6)
    with pytest.raises(SystemExit):  # a system folder that does not exist is one argparse line
        score(["--eval_dir", str(out), "--teacher", teacher_path, "--systems", "step-9"])
