"""What a training launch shows on its console (trainer/cli/train.py calls these in ``main``, never at import).

- :func:`configure_logging`: winnow-rl's own loggers (``trainer.*``, ``rewards.*``, ``envs.*``) write to stderr at
  the level ``log_level`` gives (``log_level_replica`` on the other processes, as transformers reads them:
  ``TrainingArguments.get_process_log_level``). ``passive``, the default, leaves transformers' verbosity alone; for
  winnow it means INFO on the main process and WARNING on the others. Without a handler their INFO lines (what a
  dataset loader kept, the vLLM server coming up, the W&B run) were dropped. Until :func:`release_held` the records
  are held back: a recipe mistake is still the one line ``error: ... Fix: ...`` on stderr (trainer/cli/train.py), and
  the lines of the checks that passed follow once they all have.
- :func:`quiet_trl_step_warnings`: drops the FutureWarnings TRL 1.16 causes at every step (below).
- :func:`run_summary`: the closing lines: where the model, metrics and recipe of the run are.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from transformers.training_args import trainer_log_levels

WINNOW_LOGGERS = ("trainer", "rewards", "envs")  # the packages of pyproject.toml
LOG_FORMAT = "[%(levelname)s|%(name)s] %(message)s"

# TRL 1.16 reads and toggles gradient checkpointing through transformers 5's deprecated aliases at every step:
# trl/models/utils.py:136-154 (``_unwrap_model_for_generation``, each generation) and trl/models/utils.py:407-414
# (``disable_gradient_checkpointing``, entered by trl/trainer/grpo_trainer.py:2634 for each batch's old log-probs),
# each call a FutureWarning from transformers/modeling_utils.py:3206/3291/3314 that no recipe can act on.
TRL_STEP_WARNINGS = (r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` "
                     r"is deprecated and will be removed in v6")


class _CurrentStderr(logging.StreamHandler):
    """A handler on the ``sys.stderr`` of the moment (a redirected or captured stream), not the one at setup."""

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it
        pass


def winnow_log_level(args: Any) -> int:
    """The level of winnow's loggers on this process: ``log_level`` on the process that logs (rank 0, or local rank 0
    with ``log_on_each_node``), ``log_level_replica`` elsewhere; ``passive`` there is INFO, WARNING elsewhere.
    Read from the launcher's environment: no process group exists yet when main() calls it."""
    rank = os.environ.get("LOCAL_RANK" if getattr(args, "log_on_each_node", True) else "RANK", "0")
    logs = int(rank or 0) == 0
    level = trainer_log_levels[args.log_level if logs else args.log_level_replica]
    if level == -1:  # passive
        return logging.INFO if logs else logging.WARNING
    return level


def configure_logging(args: Any, hold: bool = True) -> int:
    """A stderr handler on each of winnow's top loggers at :func:`winnow_log_level` (replacing the one an earlier
    call added, so calling it again only changes the level); with ``hold``, records wait for :func:`release_held`.
    Returns the level. Records still propagate, so a handler the user put on the root logger sees them too."""
    level = winnow_log_level(args)
    console = _CurrentStderr()
    console.setFormatter(logging.Formatter(LOG_FORMAT))
    _install(logging.handlers.MemoryHandler(capacity=1 << 16, flushLevel=logging.CRITICAL + 1) if hold else console)
    _held["console"] = console
    for name in WINNOW_LOGGERS:
        logging.getLogger(name).setLevel(level)
    return level


_held: dict[str, logging.Handler] = {}  # the console handler that held records go to
_installed: list[logging.Handler] = []  # the handler on winnow's loggers now (one at a time)


def _install(handler: logging.Handler) -> None:
    for name in WINNOW_LOGGERS:
        logger = logging.getLogger(name)
        for old in _installed:
            logger.removeHandler(old)
        logger.addHandler(handler)
    _installed[:] = [handler]


def release_held(show: bool = True) -> None:
    """Write the records held since :func:`configure_logging` (drop them with ``show=False``: a recipe error is
    reported as its one line alone); later records go straight to stderr."""
    console = _held.pop("console", None)
    if console is None:
        return
    for memory in [h for h in _installed if isinstance(h, logging.handlers.MemoryHandler)]:
        if show:
            memory.setTarget(console)
            memory.flush()
        memory.buffer.clear()
    _install(console)


def quiet_trl_step_warnings() -> None:
    """Ignore the per-step FutureWarnings of :data:`TRL_STEP_WARNINGS`, only those and only from
    transformers.modeling_utils (``filterwarnings`` replaces an identical filter: calling it again adds nothing)."""
    warnings.filterwarnings("ignore", message=TRL_STEP_WARNINGS, category=FutureWarning,
                            module=r"transformers\.modeling_utils")


def run_summary(output_dir: str | Path, steps: int | None = None, wandb_run: str | None = None) -> list[str]:
    """The closing lines of a run: where its model, metrics, plot and recipe are (only paths that exist) and its W&B
    run, if any."""
    out = Path(output_dir).expanduser().resolve()
    adapter = (out / "adapter_config.json").is_file()
    rows = []
    if adapter or (out / "config.json").is_file():
        rows.append(("LoRA adapter" if adapter else "model", f"{out}"))
    for label, name in (("metrics", "metrics.jsonl"), ("plot", "metrics.png"), ("recipe", "recipe.resolved.yaml"),
                        ("model card", "README.md")):
        if (out / name).is_file():
            rows.append((label, str(out / name)))
    if wandb_run:
        rows.append(("W&B run", wandb_run))
    head = f"Training done{f' ({steps} steps)' if steps is not None else ''}; run folder {out}"
    return [head, *(f"  {label:<13} {where}" for label, where in rows)]
