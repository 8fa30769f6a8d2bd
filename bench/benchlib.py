"""Shared by the benchmarks: importing this module (a bench's directory is on sys.path) puts the working
tree's packages and tests/harness.py on the path and sets the offline environment; :func:`write_json` is where
a bench's machine-readable results go (merged by bench/run_all.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO / "tests", REPO):  # harness.py; the working tree's packages before any installed copy
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def write_json(path: str | Path, result: dict[str, Any]) -> None:
    """Write one bench's result dict (creating the folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")


def timed(fn: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    """``fn`` wrapped to append the wall seconds of every call to ``sink``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - t0)

    return wrapper


def training_bench_args(description: str, steps: int = 12) -> argparse.Namespace:
    """The command line shared by the benches that time parts of real training steps."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=steps, help=f"training steps per configuration (default {steps})")
    p.add_argument("--rows", type=int, default=32, help="rollouts per step (default 32 = 8 prompts x 4)")
    p.add_argument("--warmup", type=int, default=2, help="leading steps left out of the medians (default 2)")
    p.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    return p.parse_args()
