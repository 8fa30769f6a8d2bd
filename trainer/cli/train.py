"""Train from a YAML recipe (TRL style: ``--config recipe.yaml`` plus ``--field value`` overrides).

The code of the ``winnow-train`` console script; ``launch/train.py`` (a checkout without installing) runs it too.

    accelerate launch launch/train.py --config configs/demo/smollm2-arithmetic.yaml
    accelerate launch --config_file launch/accelerate/zero3_gpu_4.yaml launch/train.py \\
        --config configs/grpo/qwen3-4b-dapo17k.yaml --vllm_server_base_url http://10.0.0.2:8000
    python launch/train.py --config ... --resume_from_checkpoint true      # latest checkpoint in output_dir
    python launch/train.py --config ... --resume_from_checkpoint auto      # the same if one exists, else fresh
    python launch/train.py --config configs/grpo/qwen3-8b-dapo17k.yaml --dry-run   # preflight, loads nothing
    winnow-train --config RECIPE.yaml                   # installed (pip install winnow-rl): the same, one process
    accelerate launch -m trainer.cli.train --config RECIPE.yaml   # installed, any number of processes

Writes into ``output_dir``: checkpoints, ``recipe.resolved.yaml`` (every field, defaults included, flat: it
is itself a recipe; secrets redacted, trainer/config/redaction.py), ``metrics.jsonl`` and ``metrics.png``. A
folder that already holds a run is refused unless ``--resume_from_checkpoint`` or ``--overwrite_output_dir`` says
what to do with it. Fields:
TaskArguments (trainer/recipe.py), WinnowConfig (trainer/config/core.py, includes all of TRL's GRPOConfig) and
TRL's ModelConfig; ``--help`` lists them by topic.

A mistake in the recipe, its data or its paths is reported before any weights load as one line,
``error: <field>: <what>. Fix: <how>``, with exit status 2; ``--traceback`` (or ``WINNOW_TRACEBACK=1``)
shows the traceback instead.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import yaml

from trainer.config.errors import ConfigError
from trainer.config.redaction import redact_url

logger = logging.getLogger("trainer.cli.train")  # by name: run as __main__ too (python -m trainer.cli.train)

TRACEBACK_FLAG = "--traceback"
DRY_RUN_FLAG = "--dry-run"  # the preflight instead of training (trainer/tools/preflight.py); listed in --help
# The CUDA caching allocator's setting for the trainer: long, varying sequence lengths fragment fixed-size segments
# (trainer/tools/memory_estimate.py counts a fixed 3 GB for it); expandable segments grow in place instead.
ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def set_allocator_conf(argv: list[str], environ: dict | None = None) -> str | None:
    """Put ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` into ``environ`` (default ``os.environ``) before torch
    starts, unless the user set an allocator config (that one, or torch's newer ``PYTORCH_ALLOC_CONF``, which it reads
    first) or the recipe asks for vLLM's sleep mode in the trainer: vLLM's CuMemAllocator asserts that no expandable
    segments are configured. Returns the value set, or None."""
    environ = os.environ if environ is None else environ
    name, value = ALLOC_CONF
    if name in environ or "PYTORCH_ALLOC_CONF" in environ or _sleep_mode_requested(argv):
        return None
    environ[name] = value
    return value


def _sleep_mode_requested(argv: list[str]) -> bool:
    """``vllm_enable_sleep_mode`` true on the command line or, failing that, in the ``--config`` recipe (read with
    yaml alone: torch must not start before the allocator setting). An unreadable recipe counts as no: the real
    parser reports it."""
    flag = _cli_value(argv, "vllm_enable_sleep_mode")
    path = _cli_value(argv, "config")
    if flag is None and path:
        try:
            flag = (yaml.safe_load(Path(path).read_text()) or {}).get("vllm_enable_sleep_mode")
        except (OSError, yaml.YAMLError, AttributeError):
            return False
    return str(flag).strip().lower() in ("true", "1", "yes")


def _cli_value(argv: list[str], name: str) -> str | None:
    """The value of ``--name value`` / ``--name=value`` in ``argv`` ("true" for a bare boolean flag), else None."""
    for i, arg in enumerate(argv):
        if arg == f"--{name}":
            following = argv[i + 1] if i + 1 < len(argv) else None
            return "true" if following is None or following.startswith("--") else following
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def main(argv: list[str] | None = None) -> int:
    """Check the recipe and its inputs, build the trainer, train, save the final model; 2 on a recipe error."""
    # heavy: torch starts with these, and console_main must set the allocator config first (set_allocator_conf)
    from trainer.build import build_trainer, prepare_run
    from trainer.config.recipe_checks import clear_output_dir, resume_requested, resumes_latest
    from trainer.recipe import check_run, parse_recipe, resolved_recipe, save_resolved_recipe
    from trainer.tools import console, wandb_run
    from trainer.tools.model_card import method_text
    from trainer.tools.preflight import main as preflight

    argv = list(sys.argv[1:] if argv is None else argv)
    show_traceback = TRACEBACK_FLAG in argv or os.environ.get("WINNOW_TRACEBACK", "") not in ("", "0")
    argv = [a for a in argv if a != TRACEBACK_FLAG]
    if DRY_RUN_FLAG in argv:  # as console_main: check the launch, load nothing
        return preflight([a for a in argv if a != DRY_RUN_FLAG])
    try:
        task, args, model_args = parse_recipe(argv)
        console.configure_logging(args)  # winnow's INFO lines, held back until every check has passed
        console.quiet_trl_step_warnings()
        check_run(task, args, model_args)
        recipe = resolved_recipe(task, args, model_args)
        # after the recipe is resolved: a re-run of recipe.resolved.yaml elsewhere is named after its own folder
        args.run_name = args.run_name or wandb_run.default_run_name(args.output_dir)
        inputs = prepare_run(task, args, model_args)
        if task.overwrite_output_dir:
            kept = clear_output_dir(args.output_dir)
            if kept:
                logger.info("overwrite_output_dir: kept %s in %s (no run writes them)", ", ".join(kept[:8]),
                            args.output_dir)
        logger.info("training %s on %s with rewards %s, %s; run folder %s", model_args.model_name_or_path,
                    task.dataset_name, ", ".join(getattr(task, "reward_entries", task.reward_funcs)),
                    method_text(args), Path(args.output_dir).resolve())
        trainer = build_trainer(task, args, model_args, inputs)  # the weights load here
    except ConfigError as e:
        console.release_held(show=False)  # the error is its one line alone
        return _one_line(e, show_traceback)
    console.release_held()
    main_process = trainer.accelerator.is_main_process
    recipe_file = Path(args.output_dir) / "recipe.resolved.yaml"
    if main_process:
        save_resolved_recipe(recipe, recipe_file)
    resume = args.resume_from_checkpoint
    if not resume_requested(resume):
        resume = None
    elif resumes_latest(resume):
        resume = True
    try:  # a resume that cannot continue exactly is refused before its checkpoint loads (generation_resume.py)
        with wandb_run.started(args, task.wandb_project, recipe, recipe_file, resume is not None,
                               main_process) as run:
            trainer.train(resume_from_checkpoint=resume)
            trainer.save_model(args.output_dir)
            where = wandb_run.describe(run)
    except ConfigError as e:  # raised through the W&B block, which marks its run failed (exit code 1)
        return _one_line(e, show_traceback)
    if main_process:
        print("\n".join(console.run_summary(args.output_dir, trainer.state.global_step, where)), flush=True)
    return 0


def _one_line(error: Exception, show_traceback: bool) -> int:
    """Print a recipe error as one line on the main process (every process checks the same recipe), any URL in it
    without its user-info (trainer/config/redaction.py); exit status 2."""
    from trainer.config.recipe_checks import is_main_process  # heavy: TRL, kept off this module's import as in main()

    if show_traceback:
        raise error
    if is_main_process():
        print(redact_url(f"error: {' '.join(str(error).split())}"), file=sys.stderr, flush=True)
    return 2


def console_main() -> None:
    """The ``winnow-train`` console script and ``launch/train.py``: ``--dry-run`` runs the preflight (loads nothing),
    anything else trains; exits with main's status."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    argv = sys.argv[1:]
    if DRY_RUN_FLAG in argv:  # preflight: check the launch, load nothing (trainer/tools/preflight.py)
        from trainer.tools.preflight import main as preflight  # heavy: TRL and torch, after the flag is seen

        sys.exit(preflight([a for a in argv if a != DRY_RUN_FLAG]))
    set_allocator_conf(argv)  # before main() imports torch: every rank's trainer process starts here
    sys.exit(main())


if __name__ == "__main__":  # python -m trainer.cli.train, accelerate launch -m trainer.cli.train
    console_main()
