"""Refuse a GPU install whose NVIDIA driver is older than the CUDA build of torch it would install, in one line,
before anything is downloaded (`make setup-gpu` runs it first).

    python launch/check_gpu_driver.py --min-driver 580.65.06 --cuda 13.0 --torch 2.13.0

PyPI's torch 2.13.0 wheel for Linux x86_64 requires `cuda-toolkit==13.0.3` and the `nvidia-*-cu13` libraries (its
METADATA), and CUDA 13.0 needs an NVIDIA driver of at least 580.65.06 on Linux (the minimum NVIDIA's CUDA toolkit
release notes give for CUDA 13.0 GA). On an older driver the install succeeds and `torch.cuda.is_available()` is
False; this check says so before a multi-GB download. Standard library only: it runs before the venv has anything
installed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys


def driver_version() -> str | None:
    """The driver version nvidia-smi reports for the first GPU ("580.65.06"), or None when it does not run."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _as_tuple(version: str) -> tuple[int, ...]:
    """ "580.65.06" -> (580, 65, 6); raises ValueError on anything else."""
    return tuple(int(part) for part in version.strip().split("."))


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when the driver is new enough, 1 with one line on stderr when it is not or cannot be read."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--min-driver", required=True, help="the oldest driver the torch build runs on, e.g. 580.65.06")
    p.add_argument("--cuda", required=True, help="the torch build's CUDA version, for the message")
    p.add_argument("--torch", required=True, help="the torch version, for the message")
    args = p.parse_args(argv)
    found = driver_version()
    if found is None:
        print("setup-gpu: nvidia-smi does not report a driver version: this target is for NVIDIA GPU machines "
              "(use make setup)", file=sys.stderr)
        return 1
    try:
        too_old = _as_tuple(found) < _as_tuple(args.min_driver)
    except ValueError:
        print(f"setup-gpu: cannot read the driver version {found!r} from nvidia-smi; pass MIN_GPU_DRIVER= to skip "
              "this check", file=sys.stderr)
        return 1
    if too_old:
        print(f"setup-gpu: NVIDIA driver {found} is older than {args.min_driver}, which torch {args.torch}'s PyPI "
              f"wheel (CUDA {args.cuda}) needs: upgrade the driver, or install PyTorch's build for a CUDA that "
              "nvidia-smi's 'CUDA Version' covers: make setup-gpu TORCH_PIP_ARGS='--index-url "
              "https://download.pytorch.org/whl/cuXYZ' MIN_GPU_DRIVER=<that CUDA's minimum driver>", file=sys.stderr)
        return 1
    print(f"NVIDIA driver {found} (>= {args.min_driver} for torch {args.torch}, CUDA {args.cuda})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
