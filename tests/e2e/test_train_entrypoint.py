"""launch/train.py end to end on CPU: a recipe trains 2 real steps of the tiny Qwen3 through `accelerate launch`,
writes checkpoints, metrics.jsonl, metrics.png and the resolved recipe, then resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))

RECIPE = {
    "model_name_or_path": "offline:tiny-qwen3",
    "dataset_name": "arithmetic",
    "dataset_kwargs": {"num_samples": 64, "seed": 1},
    "reward_funcs": ["math_accuracy", "think_format"],
    "reward_timeout": 1.0,
    "enable_thinking": False,
    "max_prompt_tokens": 256,
    "launch_processes": 1,
    "num_generations": 4,
    "per_device_train_batch_size": 8,
    "max_completion_length": 8,
    "learning_rate": 1e-3,
    "loss_type": "dapo",
    "max_steps": 2,
    "save_steps": 2,
    "logging_steps": 1,
    "use_cpu": True,
    "bf16": False,
    "gradient_checkpointing": False,
    "report_to": "none",
    "seed": 0,
}


def _train(recipe: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    cmd = [ACCELERATE, "launch", "--config_file", "launch/accelerate/cpu.yaml", "launch/train.py",
           "--config", str(recipe), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def test_recipe_trains_writes_artifacts_and_resumes(tmp_path, tiny_model):
    out = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "output_dir": str(out)}))
    _train(recipe)
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("entropy" in r and "rewards/math_accuracy/mean" in r and "stages/kept_ratio" in r for r in steps)
    assert (out / "metrics.png").stat().st_size > 5_000
    resolved = yaml.safe_load((out / "recipe.resolved.yaml").read_text())
    assert resolved["max_steps"] == 2 and resolved["reward_funcs"] == ["math_accuracy", "think_format"]
    assert resolved["chat_template_kwargs"] == {"enable_thinking": False}

    # resume: one more step continues from checkpoint-2 (global step 3), not from scratch
    _train(recipe, "--max_steps", "3", "--save_steps", "3", "--resume_from_checkpoint", "true")
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r] == [1, 2, 3]


def test_config_error_fails_before_loading(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "output_dir": str(tmp_path / "x"), "rollout_filter": "snr_typo"}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "launch/train.py", "--config", str(recipe)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "WinnowConfig.rollout_filter" in proc.stderr and "Fix:" in proc.stderr
    assert "Loading weights" not in proc.stderr


def test_lora_recipe_trains_an_adapter(tmp_path, tiny_model):
    """LoRA through TRL/PEFT's ModelConfig fields: one step trains and saves an adapter, not full weights."""
    out = tmp_path / "lora"
    recipe = tmp_path / "lora.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "output_dir": str(out), "max_steps": 1, "save_steps": 1,
                                      "use_peft": True, "lora_r": 4, "lora_alpha": 8,
                                      "lora_target_modules": ["q_proj", "v_proj"]}))
    _train(recipe)
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert not (out / "model.safetensors").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and set(config["target_modules"]) == {"q_proj", "v_proj"}
