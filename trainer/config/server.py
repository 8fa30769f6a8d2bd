"""vLLM server-mode weight-sync knobs of ``WinnowConfig`` (a mixin dataclass; server/weight_sync.py
implements them).

TRL syncs the policy into the generation server over NCCL. That needs CUDA on both ends and a free NCCL port between
the trainer and the server node; ``disk`` and ``lora`` need only HTTP and a folder both can read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trainer.config.errors import ConfigError

WeightSync = Literal["auto", "nccl", "disk", "lora"]  # the fields' types: the one list of options each
WeightSyncDtype = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass
class ServerFields:
    """How the trainer pushes its weights to the vLLM generation server (``vllm_mode: server``)."""

    weight_sync: WeightSync = field(
        default="auto",
        metadata={
            "help": "Server mode: how the policy reaches the vLLM server before each generation. 'nccl' = TRL's "
            "broadcast over an NCCL group (CUDA on both ends, server started with --weight-transfer-config). 'disk' = "
            "write the weights as safetensors shards into weight_sync_dir, then the server's reload_weights RPC and a "
            "prefix-cache reset (server started with VLLM_SERVER_DEV_MODE=1; works on CPU). 'lora' = with PEFT, write "
            "only the adapter and hot-swap it in place (/v1/load_lora_adapter, no merge; server started with "
            "--enable-lora --max-lora-rank >= lora_r and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1). 'auto' = nccl when CUDA "
            "is available, else disk. launch/vllm_server.py starts a matching server."
        },
    )
    weight_sync_dir: str | None = field(
        default=None,
        metadata={
            "help": "disk/lora: folder the trainer writes each weight version into (one subfolder per sync, the "
            "previous ones deleted). Must be readable by the server under weight_sync_server_dir (same path on a "
            "shared filesystem by default). Default: <output_dir>/weight_sync."
        },
    )
    weight_sync_server_dir: str | None = field(
        default=None,
        metadata={
            "help": "disk/lora: the same folder as the server sees it, when it is mounted at another path there "
            "(default: weight_sync_dir)."
        },
    )
    weight_sync_dtype: WeightSyncDtype = field(
        default="auto",
        metadata={
            "help": "disk: dtype of the written weights. 'auto' = the server's model dtype (read from /server_info), "
            "so the bytes written are the bytes loaded and a bf16 server costs half the disk traffic of fp32."
        },
    )
    weight_sync_shard_mb: int = field(
        default=2048,
        metadata={
            "help": "disk: shard size in MB. The main process holds at most one shard in CPU memory while writing; "
            "under ZeRO-3 parameters are gathered one at a time (never the whole model on one rank)."
        },
    )
    weight_sync_lora_name: str = field(
        default="policy",
        metadata={"help": "lora: the adapter name on the server; generation requests name it as their model."},
    )
    vllm_server_tensor_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Server mode: the GPUs the recipe's vLLM server shards the model over (its "
            "--tensor-parallel-size). launch/vllm_server.py --config serves with it on GPU, and the preflight "
            "(launch/train.py --dry-run) divides one generation batch's tokens by it to check vllm_request_timeout "
            "and ddp_timeout. The trainer does not start the server and reads it nowhere else."
        },
    )


def server_url(cfg) -> str | None:
    """The vLLM server's base URL in server mode (TRL prefers ``vllm_server_base_url`` over host and port), else
    None."""
    if not (cfg.use_vllm and cfg.vllm_mode == "server"):
        return None
    return cfg.vllm_server_base_url or f"http://{cfg.vllm_server_host}:{cfg.vllm_server_port}"


def truncating_sampler(cfg) -> list[str]:
    """The sampling settings that truncate the distribution vLLM samples from (``top_k``, ``top_p``, ``min_p``), as
    ``field=value``; empty when the sampler keeps the whole (temperature-scaled) softmax."""
    out = []
    if cfg.top_k not in (None, 0, -1):
        out.append(f"top_k={cfg.top_k}")
    if cfg.top_p is not None and cfg.top_p < 1.0:
        out.append(f"top_p={cfg.top_p}")
    if cfg.min_p:
        out.append(f"min_p={cfg.min_p}")
    return out


def check_importance_sampling(cfg) -> None:
    """TRL's vLLM importance-sampling correction compares vLLM's sampling log-probs with the trainer's. Under top-k /
    top-p / min-p vLLM returns log-probs of the truncated, renormalised distribution (``processed_logprobs``, which
    TRL and launch/vllm_server.py use; vllm==0.31.0:vllm/v1/sample/ops/topk_topp_sampler.py:274-278 truncates before
    it computes them), the trainer those of the full softmax: every token's ratio is then Z_kept <= 1 and a sequence's
    weight shrinks exponentially with its length. Refused, naming both fields."""
    truncation = truncating_sampler(cfg)
    if cfg.use_vllm and cfg.vllm_importance_sampling_correction and truncation:
        raise ConfigError(
            "vllm_importance_sampling_correction",
            f"is on (TRL's default) with a truncating sampler ({', '.join(truncation)}): vLLM's log-probs are of the "
            "truncated distribution and the trainer's of the full softmax, so the correction would down-weight every "
            "sequence exponentially in its length",
            "set vllm_importance_sampling_correction: false (the papers' code has no such correction), or sample "
            "without top_k / top_p / min_p",
        )


def validate_server_fields(cfg) -> None:
    """Fail fast on the fields above (ConfigError naming the field and the fix; WinnowConfig checks the options of
    the Literal-typed ones)."""
    check_importance_sampling(cfg)
    if cfg.weight_sync_shard_mb < 1:
        raise ConfigError("weight_sync_shard_mb", f"must be >= 1 (got {cfg.weight_sync_shard_mb})", "use e.g. 2048")
    server_mode = bool(cfg.use_vllm) and cfg.vllm_mode == "server"
    if cfg.weight_sync in ("disk", "lora") and not server_mode:
        raise ConfigError(
            "weight_sync",
            f"{cfg.weight_sync!r} syncs into a vLLM server, but use_vllm={cfg.use_vllm} and "
            f"vllm_mode={cfg.vllm_mode!r}",
            "set use_vllm: true and vllm_mode: server, or leave weight_sync: auto",
        )
    if cfg.vllm_server_tensor_parallel_size < 1:
        tp = cfg.vllm_server_tensor_parallel_size
        raise ConfigError("vllm_server_tensor_parallel_size", f"must be >= 1 (got {tp})",
                          "use the server's GPU count, e.g. 4")
    if not cfg.weight_sync_lora_name or "/" in cfg.weight_sync_lora_name:
        raise ConfigError(
            "weight_sync_lora_name",
            f"{cfg.weight_sync_lora_name!r} is not a usable adapter name",
            "use a plain name such as 'policy'",
        )


def resolve_weight_sync(kind: str, cuda_available: bool) -> str:
    """The concrete sync for ``weight_sync: auto`` (nccl with CUDA, else disk); other values unchanged."""
    if kind != "auto":
        return kind
    return "nccl" if cuda_available else "disk"
