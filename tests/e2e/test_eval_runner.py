"""The evaluation harness end to end (launch/eval.py): control systems prove the pipeline, a real local
model is evaluated with entropies, and an evaluation killed with SIGKILL resumes without regenerating what
was done and ends with the same results as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "launch" / "eval.py"


def write_config(tmp_path: Path, out: Path, systems: list[dict], benchmarks: dict, max_tokens: int = 12) -> Path:
    cfg = {"output_dir": str(out), "decoding": {"max_tokens": max_tokens, "temperature": 0.6, "top_p": 0.95,
                                               "top_k": 20, "seed": 0},
           "entropy": True, "dispersion_threshold": 1, "benchmarks": benchmarks, "systems": systems}
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_eval(config: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(EVAL), "--config", str(config)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_controls_and_a_model_through_the_whole_pipeline(tmp_path, tiny_model):
    out = tmp_path / "controls"
    systems = [{"name": "tiny", "model": "offline:tiny-qwen3"}, {"name": "gold", "backend": "oracle_gold"},
               {"name": "shuffled", "backend": "oracle_shuffled"}]
    config = write_config(tmp_path, out, systems, {"arithmetic": {"k": 2, "num_samples": 5},
                                                   "champ": {"k": 2, "num_samples": 12}})
    proc = run_eval(config)
    summary = json.loads((out / "summary.json").read_text())
    s = summary["systems"]
    assert s["gold"]["benchmarks"]["arithmetic"]["mean"] == 1.0
    # CHAMP golds that math-verify cannot parse (free text) score 0 even for the oracle
    assert s["gold"]["benchmarks"]["champ"]["mean"] >= 0.75
    assert s["shuffled"]["benchmarks"]["champ"]["mean"] <= 0.1
    tiny = s["tiny"]["benchmarks"]["arithmetic"]
    assert tiny["n_questions"] == 5 and tiny["samples_per_question"] == {"min": 2, "max": 2}
    assert tiny["entropy"] > 0 and tiny["mean_length"] <= 12
    records = read(out / "tiny" / "results.jsonl")
    assert len(records) == 2 * (5 + 12) and all(r["entropy_tokens"] == r["length"] for r in records)
    table = (out / "table.md").read_text()
    assert "| gold | **100.00**" in table and "Avg." in table and "shuffled" in proc.stdout
    assert (out / "benchmarks.png").stat().st_size > 0
    # W: distinct non-empty wrong answers; the shuffled oracle gives one wrong answer per question
    w = summary["dispersion_W"]["champ"]
    assert w["W_lt"]["shuffled"] == pytest.approx(1.0) or w["n_lt"] == 0


def test_killed_run_resumes_without_redoing_and_matches_an_uninterrupted_run(tmp_path, tiny_model):
    benchmarks = {"arithmetic": {"k": 2, "num_samples": 40}}
    systems = [{"name": "tiny", "model": "offline:tiny-qwen3"}]
    killed = write_config(tmp_path, tmp_path / "killed", systems, benchmarks, max_tokens=24)
    results = tmp_path / "killed" / "tiny" / "results.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(EVAL), "--config", str(killed)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and len(results.read_text().splitlines()) >= 6:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {(r["benchmark"], r["id"]) for r in read(results)}
    assert 3 <= len(done_before) < 40

    rerun = run_eval(killed)
    line = next(x for x in rerun.stderr.splitlines() if "questions done" in x)
    done, todo = (
        int(w) for w in line.split(": ")[-1].replace(" questions done,", "").replace(" to generate", "").split()
    )
    assert done >= len(done_before) - 1 and done + todo == 40  # at most the torn last question is redone

    full = write_config(tmp_path, tmp_path / "full", systems, benchmarks, max_tokens=24)
    run_eval(full)
    key = lambda r: (r["benchmark"], r["id"], r["sample"])  # noqa: E731
    a = sorted(read(results), key=key)
    b = sorted(read(tmp_path / "full" / "tiny" / "results.jsonl"), key=key)
    assert len(a) == len(b) == 80 and len({key(r) for r in a}) == 80
    assert [(key(r), r["completion"], r["correct"]) for r in a] == [(key(r), r["completion"], r["correct"]) for r in b]
    sa = json.loads((tmp_path / "killed" / "summary.json").read_text())["systems"]
    sb = json.loads((tmp_path / "full" / "summary.json").read_text())["systems"]
    assert sa["tiny"]["benchmarks"]["arithmetic"]["mean"] == sb["tiny"]["benchmarks"]["arithmetic"]["mean"]
    assert sa["tiny"]["benchmarks"]["arithmetic"]["entropy"] == pytest.approx(
        sb["tiny"]["benchmarks"]["arithmetic"]["entropy"]
    )


def test_results_of_another_configuration_are_not_mixed(tmp_path):
    systems = [{"name": "gold", "backend": "oracle_gold"}]
    out = tmp_path / "mixed"
    run_eval(write_config(tmp_path, out, systems, {"arithmetic": {"k": 1, "num_samples": 3}}))
    changed = write_config(tmp_path, out, systems, {"arithmetic": {"k": 2, "num_samples": 3}})
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(EVAL), "--config", str(changed)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "another configuration" in proc.stderr
