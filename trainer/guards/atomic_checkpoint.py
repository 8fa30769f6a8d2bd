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

transformers records ``state.best_model_checkpoint`` under the folder it saves into, which here is the staging
folder, gone once published: :func:`published_best` gives the published path to record instead, so that rotation
keeps the best checkpoint and ``load_best_model_at_end`` finds it, as with TRL's in-place checkpoints.
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


def published_best(run_dir: str, best_global_step: int | None, recorded: str | None) -> str | None:
    """``state.best_model_checkpoint`` as transformers records it, on the published paths of ``run_dir``.

    transformers sets it to ``<folder saved into>/checkpoint-<best_global_step>`` when that folder exists
    (transformers==5.24.0:trainer.py:3379-3396). Saving into the staging folder it sees only the checkpoint being
    written (and records its staging path) and never an earlier, published one; here both count, by the name
    they have once published. Otherwise the ``recorded`` value stands, as there."""
    if not best_global_step:
        return recorded
    name = f"checkpoint-{best_global_step}"
    final = os.path.join(run_dir, name)
    if os.path.exists(staged_path(run_dir, name)) or os.path.exists(final):
        return final
    return recorded


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
