"""The W&B run of a training launch with ``report_to: wandb`` (trainer/cli/train.py starts it around ``train``).

transformers' ``WandbCallback`` would start a run in project ``huggingface`` named ``run_name``, logging
TrainingArguments and the model config; a run that is already active it adopts instead and only adds that config
("run may have been created manually": ``WandbCallback.setup``, transformers/integrations/integration_utils.py).
:func:`started` starts that run first, on the main process, with:

- project: the recipe's ``wandb_project``, else ``WANDB_PROJECT``, else ``winnow-rl``;
- name: ``run_name`` (train.py defaults it to the output folder's name);
- config: the whole resolved recipe, flat as in recipe.resolved.yaml (dataset, rewards, model, LoRA, launch, stages;
  secrets redacted, trainer/config/redaction.py); WandbCallback then adds TrainingArguments' dict (redacted too:
  ``WinnowConfig.to_dict``) and the model's config;
- files: a copy of recipe.resolved.yaml;
- id: kept in ``<output_dir>/wandb_run_id``. A resume continues the W&B run of that id (``resume="allow"``); a fresh
  start (an empty folder, or one ``--overwrite_output_dir`` emptied) gets a new id. ``WANDB_RUN_ID`` in the
  environment overrides both, as wandb documents.

The run is finished when the block ends (exit code 1 when it raised). A run the caller started before (a notebook's
``wandb.init``) is left to the caller: the recipe is added to its config, nothing else changes.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import wandb

from trainer.config.redaction import redact_argv

logger = logging.getLogger(__name__)

DEFAULT_PROJECT = "winnow-rl"
RUN_ID_FILE = "wandb_run_id"  # in output_dir: the W&B run a resume continues


def reports_to_wandb(args: Any) -> bool:
    """Whether ``args.report_to`` (a list after TrainingArguments' checks) includes W&B."""
    report_to = args.report_to or []
    report_to = [report_to] if isinstance(report_to, str) else report_to
    return "wandb" in report_to or "all" in report_to


def project_name(field_value: str | None) -> str:
    """The recipe's ``wandb_project``, else ``WANDB_PROJECT``, else :data:`DEFAULT_PROJECT`."""
    return field_value or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT


def default_run_name(output_dir: str) -> str:
    """The name of a run whose recipe sets no ``run_name``: its output folder's name."""
    return Path(output_dir).expanduser().resolve().name


def run_id(output_dir: str, resumed: bool) -> str | None:
    """``WANDB_RUN_ID`` if set; else, on a resume, the id kept in ``output_dir`` (when there is one); else None:
    wandb makes a new one."""
    if os.environ.get("WANDB_RUN_ID"):
        return os.environ["WANDB_RUN_ID"]
    kept = Path(output_dir) / RUN_ID_FILE
    if resumed and kept.is_file() and kept.read_text().strip():
        return kept.read_text().strip()
    return None


@contextmanager
def started(args: Any, project: str | None, recipe: dict[str, Any], recipe_file: str | Path, resumed: bool,
            main_process: bool) -> Iterator[Any]:
    """Within the block, the run's W&B run is active (yields it; None when the recipe does not report to W&B or
    this is not the main process). See the module doc."""
    if not main_process or not reports_to_wandb(args):
        yield None
        return

    if wandb.run is not None:  # the caller's own run: WandbCallback logs into it, and so does the recipe
        wandb.run.config.update(recipe, allow_val_change=True)
        yield wandb.run
        return
    ident = run_id(args.output_dir, resumed)
    # W&B records the command line (its settings read sys.argv while the run lives): the redacted one, so a
    # --hub_token or a password in --vllm_server_base_url never reaches run-*.wandb (trainer/config/redaction.py)
    argv = list(sys.argv)
    sys.argv[1:] = redact_argv(argv[1:])
    try:
        run = wandb.init(project=project_name(project), name=args.run_name or default_run_name(args.output_dir),
                         id=ident, resume="allow" if resumed else None, config=recipe)
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / RUN_ID_FILE).write_text(run.id + "\n")
        if Path(recipe_file).is_file():  # a copy in the run's own folder: uploaded whatever happens to output_dir
            copy = Path(run.dir) / Path(recipe_file).name
            shutil.copyfile(recipe_file, copy)
            run.save(str(copy), base_path=run.dir, policy="now")
        logger.info("W&B run %s (id %s) in project %s%s", run.name, run.id, run.project,
                    f": {run.url}" if run.url else f", offline in {Path(run.dir).parent}")
        try:
            yield run
        except BaseException:
            run.finish(exit_code=1)
            raise
        run.finish()
    finally:
        sys.argv[:] = argv


def describe(run: Any) -> str | None:
    """Where a finished run's data is: its URL, or for an offline run its folder and the command that uploads it."""
    if run is None:
        return None
    if run.url:
        return run.url
    folder = Path(run.dir).parent
    return f"{folder} (offline: `wandb sync {folder}` uploads it)"
