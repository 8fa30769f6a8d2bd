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
