"""The GRPODropout recipe (configs/grpodropout/qwen3-1.7b-dapo17k.yaml, the authors' `balance` variant) through
``accelerate launch launch/train.py`` on CPU: the recipe file as a user runs it, only the scale overridden (the tiny
Qwen3, one process, no vLLM, a 16-row local copy of the data in the Processed schema). Kept from the recipe: the data
loader and its prompt (raw problem under the authors' system prompt, Qwen3 chat template with thinking on), the
GRPODropout stage and its knobs, loss_type grpo, dual-clip delta 3, G = 8 and up to two optimizer steps per
generation batch (scaled from 128 x 8 rollouts with 2 mini-batches of 512 to 2 x 8 rollouts with 2 steps of 8:
verl_minibatch takes ceil(kept / 8) of them)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import yaml
from harness import write_rows

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
RECIPE = "configs/grpodropout/qwen3-1.7b-dapo17k.yaml"
PROBLEMS = [("What is $2+3$?", "5"), ("Compute $7 \\cdot 8$.", "56"), ("What is $12 - 5$?", "7"),
            ("Find $x$ if $2x = 10$.", "5")] * 4
SCALE = ["--model_name_or_path", "offline:tiny-qwen3", "--launch_processes", "1", "--use_vllm", "false",
         "--bf16", "false", "--use_cpu", "true", "--gradient_checkpointing", "false", "--report_to", "none",
         "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1", "--steps_per_generation", "2",
         "--max_completion_length", "16", "--max_steps", "2", "--save_strategy", "no", "--plot", "false",
         "--dataloader_num_workers", "0", "--learning_rate", "1e-3",
         # the recipe's bf16 weights need DeepSpeed's fp32 masters (trainer/guards/startup_checks.py)
         "--dtype", "float32"]


def test_grpodropout_paper_recipe_runs_through_train_py(tmp_path, tiny_model):
    data = write_rows([{"prompt": p, "solution": a} for p, a in PROBLEMS], tmp_path / "dapo_en.parquet")
    out = tmp_path / "run"
    # a local view replaces the hub one, with its own row count for the recipe's expected_rows guard
    argv = ["--config", RECIPE, *SCALE, "--output_dir", str(out),
            "--dataset_kwargs", json.dumps({"path": data, "expected_rows": len(PROBLEMS)})]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run([ACCELERATE, "launch", "--config_file", "launch/accelerate/cpu.yaml", "launch/train.py",
                           *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    resolved = yaml.safe_load((out / "recipe.resolved.yaml").read_text())
    train = task = resolved  # flat: recipe.resolved.yaml is itself a recipe
    assert (train["loss_type"], train["delta"], train["epsilon"]) == ("grpo", 3.0, 0.2)
    assert (
        train["rollout_dropout"],
        train["dropout_selector"],
        train["dropout_zero_push_groups"],
        train["dropout_restandardize"],
        train["dropout_recenter"],
        train["filtered_updates"],
    ) == ("grpodropout", "balanced_push", "random_min_keep", True, "prob_weighted", "verl_minibatch")
    assert train["num_generations"] == 8 and train["steps_per_generation"] == 2 * train["gradient_accumulation_steps"]
    assert train["chat_template_kwargs"] == {"enable_thinking": True} and task["dataset_name"] == "dapo_math_17k"

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]  # one generation batch, two optimizer steps
    assert all(math.isfinite(r["loss"]) for r in steps)
    assert any(k.startswith("dropout/") for k in steps[0])  # the GRPODropout stage ran on the generation batch
    # verl's step structure: ceil(kept / 8) optimizer steps of this generation batch of 16 (the rest skipped)
    kept = [r["stages/kept_rollouts"] for r in rows if "stages/kept_rollouts" in r]
    taken = [r["stages/optimizer_steps"] for r in rows if "stages/optimizer_steps" in r]
    assert len(kept) == len(taken) == 1 and taken[0] == math.ceil(kept[0] / 8)

    # the prompt the run trained on: the loader with the run's settings renders the authors' messages
    sys.path.insert(0, str(ROOT))
    from trainer.data import load_task_dataset
    from trainer.recipe import parse_recipe

    parsed, _, _ = parse_recipe(argv)
    first = load_task_dataset(parsed.dataset_name, **parsed.dataset_kwargs)["prompt"][0]
    assert first == [
        {"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
        {"role": "user", "content": PROBLEMS[0][0]},
    ]
