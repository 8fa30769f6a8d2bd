"""Every rank fails together: with overlapped generation on two processes, a request that keeps failing is raised by
each process itself, within seconds of each other, naming the server's error (tests/distributed/overlap_failure.py).
Before the wait group (trainer/server/generation.py ``wait_group``) only the main process raised; the other rank sat
in the weight sync's collective until a launcher on its node ended it, or until ``ddp_timeout`` where none does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from launches import run_logged

pytestmark = [pytest.mark.integration, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))


def test_a_failing_request_is_raised_by_every_rank_itself(tmp_path, tiny_model):
    run_logged([ACCELERATE, "launch", "--config_file", "launch/accelerate/multi_cpu_2.yaml",
                str(ROOT / "tests/distributed/overlap_failure.py"), "--out", str(tmp_path)], tmp_path / "launch.log")
    main, other = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert "too many 500 error responses" in main["message"], main
    # the other rank raises the main process's error itself, named, not a collective's timeout
    assert other["error"] == "GenerationServerError", other
    assert "generation batch 2" in other["message"] and "too many 500 error responses" in other["message"], other
    assert abs(other["at"] - main["at"]) < 10, (main, other)
    assert main["step"] == other["step"] == 2  # batch 2 failed before any of its steps
