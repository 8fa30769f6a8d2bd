"""The preflight (``launch/train.py --dry-run``, trainer/tools/preflight.py) and its memory estimate.

The estimate's parameter counts are anchored to the model cards' published totals; its model-state terms to the
hand formula (bf16 weights + fp32 gradient accumulation + fp32 master and Adam moments = 18 B/param, divided over the
ZeRO-3 ranks); the report's checks to launches that must fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.tools import memory_estimate as mem
from trainer.tools import preflight

REPO = Path(__file__).resolve().parents[2]
GRPO_8B = "configs/grpo/qwen3-8b-dapo17k.yaml"


@pytest.mark.parametrize("model, total, non_embedding", [
    ("Qwen/Qwen3-8B", 8.2e9, 6.95e9), ("Qwen/Qwen3-4B", 4.0e9, 3.6e9), ("Qwen/Qwen3-1.7B", 1.7e9, 1.4e9),
    ("Qwen/Qwen2.5-3B", 3.09e9, 2.77e9), ("Qwen/Qwen2.5-7B", 7.61e9, 6.53e9), ("Qwen/Qwen2.5-0.5B", 0.49e9, 0.36e9),
])
def test_parameter_counts_match_the_model_cards(model, total, non_embedding):
    """Totals and non-embedding counts as the Qwen model cards state them (rounded there to 2-3 digits)."""
    shape = mem.shape_from_config(preflight.KNOWN_CONFIGS[model])
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    assert shape.params == pytest.approx(total, rel=0.03)
    assert shape.params - embeddings == pytest.approx(non_embedding, rel=0.03)


def test_model_states_follow_the_zero_formulas():
    shape = mem.shape_from_config(preflight.KNOWN_CONFIGS["Qwen/Qwen3-8B"])
    P = shape.params
    assert sum(mem.model_states(shape, mem.Launch(world=4, zero_stage=3)).values()) == pytest.approx(18 * P / 4)
    assert sum(
        mem.model_states(shape, mem.Launch(world=4, zero_stage=3, fp32_grad_accum=False)).values()
    ) == pytest.approx(16 * P / 4)
    assert sum(mem.model_states(shape, mem.Launch(world=8, zero_stage=2)).values()) == pytest.approx(
        2 * P + 16 * P / 8
    )
    assert sum(mem.model_states(shape, mem.Launch(world=8, zero_stage=0)).values()) == pytest.approx(16 * P)


def test_grpo_8b_estimate_names_the_backward_as_peak():
    """GRPO-8B on 4 ZeRO-3 ranks, 4 rows x 10,240 positions: model states 36.9 GB (18 B x 8.19 B / 4), checkpointed
    inputs 36 x 4 x 10240 x 4096 x 2 B = 12.1 GB; the backward is the peak and fits an 80 GB card."""
    shape = mem.shape_from_config(preflight.KNOWN_CONFIGS["Qwen/Qwen3-8B"])
    est = mem.estimate(shape, mem.Launch(world=4, zero_stage=3), rows=4, length=10240, reference=False)
    assert est["phases"]["policy backward"]["checkpointed layer inputs"] == 36 * 4 * 10240 * 4096 * 2
    assert est["peak_phase"] == "policy backward" and 55e9 < est["peak"] < 76e9


def test_token_budget_bounds_the_backward_by_tokens():
    """With micro_batch_tokens the backward holds max(budget, length) tokens whatever per_device_train_batch_size
    says: 32 rows under a 20,480-token budget cost what 2 rows of 10,240 do (36 x 20480 x 4096 x 2 B of checkpointed
    inputs); a budget below one row's length costs one row; the teacher's scoring likewise."""
    shape = mem.shape_from_config(preflight.KNOWN_CONFIGS["Qwen/Qwen3-8B"])
    launch = mem.Launch(world=4, zero_stage=3)
    est = lambda **kw: mem.estimate(shape, launch, length=10240, reference=False, teacher=shape, **kw)  # noqa: E731
    budget = est(rows=32, teacher_rows=16, micro_batch_tokens=20480)
    two = est(rows=2, teacher_rows=2)
    assert budget["phases"]["policy backward"]["checkpointed layer inputs"] == 36 * 20480 * 4096 * 2
    assert budget["phases"] == two["phases"] and budget["peak"] == two["peak"]
    assert est(rows=32, micro_batch_tokens=4096)["phases"] == est(rows=1, teacher_rows=1)["phases"]
    assert est(rows=32)["peak"] > 2 * budget["peak"]  # what the rows alone would have claimed


def report(*argv: str) -> preflight.Report:
    return preflight.run(["--config", *argv])


def lines(rep: preflight.Report, topic: str) -> list[tuple[str, str]]:
    return [(status, text) for status, t, text in rep.lines if t == topic]


def test_preflight_reports_every_topic(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    rep = report(GRPO_8B, "--weight_sync", "disk")
    topics = {t for _, t, _ in rep.lines}
    assert {"world size", "batch geometry", "weight sync", "server command", "packages", "cuda", "context",
            "heads % TP", "W&B", "disk", "memory peak"} <= topics
    assert lines(rep, "world size")[0][0] == "ok" and "4 processes" in lines(rep, "world size")[0][1]
    assert "--max-model-len 10240" in lines(rep, "server command")[0][1]
    assert "policy backward" in lines(rep, "memory peak")[0][1]


def test_preflight_fails_wrong_world_size_tp_and_wandb(monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent/netrc")
    rep = report("configs/ragen/variants/qwen2.5-7b-countdown-grpo-topp0.9.yaml", "--num_processes", "16",
                 "--tensor_parallel_size", "8")
    assert rep.failed
    assert lines(rep, "world size")[0][0] == "FAIL"
    verdict, text = lines(rep, "heads % TP")[0]
    assert verdict == "FAIL" and "use --tensor-parallel-size 4" in text and "data-parallel" not in text
    assert lines(rep, "W&B")[0][0] == "FAIL" and "WANDB_MODE=offline" in lines(rep, "W&B")[0][1]


def test_train_dry_run_loads_nothing_and_exits_with_the_verdict(tmp_path):
    """The hook in launch/train.py: a bad launch exits 1 with FAIL lines, and no output folder is created."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(REPO / "launch" / "train.py"), "--config", GRPO_8B, "--dry-run",
                          "--num_processes", "3", "--output_dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "FAIL world size" in out.stdout and "memory peak" in out.stdout
    assert not (tmp_path / "run").exists()
