"""`make setup-gpu` refuses a driver older than the CUDA build of torch it would install, in one line, before
anything is installed: launch/check_gpu_driver.py under a fake nvidia-smi, and the Makefile target itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _fake_nvidia_smi(tmp_path: Path, driver: str) -> dict:
    """An environment whose nvidia-smi reports ``driver`` (as `--query-gpu=driver_version --format=csv,noheader`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/bash\ncase "$*" in *driver_version*) echo "{driver}";; esac\nexit 0\n')
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("driver, ok", [("575.57.08", False), ("580.65.05", False), ("580.65.06", True),
                                        ("590.44.01", True), ("1000.0", True)])
def test_driver_against_the_cuda_13_minimum(tmp_path, driver, ok):
    out = subprocess.run([sys.executable, str(REPO / "launch/check_gpu_driver.py"), "--min-driver", "580.65.06",
                          "--cuda", "13.0", "--torch", "2.13.0"], env=_fake_nvidia_smi(tmp_path, driver),
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode == 0) == ok, out.stderr
    if not ok:
        line, = out.stderr.strip().splitlines()
        assert f"driver {driver} is older than 580.65.06" in line and "TORCH_PIP_ARGS" in line


def test_setup_gpu_stops_before_installing_on_an_old_driver(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)  # the venv "exists": make goes straight to the recipe
    out = subprocess.run(["make", "-C", str(REPO), "setup-gpu", f"VENV={venv}", f"PYTHON={sys.executable}"],
                         env=_fake_nvidia_smi(tmp_path, "570.86.15"), capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "NVIDIA driver 570.86.15 is older than 580.65.06" in out.stderr, out.stderr
    assert "pip install" not in out.stdout  # nothing was downloaded or installed
