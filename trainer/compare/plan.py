"""The runs of a comparison: arms x seeds of one base recipe, each in ``<output_dir>/<arm>/seed-<s>``.

An arm is ``NAME`` (the base recipe as it is), ``NAME:key=value key=value`` (fields overridden, as command-line flags
of the trainer) or ``NAME:path/to/recipe.yaml`` (a recipe of its own). Every run of seed ``s`` gets ``--seed s``, so
the arms of one seed draw the same prompts in the same order from the same initial weights (the pairing the report
checks from the logged ``data/prompt_digest``).

A run's state is read from its folder, so a comparison stopped anywhere continues where it was: ``finished`` (its
``metrics.jsonl`` holds the trainer's end-of-training record, and the eval summary when one is asked for),
``partial`` (it started: resumed with ``--resume_from_checkpoint auto``), ``pending``. ``compare-status.json`` keeps
the last attempt's exit status, so a failed run is reported.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trainer.config.errors import RecipeError
from trainer.tools import run_artifacts

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
STATUS_FILE = "compare-status.json"
EVAL_DIR = "eval"


@dataclass(frozen=True)
class Arm:
    """One arm: its name, its recipe (None: the base recipe) and its field overrides (flag, value) in order."""

    name: str
    recipe: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Run:
    """One arm at one seed, in its own folder."""

    arm: Arm
    seed: int
    output_dir: Path
    recipe: str = ""
    extra: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        """``<arm>/seed-<s>``: how the progress line and the report name the run."""
        return f"{self.arm.name}/seed-{self.seed}"

    def train_args(self, resume: bool) -> list[str]:
        """The trainer's arguments for this run (after ``python -m trainer.cli.train``)."""
        args = ["--config", self.arm.recipe or self.recipe]
        for key, value in self.arm.overrides:
            args += [f"--{key}", value]
        args += [*self.extra, "--seed", str(self.seed), "--output_dir", str(self.output_dir)]
        return args + (["--resume_from_checkpoint", "auto"] if resume else [])


def parse_arm(spec: str) -> Arm:
    """``NAME``, ``NAME:key=value ...`` or ``NAME:recipe.yaml`` (see the module docstring) -> :class:`Arm`."""
    name, _, rest = spec.partition(":")
    if not NAME.match(name):
        raise RecipeError("--arm", f"{spec!r}: an arm needs a name of letters, digits, '_', '.', '-' before ':'",
                          "write e.g. --arm grpodropout:rollout_dropout=grpodropout")
    rest = rest.strip()
    if rest.endswith((".yaml", ".yml")) and "=" not in rest:
        if not Path(rest).is_file():
            raise RecipeError("--arm", f"{name}: no recipe file {rest}", "name an existing recipe file")
        return Arm(name, recipe=rest)
    overrides = []
    for item in shlex.split(rest):
        key, eq, value = item.partition("=")
        key = key.lstrip("-")
        if not eq or not key:
            raise RecipeError("--arm", f"{name}: {item!r} is not key=value",
                              "separate overrides by spaces, each key=value (a recipe field)")
        if key in ("seed", "output_dir"):
            raise RecipeError("--arm", f"{name}: {key} is set by the comparison", f"remove {key}= from the arm")
        overrides.append((key, value))
    return Arm(name, overrides=tuple(overrides))


def plan(recipe: str, arms: list[Arm], seeds: list[int], output_dir: str | Path,
         extra: list[str] | None = None) -> list[Run]:
    """Every arm x seed, seed-major (all arms of a seed finish before the next seed starts, so a comparison stopped
    early still holds complete pairs)."""
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise RecipeError("--arm", f"arm names repeat: {names}", "give each arm its own name")
    if len(arms) < 2:
        raise RecipeError("--arm", "a comparison needs at least two arms", "add --arm NAME[:overrides] for each")
    if not seeds or len(set(seeds)) != len(seeds):
        raise RecipeError("--seeds", f"{seeds}: needs distinct seeds", "e.g. --seeds 0 1 2")
    root = Path(output_dir)
    return [Run(arm, seed, root / arm.name / f"seed-{seed}", recipe, tuple(extra or ()))
            for seed in seeds for arm in arms]


def read_records(run_dir: Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl`` in order ([] when absent), passing over a line a kill cut short."""
    path = run_dir / "metrics.jsonl"
    return run_artifacts.read_records(path) if path.is_file() else []


def finished_training(records: list[dict]) -> bool:
    """The trainer wrote its end-of-training record (``train_runtime``, logged once ``train()`` returns)."""
    return any("train_runtime" in r for r in records)


def state(run: Run, with_eval: bool) -> str:
    """``finished``, ``partial`` or ``pending`` (see the module docstring)."""
    done = finished_training(read_records(run.output_dir))
    if done and (not with_eval or (run.output_dir / EVAL_DIR / "summary.json").is_file()):
        return "finished"
    started = run.output_dir.is_dir() and any(run.output_dir.iterdir())
    return "partial" if started else "pending"


def write_status(run: Run, **status: object) -> None:
    """Record the last attempt of a run in its folder."""
    run.output_dir.mkdir(parents=True, exist_ok=True)
    (run.output_dir / STATUS_FILE).write_text(json.dumps(status, indent=1))


def read_status(run_dir: Path) -> dict:
    """The last attempt's record ({} when none)."""
    path = run_dir / STATUS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}
