"""The RAGEN environment recipes end to end on CPU: the real Sokoban / FrozenLake recipe files, scaled down
(tiny random Qwen3, 1 process, local generation), through ``build_trainer`` -- levels, the multi-turn rollout,
the SNR filter, the collapse detector and validation on held-out levels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.build import build_trainer
from trainer.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]
CPU_SCALE = [
    "--model_name_or_path", "offline:tiny-qwen3", "--dtype", "float32", "--bf16", "false", "--use_cpu", "true",
    "--use_vllm", "false", "--launch_processes", "1", "--gradient_checkpointing", "false", "--report_to", "none",
    # one generation batch of 4 episodes (2 groups of 2), trained as 2 micro-batches of 2 in one optimizer step: the
    # ~300-token multi-turn rows make each row's logits ~180 MB (151,936-token vocabulary)
    "--num_generations", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
    "--steps_per_generation", "2", "--max_steps", "1", "--max_turns", "2", "--turn_max_tokens", "8",
    "--max_completion_length", "300", "--collapse_every", "1", "--collapse_num_samples", "4",
    "--collapse_max_tokens", "20000",
    # 16 trace x prompt pairs of ~300 tokens, scored 2 per forward (not 16): the same scores (chunked = unchunked,
    # tests/methods/test_collapse_detector.py) at an eighth of the logits' memory
    "--collapse_micro_batch_size", "2", "--logging_steps", "1", "--save_strategy", "no", "--learning_rate", "1e-3",
    "--dataset_kwargs", '{"num_levels": 16}', "--disable_tqdm", "true",
]


def run_recipe(rel: str, tmp_path: Path, *extra: str):
    task, args, model = parse_recipe(["--config", str(ROOT / rel), *CPU_SCALE, "--output_dir", str(tmp_path), *extra])
    trainer = build_trainer(task, args, model)
    returned = []
    rollout = trainer.rollout_func
    trainer.rollout_func = lambda prompts, t: returned.append(rollout(prompts, t)) or returned[-1]
    torch.manual_seed(0)
    trainer.train()
    return trainer, returned


def test_sokoban_recipe_trains_through_the_multi_turn_rollout(tmp_path):
    # the random tiny model never closes a think block: without the prefill its turns are whole-completion traces
    trainer, returned = run_recipe("configs/ragen/sokoban-grpo-topp0.9.yaml", tmp_path, "--eval_strategy", "no",
                                   "--val_before_train", "false", "--think_prefill", "false",
                                   "--collapse_turns", "all")
    out = returned[0]
    seeds = out["env_seed"]
    assert len(seeds) == 4 and seeds[0] == seeds[1] and seeds[2] == seeds[3]  # a group shares its level
    assert all(seed >= 10_000 for seed in seeds)  # training levels
    for mask, spans in zip(out["env_mask"], out["turn_spans"]):
        assert sum(mask) == sum(b - a for a, b in spans) and 1 <= len(spans) <= 2
    logs = trainer.state.log_history[0]
    assert logs["env/turns"] == pytest.approx(sum(out["num_turns"]) / 4)
    assert any(k.startswith("snr/") for k in logs)
    # one check computes both of RAGEN's samples: the first turn of each episode (collapse/*) and, under
    # collapse/trajectory/*, every turn of every episode as a trace, 4 draws (episode, then turn; with replacement)
    # each scored under every drawn context
    assert logs["collapse/traces_total"] == 4 and "collapse/mi_zscore_ema" in logs
    assert logs["collapse/trajectory/traces_total"] == sum(out["num_turns"])
    assert logs["collapse/trajectory/num_samples"] == logs["collapse/trajectory/num_prompts"] == 4
    assert "collapse/trajectory/mi_zscore_ema" in logs and "collapse/trajectory/retrieval_accuracy" in logs
    first = out["prompt_ids"][0]
    prompt_text = trainer.processing_class.decode(first)
    assert "Sokoban" in prompt_text and "Board size: 6 rows x 6 cols" in prompt_text


def test_frozenlake_recipe_validates_on_held_out_levels(tmp_path):
    trainer, returned = run_recipe(
        "configs/ragen/frozenlake-dapo-nofilter.yaml", tmp_path, "--eval_strategy", "steps", "--eval_steps", "1",
        "--env_eval_levels", "4", "--per_device_eval_batch_size", "4", "--collapse_detection", "false",
    )
    before, train_out, eval_out = returned[0], returned[1], returned[-1]
    assert sorted(before["env_seed"]) == [123, 124, 125, 126]  # val_before_train: validation before the update
    assert all(seed >= 10_000 for seed in train_out["env_seed"])
    assert sorted(eval_out["env_seed"]) == [123, 124, 125, 126]  # validation levels, one rollout each
    evaluation = next(e for e in trainer.state.log_history if "eval_env/return" in e)
    assert {"eval_env/success_rate", "eval_env/turns"} <= set(evaluation)
    assert "slippery" in trainer.processing_class.decode(train_out["prompt_ids"][0]).lower()
