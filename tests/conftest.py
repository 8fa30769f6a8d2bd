"""Test-wide settings: offline hub, quiet TRL, the repo root importable, and the tiny model fixture."""

import ctypes
import ctypes.util
import gc
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


def pytest_configure(config):
    """Register the resource probe (tests/resource_probe.py): per-test time and RSS, the suite's peak RSS."""
    from resource_probe import ResourceProbe

    config.pluginmanager.register(ResourceProbe(config), "winnow-resource-probe")


# Memory is given back after any test that leaves this process above RELEASE_ABOVE bytes resident: a full garbage
# collection (trainers hold reference cycles through their callbacks and accelerator) and glibc's malloc_trim, which
# returns freed heap pages to the system. Without the trim a freed SmolLM2 training run stays resident (glibc keeps
# the pages of freed tensors below its dynamic mmap threshold in its arenas); measured in docs/testing.md.
# A process that stays above the bound without growing (a worker that loaded a tokenizer or torch's libraries) is not
# released again after every test: a full collection + trim costs ~0.7 s there, paid by each of hundreds of small
# tests (835 s of teardown in one CI run); only growth of RELEASE_GROWTH since the last release triggers it.
RELEASE_ABOVE = 1 << 30
RELEASE_GROWTH = 256 << 20
_released_at = 0  # RSS right after the last release in this process
_LIBC = ctypes.CDLL(ctypes.util.find_library("c")) if sys.platform.startswith("linux") else None


def release_memory() -> None:
    """Collect garbage and return the freed heap to the OS (glibc ``malloc_trim``)."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the test's own fixtures are torn down: release memory when this process holds over RELEASE_ABOVE and has
    grown by RELEASE_GROWTH since it last released."""
    import psutil

    global _released_at
    process = psutil.Process()
    if process.memory_info().rss > max(RELEASE_ABOVE, _released_at + RELEASE_GROWTH):
        release_memory()
        _released_at = process.memory_info().rss


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Path of the tiny random Qwen3 saved to disk (TRL reloads models by path)."""
    from harness import tiny_model_path

    return tiny_model_path()


# Test tiers follow the folder (docs/testing.md): tests mirror the package, and each folder is one tier.
# `make test-fast` runs the unit folders; `make test` runs every folder.
#   unit        -- pure functions and small modules: no trainer built, no model forward, no worker pool or launch
#                  (a short interpreter for a hash-seed determinism check aside)
#   integration -- the real trainer (or a real model) in-process on the tiny model: a few steps, against TRL or
#                  hand-written references
#   e2e         -- separate processes: accelerate launches, multi-process/ZeRO-3 scenarios, a real vLLM server,
#                  launch/*.py and recipes run as a user would
# No folder is named like a package of this repo (trainer, rewards, envs): tests/ is on sys.path for the helpers
# (harness.py, ...), and with the editable install a folder of that name would be imported as a namespace package
# in place of the real one by any script that puts tests/ first (tests/distributed/scenarios.py does).
TIER_BY_FOLDER = {
    "algorithms": "unit", "environments": "unit", "reward_functions": "unit", "data": "unit", "eval": "unit",
    "config": "unit", "contracts": "unit", "compare": "unit",
    "loss": "integration",
    "methods": "integration", "pipeline": "integration", "grpo_trainer": "integration", "rollout": "integration",
    "gpu": "integration", "verifier": "integration",
    "server": "e2e", "distributed": "e2e", "e2e": "e2e",
}
TESTS = Path(__file__).resolve().parent


def tier_of(path: Path) -> str:
    """The tier of a test file, from its folder under tests/ (a test file anywhere else is an error)."""
    folder = Path(path).resolve().relative_to(TESTS).parts[0]
    if folder not in TIER_BY_FOLDER:
        raise pytest.UsageError(f"{path}: test files live in a tier folder of tests/ ({', '.join(TIER_BY_FOLDER)}); "
                                "add the folder to TIER_BY_FOLDER in tests/conftest.py or move the file")
    return TIER_BY_FOLDER[folder]


# How `make test` deals the suite out (docs/testing.md, "How the suite runs"):
# - SERIAL: files whose tests start two busy training processes (2-process DDP / ZeRO-3 launches) or a vLLM server
#   next to the trainer: marked `serial`, run alone after the parallel part, so they never share the cores.
# - every other file is one xdist work unit (`--dist loadfile`: its module fixtures are built once, on one worker);
# - COSTLY_FIRST: work units are handed out in collection order, so the longest files (measured, docs/testing.md)
#   start first and the workers finish together instead of one waiting on a late long file.
SERIAL = {"distributed/test_distributed.py", "server/test_vllm_server_real.py"}
COSTLY_FIRST = [  # measured with tests/probe_report.py (docs/testing.md), longest first
    "distributed/test_one_process_reference.py", "e2e/test_resume_exact.py", "e2e/test_baseline_recipes_smoke.py",
    "methods/test_uecr_trainer.py",
    "e2e/test_eval_runner.py", "pipeline/test_step_dealing.py", "grpo_trainer/test_equals_trl_drifted.py",
    "methods/test_cov_losses_trainer.py", "e2e/test_train_entrypoint.py", "grpo_trainer/test_numerics_guard.py",
    "pipeline/test_compaction.py", "rollout/test_env_rollout_trainer.py", "verifier/test_reward_fuzz.py",
]


def _rel(item) -> str:
    return Path(item.path).resolve().relative_to(TESTS).as_posix()


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(config, items):
    """Mark every collected test with its folder's tier and ``serial`` where it must run alone; put the costliest
    files first."""
    rank = {name: i for i, name in enumerate(COSTLY_FIRST)}
    items.sort(key=lambda item: rank.get(_rel(item), len(rank)))  # stable: file order kept otherwise
    for item in items:
        rel = _rel(item)
        item.add_marker(getattr(pytest.mark, tier_of(item.path)))
        if rel in SERIAL:
            item.add_marker(pytest.mark.serial)
