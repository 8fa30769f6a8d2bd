"""Running a comparison's runs: here one after another (a progress bar across runs with the time left), or as one
Slurm array through launch/slurm/train_multinode.slurm (a line of ``runs.tsv`` per array task).

A run that finished is skipped; a started one resumes (``--resume_from_checkpoint auto``); a failed one is recorded
in its folder (``compare-status.json``: exit status, log) and the others go on. Each run's output goes to
``<run>/train.log`` (and ``<run>/eval.log``), so the terminal shows the progress bar only.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from trainer.compare.plan import EVAL_DIR, Run, state, write_status

RUNS_FILE = "runs.tsv"
SLURM_SCRIPT = "launch/slurm/train_multinode.slurm"


def train_command(run: Run, launcher: list[str] | None = None) -> list[str]:
    """The process that trains ``run``: ``launcher`` (e.g. ``accelerate launch --config_file ...``) or this
    interpreter, on ``trainer.cli.train``; resumed when the run started before."""
    head = [*launcher, "-m", "trainer.cli.train"] if launcher else [sys.executable, "-m", "trainer.cli.train"]
    return head + run.train_args(resume=state(run, with_eval=False) == "partial")


def eval_command(run: Run, eval_config: str) -> list[str]:
    """``winnow-eval`` of the run's final model with the ``eval_config`` preset, into ``<run>/eval``."""
    return [sys.executable, "-m", "trainer.cli.eval", "--config", eval_config,
            "--system", f"{run.arm.name}={run.output_dir}", "--output_dir", str(run.output_dir / EVAL_DIR)]


def _call(command: list[str], log: Path) -> int:
    with open(log, "a") as fh:
        fh.write(f"\n$ {shlex.join(command)}\n")
        fh.flush()
        return subprocess.call(command, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env={**os.environ, "WINNOW_COMPARE": "1"})


def run_local(runs: list[Run], eval_config: str | None = None, launcher: list[str] | None = None,
              progress: bool = True) -> dict[str, str]:
    """Train (and evaluate) every run not finished, one after another. Returns ``{label: outcome}`` with outcome
    ``finished`` (already done), ``ok`` or ``failed (exit N, see LOG)``."""
    outcomes: dict[str, str] = {}
    todo = [r for r in runs if state(r, with_eval=eval_config is not None) != "finished"]
    for r in runs:
        if r not in todo:
            outcomes[r.label] = "finished"
    bar = tqdm(total=len(todo), unit="run", disable=not progress or not todo, dynamic_ncols=True)
    for run in todo:
        bar.set_description(run.label)
        run.output_dir.mkdir(parents=True, exist_ok=True)
        started = time.time()
        log = run.output_dir / "train.log"
        rc = 0
        if state(run, with_eval=False) != "finished":  # with an eval asked for, a trained run only evaluates
            rc = _call(train_command(run, launcher), log)
        if rc == 0 and eval_config:
            log = run.output_dir / "eval.log"
            rc = _call(eval_command(run, eval_config), log)
        outcome = "ok" if rc == 0 else f"failed (exit {rc}, see {log})"
        outcomes[run.label] = outcome
        write_status(run, outcome=outcome, exit_status=rc, log=str(log), seconds=round(time.time() - started, 1))
        if rc != 0:
            tqdm.write(f"winnow-compare: {run.label} {outcome}; the other runs go on")
        bar.update(1)
    bar.close()
    return outcomes


def slurm_lines(runs: list[Run]) -> list[str]:
    """One ``runs.tsv`` line per run not finished: its recipe, a tab, the trainer flags (shell syntax) that the Slurm
    script appends (it resumes with ``auto`` itself)."""
    lines = []
    for run in runs:
        if state(run, with_eval=False) == "finished":
            continue
        args = run.train_args(resume=False)
        recipe, flags = args[1], args[2:]
        lines.append(f"{recipe}\t{shlex.join(flags)}")
    return lines


def submit_slurm(runs: list[Run], output_dir: Path, sbatch_args: list[str] | None = None,
                 dry_run: bool = False) -> list[str]:
    """Write ``runs.tsv`` and submit it as one array job of the Slurm script (``RUNS_FILE`` picks each task's line).
    Returns the sbatch command (printed, not run, with ``dry_run``); [] when nothing is left to run."""
    lines = slurm_lines(runs)
    if not lines:
        return []
    output_dir.mkdir(parents=True, exist_ok=True)
    runs_file = output_dir / RUNS_FILE
    runs_file.write_text("".join(line + "\n" for line in lines))
    command = ["sbatch", f"--array=0-{len(lines) - 1}", f"--export=ALL,RUNS_FILE={runs_file}",
               *(sbatch_args or []), SLURM_SCRIPT]
    if not dry_run:
        subprocess.run(command, check=True)
    return command
