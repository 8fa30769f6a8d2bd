"""The preflight (``launch/train.py --dry-run``, trainer/tools/preflight.py) and its memory estimate.

The estimate's parameter counts are anchored to the model cards' published totals; its model-state terms to the
hand formula (bf16 weights + fp32 gradient accumulation + fp32 master and Adam moments = 18 B/param, divided over the
ZeRO-3 ranks); the report's checks to launches that must fail.
"""

from __future__ import annotations

import os
import re
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
    inputs 36 x 4 x 10240 x 4096 x 2 B = 12.1 GB; the backward is the peak, in the 72-77 GB a hand count of a first
    run gives (issue 32), and it is tight on an 80 GB card: within 10 % of the 76 GB usable."""
    shape = mem.shape_from_config(preflight.KNOWN_CONFIGS["Qwen/Qwen3-8B"])
    est = mem.estimate(shape, mem.Launch(world=4, zero_stage=3), rows=4, length=10240, reference=False)
    assert est["phases"]["policy backward"]["checkpointed layer inputs"] == 36 * 4 * 10240 * 4096 * 2
    assert est["peak_phase"] == "policy backward" and 72e9 < est["peak"] < 77e9
    tight = mem.tight_phases(est, 80e9)
    assert [t["phase"] for t in tight] == ["policy backward"]
    assert tight[0]["spare"] == pytest.approx(0.95 * 80e9 - est["peak"]) and 0 < tight[0]["spare"] < 7.6e9
    assert mem.tightness_lines(est, 80e9)[0].startswith("tight: policy backward 72.8 GB of 76.0 GB usable")
    assert mem.tight_phases(est, 160e9) == [] and mem.tightness_lines(est, 160e9) == []


def test_backward_terms_a_first_run_showed_missing():
    """The four terms the 64.6 GB estimate lacked, each against a hand count for Qwen3-8B (hidden 4096, 32 heads / 8
    KV heads of 128, vocabulary 151,936) at 4 rows x 10,240 positions: float32 RMSNorm inputs of the recomputed
    layer's four norms and the final norm (3 x 4096 + 40 x 128 = 17,408 values per position, 4 B: 2.85 GB), key and
    value repeated to 32 heads (2 x 4096 values, 2 B: 0.67 GB), SDPA's bf16 copy of the boolean mask (4 x 10240^2 x 2
    B: 0.84 GB), TRL's float32 grad_weight with its bf16 cast (151936 x 4096 x 6 B: 3.73 GB); and ZeRO-3's reduce
    bucket with two in flight under overlap_comm (4096^2 x 8 B). Flash-attention drops the attention terms."""
    shape = mem.shape_from_config(preflight.KNOWN_CONFIGS["Qwen/Qwen3-8B"])
    positions = 4 * 10240
    terms = mem.estimate(shape, mem.Launch(world=4, zero_stage=3), rows=4, length=10240,
                         reference=False)["phases"]["policy backward"]
    assert terms["fp32 RMSNorm inputs (recomputed layer + final norm)"] == positions * 17408 * 4
    assert terms["repeat_kv key/value copies"] == positions * 2 * 4096 * 2
    assert terms["SDPA float mask copy (bf16)"] == 4 * 10240**2 * 2
    assert terms["fused LM head grad_weight (fp32 + bf16 cast)"] == 151936 * 4096 * 6
    assert terms["ZeRO-3 reduce bucket + grads in flight (overlap_comm)"] == 4096**2 * 8
    assert mem.reduce_buckets(shape, mem.Launch(world=4, zero_stage=3, overlap_comm=False)) == 4096**2 * 4
    flash = mem.estimate(shape, mem.Launch(world=4, zero_stage=3, flash_attention=True), rows=4, length=10240,
                         reference=False)["phases"]["policy backward"]
    assert not {"SDPA float mask copy (bf16)", "repeat_kv key/value copies", "SDPA 4-D attention mask"} & set(flash)
    mha = mem.Shape(hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16, intermediate=128, vocab=1000, tied=False)
    assert mem.repeat_kv_copies(mha, 1, 10) == 0  # no GQA: SDPA reads k, v as they are


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
    # the peak fits 80 GB but within 10 % of the usable 76 GB: a WARN says so and names what fills it
    assert [(v, t.split(";")[0]) for v, t in lines(rep, "memory tight")] == [
        ("WARN", "tight: policy backward 72.8 GB of 76.0 GB usable (+3.2 GB spare)")]
    roomy = report(GRPO_8B, "--weight_sync", "disk", "--gpu_memory_gb", "141")
    assert lines(roomy, "memory tight") == [] and lines(roomy, "memory peak")[0][0] == "ok"


def test_ppo_critic_is_counted(monkeypatch):
    """advantage: gae adds the critic: its ZeRO-3 model states (18 B/param over 4 ranks, the policy's architecture
    without an LM head: Qwen3-8B's embeddings are untied, so one 151,936 x 4096 matrix less) and a backward phase of
    its own without the LM head's terms."""
    shape = mem.shape_from_config(preflight.KNOWN_CONFIGS["Qwen/Qwen3-8B"])
    launch = mem.Launch(world=4, zero_stage=3)
    est = mem.estimate(shape, launch, rows=4, length=10240, reference=False, critic=shape)
    P_critic = shape.params - 151936 * 4096
    critic_states = sum(v for k, v in est["resident"].items() if k.startswith("critic "))
    assert critic_states == pytest.approx(18 * P_critic / 4)
    assert "critic backward" in est["phases"] and not any("LM head" in k for k in est["phases"]["critic backward"])
    plain = mem.estimate(shape, launch, rows=4, length=10240, reference=False)
    assert est["totals"]["policy backward"] == pytest.approx(plain["totals"]["policy backward"] + critic_states)
    monkeypatch.setenv("WANDB_MODE", "offline")
    rep = report(GRPO_8B, "--weight_sync", "disk", "--advantage", "gae")
    resident = [t for _, t in lines(rep, "memory (resident)")]
    assert any("critic fp32 master + Adam moments (shard)" in t for t in resident)
    assert lines(rep, "memory peak")[0][0] == "FAIL"  # 8B policy + 8B critic on 4 x 80 GB does not fit: said


def test_preflight_fails_wrong_world_size_tp_and_wandb(monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent/netrc")
    rep = report("configs/ragen/variants/qwen2.5-7b-countdown-ppo-topp0.9.yaml", "--num_processes", "16",
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


def test_generation_estimate_is_the_hand_computation(monkeypatch):
    """GRPO-8B: 4 processes x 4 rows x 64 steps = 1024 rollouts x (2048 + 8192) tokens / (2500 tokens/s x the
    recipe's 4 server GPUs) = 1048.6 s; the recipe's vllm_request_timeout 1800 and ddp_timeout 2400 pass it."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    rep = report(GRPO_8B, "--weight_sync", "disk")
    hand = 1024 * (2048 + 8192) / (2500 * 4)
    (_, text), = lines(rep, "generation estimate")
    assert f"= {hand:.0f} s" in text and "1024 rollouts x 10240 tokens" in text and "TP 4 x DP 1" in text
    assert lines(rep, "request timeout") == [("ok", f"vllm_request_timeout 1800 s >= the {hand:.0f} s estimate")]
    assert lines(rep, "ddp timeout")[0][0] == "ok"
    assert preflight.suggested_timeout(hand) == 1800  # 1.5 x 1048.6 = 1572.9 -> the next multiple of 300
    # The assumption is the user's to change: half the throughput, twice the time, and the 1800 s no longer pass.
    slow = report(GRPO_8B, "--weight_sync", "disk", "--generation_tokens_per_s_per_gpu", "1250")
    assert f"= {2 * hand:.0f} s" in lines(slow, "generation estimate")[0][1]
    assert lines(slow, "request timeout")[0][0] == "FAIL"
    # A shorter max_completion_length asks the server for less: 1024 x (2048 + 1024) / 10000 = 315 s.
    short = report(GRPO_8B, "--weight_sync", "disk", "--max_completion_length", "1024")
    assert f"= {1024 * 3072 / 10000:.0f} s" in lines(short, "generation estimate")[0][1]


@pytest.mark.parametrize("flag, value, field, want", [
    ("--vllm_request_timeout", "600", "vllm_request_timeout", 1800),
    ("--ddp_timeout", "900", "ddp_timeout", 2400),
])
def test_timeout_below_the_estimate_fails_naming_the_field(monkeypatch, flag, value, field, want):
    """A timeout below the 1049 s estimate FAILs naming the field and the value to set (1.5 x the estimate rounded
    up to 300 s; ddp_timeout that + 600 s above vllm_request_timeout)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    rep = report(GRPO_8B, "--weight_sync", "disk", flag, value)
    assert rep.failed
    topic = "request timeout" if field == "vllm_request_timeout" else "ddp timeout"
    (verdict, text), = lines(rep, topic)
    assert verdict == "FAIL" and text.startswith(f"{field} {value} s < the 1049 s estimate")
    assert f"set {field}: {want}" in text
    other = "ddp timeout" if topic == "request timeout" else "request timeout"
    assert lines(rep, other)[0][0] != "FAIL"


def test_server_gpus_come_from_the_recipe_or_the_flag(monkeypatch):
    """--tensor_parallel_size (Slurm's VLLM_TP) overrides the recipe's vllm_server_tensor_parallel_size: on one GPU
    the 8B batch takes 4 x as long (4194 s) and the recipe's timeouts FAIL; the server command follows the size."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    rep = report(GRPO_8B, "--weight_sync", "disk", "--tensor_parallel_size", "1")
    assert "= 4194 s" in lines(rep, "generation estimate")[0][1]
    assert lines(rep, "request timeout")[0][0] == "FAIL" and lines(rep, "ddp timeout")[0][0] == "FAIL"
    assert "--tensor-parallel-size 1 " in lines(rep, "server command")[0][1]
    assert "--tensor-parallel-size 4 " in lines(report(GRPO_8B, "--weight_sync", "disk"), "server command")[0][1]


def test_train_dry_run_prints_the_generation_estimate_and_passes(tmp_path):
    """launch/train.py --dry-run on the 8B GRPO recipe (disk sync: this CPU venv has no vLLM for NCCL) exits 0 with
    the estimate and both timeouts ok."""
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(REPO / "launch" / "train.py"), "--config", GRPO_8B, "--dry-run",
                          "--weight_sync", "disk", "--output_dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "generation estimate" in out.stdout and "= 1049 s (17.5 min)" in out.stdout
    assert "ok   request timeout" in out.stdout and "ok   ddp timeout" in out.stdout


def test_listeners_bound_to_a_routable_address_are_warned(monkeypatch):
    """Each listener of the launch with where it binds: the NCCL weight-sync group on loopback when the server is (the
    trainer pins VLLM_HOST_IP), a WARN naming the port and the fix where another host could reach it; torch's
    rendezvous store of a multi-process launch is always a WARN (it listens on every interface)."""
    from trainer.server.listeners import listener_lines

    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    local = listener_lines("http://127.0.0.1:8000", "nccl", 51216, world=1)
    assert [status for status, _ in local] == ["ok", "ok"] and "127.0.0.1:51216: loopback only" in local[1][1]
    remote = listener_lines("http://node0:8000", "nccl", 51216, world=16, main_port=29511)
    assert [status for status, _ in remote] == ["ok", "WARN", "WARN"]
    assert "get_ip()" in remote[1][1] and ":51216" in remote[1][1] and "VLLM_HOST_IP" in remote[1][1]
    assert "port 29511" in remote[2][1] and "every interface" in remote[2][1]
    monkeypatch.setenv("VLLM_HOST_IP", "node1")
    assert "node1:51216" in listener_lines("http://node0:8000", "nccl", 51216, world=1)[1][1]
    assert len(listener_lines("http://node0:8000", "disk", 51216, world=1)) == 1  # no NCCL group without NCCL sync
    monkeypatch.setenv("WANDB_MODE", "offline")
    rep = report(GRPO_8B, "--weight_sync", "disk")  # 4 processes on one node
    assert [status for status, _ in lines(rep, "listeners")] == ["ok", "WARN"]


def test_preflight_prints_the_importance_sampling_correction(monkeypatch):
    """--dry-run shows whether TRL's vLLM importance-sampling correction is on: off in a paper recipe, TRL's default
    (on, with its mode and cap) where a recipe leaves it unset (issue 34, A.1)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    paper = report(GRPO_8B, "--weight_sync", "disk")
    assert lines(paper, "IS correction") == [("", "vllm_importance_sampling_correction false")]
    demo = report("configs/demo/tiny-sokoban-vllm-server.yaml")
    assert lines(demo, "IS correction") == [("", "vllm_importance_sampling_correction true (mode sequence_mask, "
                                                 "clip None..3.0)")]


@pytest.mark.parametrize("recipe, steps, loss, clip", [
    # GRPODropout (the authors' verl): ceil(kept / 512) updates over 512, seq-mean-token-mean, dual-clip 3
    ("configs/grpodropout/qwen3-4b-dapo17k.yaml",
     "ceil(kept rollouts / 512) of at most 2 per generation batch, each divided by the full mini-batch's rollouts, "
     "a partial one proportionally smaller (filtered_updates verl_minibatch)",
     "loss_type grpo: per-sequence token mean, averaged over the step's sequences (verl seq-mean-token-mean)",
     "ratio clipped to [1 - 0.2, 1 + 0.2]; dual-clip: the unclipped ratio capped at delta 3 (verl clip_ratio_c for "
     "A < 0)"),
    # RAGEN: ceil(kept / 32) updates, each a mean over its rollouts, Dr.GRPO's per-sequence token sum, dual-clip 3
    ("configs/ragen/sokoban-drgrpo-nofilter.yaml",
     "ceil(kept rollouts / 32) of at most 4 per generation batch, each the mean over its own rollouts "
     "(filtered_updates proportional)",
     "loss_type dr_grpo: per-sequence token sum, averaged over the step's sequences (verl seq-mean-token-sum)",
     "ratio clipped to [1 - 0.2, 1 + 0.28]; dual-clip: the unclipped ratio capped at delta 3 (verl clip_ratio_c for "
     "A < 0)"),
    # UECR (the paper: one update per batch, token-mean [proposed], no dual-clip)
    ("configs/uecr/qwen3-4b-deepmath-teacher-qwen3-8b.yaml",
     "1 per generation batch whatever the stages keep (filtered_updates fixed)",
     "loss_type dapo: token mean over the step's tokens on every process (verl token-mean)",
     "ratio clipped to [1 - 0.2, 1 + 0.2]; no dual-clip (delta unset)"),
])
def test_preflight_prints_each_papers_step_structure(monkeypatch, recipe, steps, loss, clip):
    """--dry-run on one recipe of each paper prints the optimizer steps per generation batch and their normaliser,
    the loss aggregation and the clipping with its dual-clip bound (issue 34's truth-table values)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    rep = report(recipe, "--weight_sync", "disk")
    assert lines(rep, "optimizer steps") == [("", steps)]
    assert lines(rep, "loss") == [("", loss)]
    assert lines(rep, "clipping") == [("", clip)]
    assert lines(rep, "IS correction") == [("", "vllm_importance_sampling_correction false")]


def test_preflight_counts_every_kept_checkpoint(monkeypatch):
    """A recipe that keeps every checkpoint (UECR's F.4 audit run) gets its total on disk, not "unbounded": 515 steps
    saved every 30 = 17 saves + the last step's = 18 checkpoints of ~14 B/param (bf16 weights, fp32 Adam + masters)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    rep = report("configs/uecr/baselines/qwen3-1.7b-base-atod.yaml", "--weight_sync", "disk")
    (status, text), = lines(rep, "disk")
    assert "all 18 checkpoints kept" in text
    one = float(re.search(r"x ~([\d.]+) GB", text).group(1))
    total = float(re.search(r"= ([\d.]+) GB", text).group(1))
    assert total == pytest.approx(18 * one, rel=1e-2) and 400 < total < 470  # 1.72 B params x 14 B x 18


def test_the_schedule_counts_refill_rounds_and_the_batches_in_flight(monkeypatch):
    """The 8B DAPO row: up to max_num_gen_batches 30 POSTs per generation batch, each within vllm_request_timeout;
    at max_staleness 1 the other ranks wait for 2 batches in flight on a CPU group bounded by 2 x 30 x 1800 + 60 s
    (issue "Generation at GPU scale": the preflight checked one POST only)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    rep = report("configs/grpodropout/table1/qwen3-8b-dapo.yaml", "--weight_sync", "disk", "--max_staleness", "1")
    (_, text), = lines(rep, "generation schedule")
    post = 1024 * 10240 / (2500 * 4)
    assert text.startswith("up to 30 POST(s) per generation batch (max_num_gen_batches 30 refill rounds)"), text
    assert f"up to {30 * post:.0f} s of generation" in text and f"bounded by {2 * 30 * 1800 + 60} s" in text, text
    (_, plain), = lines(report(GRPO_8B, "--weight_sync", "disk"), "generation schedule")
    assert plain.startswith("up to 1 POST(s) per generation batch, each") and "max_staleness" not in plain, plain
