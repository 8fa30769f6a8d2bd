"""Issue 19 items 2 (error part), 4, 9, 12: launch checks that fail before any weights load, checked on the CPU with
a faked ``torch.cuda.is_available`` where CUDA matters. Each trainer-level test passes a model path that does not
exist: reaching the check's ConfigError (not an OSError about the model) shows it ran before loading."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from harness import BASE_ARGS, reward_token_parity

from trainer import ConfigError, WinnowConfig, WinnowGRPOTrainer
from trainer.guards import startup_checks as checks

REPO = Path(__file__).resolve().parents[2]
SERVER = dict(use_vllm=True, vllm_mode="server", vllm_server_base_url="http://127.0.0.1:9", vllm_server_timeout=1.0)


def config(tmp_path, **overrides) -> WinnowConfig:
    return WinnowConfig(output_dir=str(tmp_path / "out"), **{**BASE_ARGS, **overrides})


def build(tmp_path, args, **kwargs):
    return WinnowGRPOTrainer(model=str(tmp_path / "no-such-model"), reward_funcs=[reward_token_parity], args=args,
                             **kwargs)


def fake_cuda(monkeypatch):
    """CUDA visible from here on (configs are built before: TrainingArguments would try to select the device)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


# --- item 12: auto sync and use_cpu --------------------------------------------------------------------------

@pytest.mark.parametrize("use_cpu, want", [(True, "disk"), (False, "nccl")])
def test_auto_sync_respects_use_cpu_on_a_cuda_machine(tmp_path, monkeypatch, use_cpu, want):
    args = config(tmp_path, **SERVER, use_cpu=use_cpu)
    fake_cuda(monkeypatch)
    assert checks.weight_sync_kind(args) == want


def test_makefile_sets_ds_accelerator_only_without_a_gpu(tmp_path):
    """A fake ``nvidia-smi`` that succeeds stands for a GPU host: there DS_ACCELERATOR stays unset."""
    show = 'winnow-show-ds: ; @echo "DS=$(DS_ACCELERATOR)"'
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    runs = {}
    for name, path in (("gpu", f"{tmp_path}:{env['PATH']}"), ("cpu", "/usr/bin:/bin")):
        out = subprocess.run(["make", "-s", "-C", str(REPO), f"--eval={show}", "winnow-show-ds"], capture_output=True,
                             text=True, env={**env, "PATH": path}, timeout=60)
        assert out.returncode == 0, out.stderr
        runs[name] = out.stdout.strip()
    assert runs == {"gpu": "DS=", "cpu": "DS=cpu"}


# --- item 2: NCCL sync needs vLLM in the trainer's environment --------------------------------------------------

def test_nccl_sync_without_vllm_fails_before_model_load(tmp_path, monkeypatch):
    import importlib.util

    args, disk, cpu = (config(tmp_path, **SERVER, use_cpu=False), config(tmp_path, **SERVER, weight_sync="disk"),
                       config(tmp_path, **SERVER))
    fake_cuda(monkeypatch)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match=r"weight_sync.*make setup-gpu"):
        build(tmp_path, args)
    checks.check_vllm_importable(disk)  # disk needs HTTP only
    checks.check_vllm_importable(cpu)  # use_cpu: auto -> disk


# --- item 4: W&B without credentials -------------------------------------------------------------------------

@pytest.fixture
def no_wandb_credentials(tmp_path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_DISABLED", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    return tmp_path / "netrc"


def test_wandb_online_without_credentials_fails_before_model_load(tmp_path, no_wandb_credentials):
    with pytest.raises(
        ConfigError, match=r"report_to.*WANDB_MODE=offline.*wandb login|report_to.*wandb login.*WANDB_MODE=offline"
    ):
        build(tmp_path, config(tmp_path, report_to=["wandb"]))


def test_wandb_credentials_or_offline_mode_pass(tmp_path, no_wandb_credentials, monkeypatch):
    args = config(tmp_path, report_to=["wandb"])
    no_wandb_credentials.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    no_wandb_credentials.chmod(0o600)
    checks.check_wandb(args)  # `wandb login`'s netrc entry
    no_wandb_credentials.unlink()
    for name, value in (("WANDB_API_KEY", "k" * 40), ("WANDB_MODE", "offline"), ("WANDB_MODE", "disabled")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            checks.check_wandb(args)
    checks.check_wandb(config(tmp_path, report_to=["none"]))
    with pytest.raises(ConfigError):
        checks.check_wandb(args)


# --- item 9: AdamW on bf16 weights without fp32 masters --------------------------------------------------------

def test_adamw_on_bf16_weights_loses_small_updates():
    """Why the check exists: one AdamW step of lr 1e-6 leaves bf16 weights of magnitude 0.02 unchanged, while the same
    step moves float32 weights (AdamW's first step is ~lr per weight)."""
    moved = {}
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.nn.Parameter(torch.full((1000,), 0.02, dtype=dtype))
        w.grad = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(dtype)
        start = w.detach().clone()
        torch.optim.AdamW([w], lr=1e-6, weight_decay=0.0).step()
        moved[dtype] = float((w.detach() != start).float().mean())
    assert moved[torch.bfloat16] == 0.0 and moved[torch.float32] == 1.0


def test_bf16_policy_without_deepspeed_fails_before_model_load(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    args = config(tmp_path, model_init_kwargs={"dtype": "bfloat16"})
    with pytest.raises(ConfigError, match=r"WinnowConfig.dtype.*DeepSpeed.*dtype: float32"):
        build(tmp_path, args)


def test_bf16_policy_passes_with_deepspeed_or_lora_or_fp32(tmp_path, monkeypatch):
    args = config(tmp_path, model_init_kwargs={"dtype": "bfloat16"})
    checks.check_master_weights(args, "m", peft_config=object())  # PEFT keeps the adapters in float32
    checks.check_master_weights(config(tmp_path, model_init_kwargs={"dtype": "float32"}), "m", None)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` sets for a DeepSpeed config
    checks.check_master_weights(args, "m", None)


# --- item 5: the world size is checked before anything loads -----------------------------------------------------

def test_wrong_process_count_fails_before_model_load(tmp_path):
    """A recipe sized for 4 processes launched on 1: the launch_processes error comes before the tokenizer or the
    model is read (the model path does not exist)."""
    from trl import ModelConfig

    from trainer.build import build_trainer
    from trainer.recipe import TaskArguments

    with pytest.raises(ConfigError, match=r"launch_processes.*4 training processes.*has 1"):
        build_trainer(TaskArguments(launch_processes=4), config(tmp_path),
                      ModelConfig(model_name_or_path=str(tmp_path / "no-such-model")))
