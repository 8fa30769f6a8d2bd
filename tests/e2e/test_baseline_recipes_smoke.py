"""One CPU smoke run per baseline recipe family: the real recipe file, parsed as a user would, with only the scale
overridden (SmolLM2-135M-Instruct, the offline real model -- a random tiny model never answers, so every reward
and advantage would be 0; offline arithmetic prompts; small batches; no vLLM) -- 2 optimizer steps from one
generation batch, so the second step is off-policy as in the paper setting (2 optimizer steps per generation).

Every method-defining value (loss variant and its knobs, clip range, dynamic sampling, overlong shaping, entropy
quantile, advantage scaling) comes from the recipe. The run must train and log the family's own metrics."""

from __future__ import annotations

import json
import math

import pytest

from trainer.build import build_trainer
from trainer.recipe import parse_recipe

DEMO_PROMPT = "Compute {problem}. Write the result as \\boxed{{result}}."  # configs/demo/smollm2-arithmetic.yaml
SCALE = [
    "--model_name_or_path", "offline:smollm2",
    "--dataset_name", "arithmetic",
    "--dataset_kwargs", json.dumps({"num_samples": 64, "seed": 1, "prompt_template": DEMO_PROMPT}),
    "--use_vllm", "false", "--bf16", "false", "--use_cpu", "true", "--gradient_checkpointing", "false",
    "--dtype", "float32",  # the recipes' bf16 weights need DeepSpeed's fp32 masters (trainer/guards/startup_checks.py)
    "--launch_processes", "1",
    # a generation batch of 32 (4 prompts x 8) and 2 optimizer steps from it, in micro-batches of 4 rows (not 16
    # at once: 1 GB less resident)
    "--num_generations", "8", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "4",
    "--steps_per_generation", "8", "--max_completion_length", "40", "--max_steps", "2",
    "--learning_rate", "2e-5", "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1",
    "--enable_thinking", "false", "--max_prompt_tokens", "256", "--plot", "false", "--dataloader_num_workers", "0",
]
# family -> (recipe, extra overrides, metrics the run must log)
FAMILIES = {
    # overlong buffer scaled to the 40-token budget; at most 3 generation batches per step
    "dapo": ("configs/grpodropout/table1/qwen3-4b-dapo.yaml",
             ["--overlong_buffer_len", "16", "--max_num_gen_batches", "3"],
             ["dynamic_sampling/gen_batches", "dynamic_sampling/mixed_groups",
              "dynamic_sampling/first_batch_mixed_ratio", "rewards/overlong_penalty/mean"]),
    "clip_cov": ("configs/grpodropout/table1/qwen3-4b-clip_cov.yaml", [],
                 ["clip_cov/selected_frac", "clip_cov/candidate_frac"]),
    "kl_cov": ("configs/grpodropout/table1/qwen3-4b-kl_cov.yaml", [],
               ["kl_cov/selected_frac", "kl_cov/abs_log_ratio_mean"]),
    "beyond8020": ("configs/grpodropout/table1/qwen3-4b-beyond8020.yaml", [], ["entropy"]),
    "drgrpo": ("configs/ragen/countdown-drgrpo-nofilter.yaml",
               # --dataset_kwargs merges into the recipe's mapping: a null path drops its hub copy (generated offline)
               ["--dataset_kwargs", '{"num_samples": 64, "seed": 1, "path": null, "split": "train"}',
                "--collapse_detection", "false"], ["snr/kept_groups"]),
}


# `make test` runs the DAPO family (dynamic sampling, and the only run of overlong shaping through a recipe);
# the others (~60-150 s each on SmolLM2) run in `make test-slow`. What still covers each of them in `make test`:
#   clip_cov, kl_cov -- tests/methods/test_cov_losses_trainer.py (token choices and loss vs TRL's, selected_frac
#                       logged by the real trainer), the distributed clip_cov / kl_cov scenarios, and the recipe's
#                       values in tests/config/test_recipes.py;
#   beyond8020       -- the distributed beyond8020 scenario (TRL's entropy mask, the same tokens on 1 and 2
#                       processes) and the recipe's top_entropy_quantile in tests/config/test_recipes.py;
#   drgrpo           -- dr_grpo's loss vs TRL in tests/grpo_trainer/test_trainer_equivalence.py, the distributed
#                       off_dr_grpo scenario, the Countdown task in tests/reward_functions/test_countdown.py,
#                       snr/kept_groups in tests/methods/test_snr_trainer.py and the recipe in
#                       tests/config/test_recipes.py.
IN_MAKE_TEST = {"dapo"}


@pytest.mark.parametrize("family", [f if f in IN_MAKE_TEST else pytest.param(f, marks=pytest.mark.slow)
                                    for f in sorted(FAMILIES)])
def test_recipe_family_smoke_run(family, tmp_path, tiny_model, capsys):
    recipe, extra, must_log = FAMILIES[family]
    argv = ["--config", recipe, *SCALE, "--output_dir", str(tmp_path / family), *extra]
    if family == "drgrpo":  # countdown recipe: its own dataset (generated instances) instead of arithmetic
        argv[argv.index("arithmetic")] = "countdown"
    task, args, model_args = parse_recipe(argv)
    trainer = build_trainer(task, args, model_args)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    for key in must_log:  # generation metrics are logged on the generating step, loss metrics on both
        assert key in steps[0] and all(math.isfinite(h[key]) for h in steps if key in h), key
    with capsys.disabled():  # one line per family for the record (pytest -s shows it; the note quotes it)
        keys = ["loss", "reward", "entropy", *must_log]
        values = {k: [round(h[k], 4) if k in h else None for h in steps] for k in keys}
        assert steps[0]["reward_std"] > 0, "no reward signal: the smoke run would test nothing"
        print(f"\n[smoke] {family}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
