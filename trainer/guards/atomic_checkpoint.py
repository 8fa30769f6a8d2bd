"""Checkpoints that are either complete or invisible: write into a staging folder, then rename.

transformers' Trainer writes ``checkpoint-N`` in place -- model, optimizer, scheduler, RNG states, trainer
state, one file after another -- and ``--resume_from_checkpoint`` picks the highest-numbered folder. A run
killed during a save (preemption, OOM killer, SIGKILL) therefore leaves a ``checkpoint-N`` that looks like
the latest and is not whole, and the resume fails or, worse, silently loads a mixture. Here every file of a
checkpoint (ours included: the stage state) is written to ``<output_dir>/.staging/checkpoint-N`` and the
folder is renamed to ``<output_dir>/checkpoint-N`` only when all processes have finished writing; a
rename within one filesystem is atomic, so a kill at any moment leaves the previous checkpoint as the
latest one. ``get_last_checkpoint`` only looks at ``checkpoint-N`` names directly in ``output_dir``, so a
half-written staging folder is never resumed from; the next save clears it. After a publish the emptied
``.staging`` folder is removed, so a finished run leaves no trace of the mechanism.
"""

from __future__ import annotations

import os
import shutil

STAGING_DIR = ".staging"


def staged_path(run_dir: str, name: str) -> str:
    """Where checkpoint ``name`` of ``run_dir`` is written before it is published."""
    return os.path.join(run_dir, STAGING_DIR, name)


def clear(path: str) -> None:
    """Remove a leftover staging folder (a save that was killed half-way)."""
    if os.path.isdir(path):
        shutil.rmtree(path)


def _fsync_tree(path: str) -> None:
    # Flush file contents before the rename so a machine crash (not just a process kill) cannot publish a
    # folder whose files are still only in the page cache.
    for folder, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(folder, name), "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory file descriptors
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(staged: str, final: str) -> None:
    """Make the fully written ``staged`` folder visible as ``final`` with one atomic rename."""
    _fsync_tree(staged)
    if os.path.isdir(final):  # the same step saved twice (e.g. a save at the end of a resumed run): replace it
        shutil.rmtree(final)
    os.replace(staged, final)
    _fsync_dir(os.path.dirname(final))
    try:
        os.rmdir(os.path.dirname(staged))  # the staging folder, now empty (a non-empty one is left alone)
    except OSError:
        pass
