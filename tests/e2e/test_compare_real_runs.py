"""winnow-compare with the real trainer and the real evaluation harness (tests/compare/ drive the runner with a
stand-in trainer): a run started before the comparison is resumed from its checkpoint, not restarted; every final
model is evaluated; the report reads the runs' own metrics.jsonl and eval/summary.json, checks the pairing from the
trainer's prompt digest, and a second call runs nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness import TRAIN_CLI_RECIPE

from trainer.cli import compare
from trainer.compare import plan

pytestmark = pytest.mark.slow

ARMS = ["grpo", "grpodropout:rollout_dropout=grpodropout"]


def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in plan.read_records(run_dir) if "reward" in r]


def test_a_real_comparison_resumes_evaluates_and_reports(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({**TRAIN_CLI_RECIPE, "max_steps": 2, "save_steps": 1,
                                    "output_dir": str(tmp_path / "unused")}))
    eval_config = tmp_path / "eval.yaml"
    eval_config.write_text(yaml.safe_dump({
        "output_dir": str(tmp_path / "unused-eval"), "systems": [],
        "decoding": {"max_tokens": 8, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "seed": 0},
        "benchmarks": {"arithmetic": {"k": 2, "num_samples": 4}}}))
    out = tmp_path / "cmp"
    argv = ["--config", str(base), "--arm", ARMS[0], "--arm", ARMS[1], "--seeds", "0", "--output_dir", str(out),
            "--eval_config", str(eval_config)]

    # A comparison stopped during its second run, after that run's first step and checkpoint: trained here for one
    # step, then its end-of-training record taken out of metrics.jsonl -- what a kill after checkpoint-1 leaves.
    runs = plan.plan(str(base), [plan.parse_arm(a) for a in ARMS], [0], str(out), [])
    started = runs[1]
    subprocess.run([sys.executable, "-m", "trainer.cli.train", *started.train_args(resume=False), "--max_steps", "1"],
                   check=True, capture_output=True, timeout=600)
    metrics = started.output_dir / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if "train_runtime" not in line]
    metrics.write_text("".join(line + "\n" for line in kept))
    assert plan.state(started, with_eval=True) == "partial" and _steps(started.output_dir) == [1]
    assert (started.output_dir / "checkpoint-1").is_dir()

    assert compare.main(argv) == 0
    for run in runs:
        assert plan.state(run, with_eval=True) == "finished", run.label
        assert _steps(run.output_dir) == [1, 2], run.label  # the started run went on from step 1, not from 0
    log = (started.output_dir / "train.log").read_text()
    assert "--resume_from_checkpoint auto" in log
    state = json.loads((started.output_dir / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert "--resume_from_checkpoint" not in (runs[0].output_dir / "train.log").read_text()

    report = (out / "report.md").read_text()
    assert "2 of 2 runs finished" in report and "held for every seed" in report
    assert "eval arithmetic/mean@2" in report  # winnow-eval's Mean@k of each final model reached the report
    summary = json.loads((started.output_dir / "eval" / "summary.json").read_text())
    assert summary["systems"]["grpodropout"]["benchmarks"]["arithmetic"]["n_questions"] == 4

    before = {p: p.stat().st_mtime_ns for p in out.rglob("metrics.jsonl")}
    assert compare.main(argv) == 0  # everything finished: nothing runs again, the report is rewritten
    assert {p: p.stat().st_mtime_ns for p in out.rglob("metrics.jsonl")} == before
