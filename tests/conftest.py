"""Test-wide settings: offline hub, quiet TRL, the repo root importable, and the tiny model fixture."""

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI runs the property tests on a fixed example sequence, so a red build is reproducible; local runs keep
# exploring new examples (a failure prints its @reproduce_failure seed).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Path of the tiny random Qwen3 saved to disk (TRL reloads models by path)."""
    from harness import tiny_model_path

    return tiny_model_path()


# Test tiers, assigned by file (docs/testing.md). `make test-fast` runs `-m unit`; `make test` runs every tier.
#   unit        -- pure functions and small modules: no trainer built, no model forward, no worker pool or launch
#                  (a short interpreter for a hash-seed determinism check aside)
#   integration -- the real trainer (or a real model) in-process on the tiny model: a few steps, against TRL or
#                  hand-written references
#   e2e         -- separate processes: accelerate launches, multi-process/ZeRO-3 scenarios, a real vLLM server,
#                  launch/*.py and recipes run as a user would
# A file not listed falls back by name (test_algorithms_* -> unit) and otherwise to integration, so a new file is
# never silently counted as fast; a test that carries a tier marker itself keeps it.
TIER_BY_FILE = {
    "unit": {
        "test_algorithms_collapse_metrics.py", "test_algorithms_dapo.py", "test_algorithms_dropout.py",
        "test_algorithms_grpo.py", "test_algorithms_losses.py", "test_algorithms_snr_filter.py",
        "test_algorithms_uecr.py", "test_alpha_sweep.py", "test_countdown.py", "test_countdown_ragen.py",
        "test_env_episode.py", "test_env_frozenlake.py", "test_env_fuzz.py", "test_env_sokoban.py",
        "test_eval_benchmarks.py", "test_eval_configs.py", "test_eval_metrics.py", "test_frozenlake_ragen.py",
        "test_ragen_prompts.py", "test_rewards_format.py",
        "test_seams_statistics.py", "test_data.py", "test_metamath.py", "test_recipes.py", "test_stage_registry.py",
        "test_grad_scaler_skip.py", "test_gpu_devices.py", "test_collapse_ragen.py", "test_import_contracts.py",
        "test_docs_links.py", "test_rewards_compat.py", "test_eval_prompt_presets.py",
        "test_sokoban_upstream_cases.py",
    },
    "integration": {
        "test_assets.py", "test_collapse_detector.py", "test_compaction.py", "test_cov_losses_trainer.py",
        "test_dapo_trainer.py", "test_drop_in.py", "test_entropy_aggregation.py", "test_env_rollout_trainer.py",
        "test_equals_trl_drifted.py", "test_gpu_precision.py", "test_grpodropout_fidelity.py",
        "test_grpodropout_trainer.py", "test_moe_aux_loss.py", "test_numerics_guard.py",
        "test_pipeline_and_config.py", "test_ragen_validation.py", "test_reward_variance_stop.py", "test_rollout.py",
        "test_sampler_logps.py", "test_seams_trainer.py", "test_snr_trainer.py", "test_step_dealing.py",
        "test_teacher.py", "test_think_prefill.py", "test_trainer_equivalence.py", "test_uecr_trainer.py",
        "test_wandb.py", "test_weight_sync.py", "test_vllm_server_faults.py", "test_preflight.py",
        "test_gpu_launch_checks.py", "test_gpu_server_flags.py", "test_reward_fuzz.py", "test_rewards_math.py",
    },
    "e2e": {
        "test_baseline_recipes_smoke.py", "test_distributed.py", "test_eval_runner.py", "test_gpu_recipes.py",
        "test_grpodropout_recipe_smoke.py", "test_launch_scripts.py", "test_resume_exact.py", "test_train_cli.py",
        "test_train_entrypoint.py", "test_vllm_server_real.py", "test_import_cycles.py",
    },
}
TIERS = tuple(TIER_BY_FILE)
_FILE_TIER = {name: tier for tier, names in TIER_BY_FILE.items() for name in names}


def tier_of(filename: str) -> str:
    """The tier of a test file: the table above, else test_algorithms_* -> unit, else integration."""
    if filename in _FILE_TIER:
        return _FILE_TIER[filename]
    return "unit" if filename.startswith("test_algorithms_") else "integration"


def pytest_collection_modifyitems(config, items):
    """Mark every collected test with its file's tier unless it already carries one."""
    for item in items:
        if any(item.get_closest_marker(tier) for tier in TIERS):
            continue
        item.add_marker(getattr(pytest.mark, tier_of(item.path.name)))
