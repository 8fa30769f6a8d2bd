"""Launch checks that need the environment, not only the config: run by ``WinnowGRPOTrainer.__init__`` before any
weights load, so a GPU job fails in seconds with one line naming the field and the fix instead of after minutes of
loading (or, worse, training wrong). ``launch/preflight.py`` reports the same checks without raising.
"""

from __future__ import annotations

import importlib.util
import netrc
import os
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType

from trainer.config.errors import ConfigError
from trainer.config.server import resolve_weight_sync

WANDB_OFFLINE_MODES = ("offline", "dryrun", "disabled")
HALF_DTYPES = ("bfloat16", "float16", "half", "bf16", "fp16")


def cuda_usable(args: Any) -> bool:
    """CUDA is visible and the run may use it (``use_cpu: true`` trains on the CPU even on a GPU machine)."""
    return torch.cuda.is_available() and not getattr(args, "use_cpu", False)


def server_mode(args: Any) -> bool:
    """Generation through a vLLM server."""
    return bool(args.use_vllm) and args.vllm_mode == "server"


def weight_sync_kind(args: Any) -> str | None:
    """The concrete weight sync of a server-mode run (``auto`` resolved), None without a server."""
    return resolve_weight_sync(args.weight_sync, cuda_usable(args)) if server_mode(args) else None


def vllm_needed(args: Any) -> bool:
    """Whether TRL imports vLLM in the trainer's process: colocate mode, and server mode with the NCCL weight sync
    (TRL's client imports vLLM's weight-transfer engine; our disk/lora syncs need only HTTP)."""
    return bool(args.use_vllm) and (args.vllm_mode == "colocate" or weight_sync_kind(args) == "nccl")


def check_vllm_importable(args: Any) -> None:
    """vLLM importable where TRL will import it (TRL raises only after the models load)."""
    if vllm_needed(args) and importlib.util.find_spec("vllm") is None:
        what = (
            "vllm_mode: colocate"
            if args.vllm_mode == "colocate"
            else f"weight_sync: {args.weight_sync} (nccl on CUDA)"
        )
        raise ConfigError(
            "weight_sync", f"{what} needs vLLM importable in the trainer's environment (TRL imports its NCCL weight "
            "transfer), and this Python has no vllm package",
            "install the GPU stack with `make setup-gpu` (README \"GPU install\"), or use weight_sync: disk",
        )


def wandb_credentials() -> str | None:
    """Where wandb would find an API key without prompting (``WANDB_API_KEY``, an identity token file, or a netrc
    entry for the W&B host as ``wandb login`` writes it), None if nowhere. Read here from the documented sources
    because wandb's own lookup is private API and would prompt on a terminal."""
    if os.environ.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    if os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return "WANDB_IDENTITY_TOKEN_FILE"
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0].split(":")[0]
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        entry = None
    return f"{path} ({host})" if entry and entry[2] else None


def wandb_mode() -> str:
    """``online``, or the offline mode ``WANDB_MODE`` / ``WANDB_DISABLED`` select."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode in WANDB_OFFLINE_MODES:
        return mode
    return "disabled" if os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes") else "online"


def check_wandb(args: Any) -> None:
    """``report_to: wandb`` online without credentials: wandb raises after the models load (no terminal: Slurm,
    nohup) or blocks on a key prompt (terminal). Refuse before loading."""
    report_to = args.report_to if isinstance(args.report_to, (list, tuple)) else [args.report_to]
    if "wandb" not in report_to and "all" not in report_to:
        return
    if wandb_mode() == "online" and wandb_credentials() is None:
        raise ConfigError(
            "report_to", "includes wandb, online, but no W&B credentials were found (no WANDB_API_KEY, no netrc entry "
            "from `wandb login`), so wandb would stop the run after the models load or wait at a key prompt",
            "run `wandb login` (or set WANDB_API_KEY), or export WANDB_MODE=offline (`wandb sync` later), "
            "or pass --report_to none",
        )


def model_dtype(args: Any, model: Any) -> str | None:
    """The dtype the policy's weights will have: the loaded module's, else ``model_init_kwargs['dtype']``."""
    if isinstance(model, torch.nn.Module):
        param = next(model.parameters(), None)
        return None if param is None else str(param.dtype).removeprefix("torch.")
    dtype = (args.model_init_kwargs or {}).get("dtype")
    return None if dtype is None or dtype == "auto" else str(dtype).removeprefix("torch.")


def deepspeed_or_fsdp() -> bool:
    """Whether this launch wraps the model in DeepSpeed or FSDP (both keep float32 master weights for the
    optimizer when the model runs in bf16/fp16)."""
    if (
        os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
        or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
    ):
        return True
    return PartialState().distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP)


def check_master_weights(args: Any, model: Any, peft_config: Any) -> None:
    """Refuse AdamW on half-precision weights without float32 master weights (plain DDP or one process with
    ``dtype: bfloat16``): an update of lr 1e-6 is below bf16's resolution at typical weight magnitudes (|w| ~ 0.02
    has a bf16 step of ~1e-4), so most updates round away and training stalls silently. LoRA adapters are kept in
    float32 by PEFT and DeepSpeed / FSDP keep float32 masters, so those launches pass."""
    dtype = model_dtype(args, model)
    if dtype not in HALF_DTYPES or peft_config is not None or deepspeed_or_fsdp():
        return
    raise ConfigError(
        "dtype",
        f"the policy loads in {dtype} and this launch has no DeepSpeed/FSDP, so AdamW would update "
        f"{dtype} weights directly and learning-rate-sized steps round to zero",
        "launch under DeepSpeed (launch/accelerate/zero2_gpu_8.yaml or zero3_gpu_*.yaml keep fp32 master weights), "
        "or load float32 weights (dtype: float32) and keep bf16: true for bf16 compute",
    )


def check_before_load(args: Any, model: Any, peft_config: Any = None) -> None:
    """Every check above, in the order a user would fix them."""
    check_wandb(args)
    check_vllm_importable(args)
    check_master_weights(args, model, peft_config)
