"""Shared by the benchmarks: importing this module (a bench's directory is on sys.path) puts the working
tree's packages and tests/harness.py on the path and sets the offline environment; :func:`write_json` is where
a bench's machine-readable results go (merged by bench/run_all.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

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
