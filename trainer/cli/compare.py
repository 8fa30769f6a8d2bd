"""Compare methods over paired seeds (``winnow-compare``): every arm x seed of a base recipe, then a report.

    winnow-compare --config configs/demo/smollm2-arithmetic.yaml --seeds 0 1 2 \\
        --arm grpo --arm "grpodropout:rollout_dropout=grpodropout" --arm own:path/to/recipe.yaml \\
        --output_dir outputs/compare/demo -- --max_steps 16
    winnow-compare ... --slurm            # one Slurm array job instead (launch/slurm/train_multinode.slurm)
    winnow-compare ... --report_only      # the report from what has run so far

Each run trains into ``<output_dir>/<arm>/seed-<s>`` (flags after ``--`` go to every run); a finished run is not
run again, a started one resumes, a failed one is reported and the rest go on, so the same command continues an
interrupted comparison. The first arm is the baseline. ``--eval_config`` evaluates every final model with that
``winnow-eval`` preset. The report (``report.md``, ``report.png``; trainer/compare/report.py) is written when the
runs end. Exit status 0 when every run finished, 1 when one failed, 2 on a mistake in the command.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from trainer.compare import report, runner
from trainer.compare.plan import parse_arm, plan, state
from trainer.config.errors import RecipeError
from trainer.tools import optional


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The comparison's flags, and the trainer flags after ``--``."""
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="winnow-compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the base recipe every arm starts from")
    p.add_argument("--arm", action="append", required=True, metavar="NAME[:key=value ...|:recipe.yaml]",
                   help="an arm (repeat; the first is the baseline)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds, shared by every arm (pairing)")
    p.add_argument("--output_dir", required=True, help="the comparison's folder: one subfolder per arm and seed")
    p.add_argument("--eval_config", default=None, help="a winnow-eval preset run on every final model")
    p.add_argument("--launcher", default=None,
                   help="what runs trainer.cli.train (default: this Python), e.g. "
                        "'accelerate launch --config_file launch/accelerate/cpu.yaml'")
    p.add_argument("--slurm", action="store_true", help="submit the runs left as one Slurm array job")
    p.add_argument("--sbatch_args", default="", help="more sbatch flags with --slurm (shell syntax)")
    p.add_argument("--dry_run", action="store_true", help="print the plan (and the sbatch line), run nothing")
    p.add_argument("--report_only", action="store_true", help="write the report from what has run, run nothing")
    p.add_argument("--report", default=None, help="where the report goes (default: <output_dir>/report.md)")
    return p.parse_args(argv), extra


def main(argv: list[str] | None = None) -> int:
    """Plan, run what is left, report. Returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parse(argv)
    if not Path(args.config).is_file():
        raise RecipeError("--config", f"no recipe file {args.config}", "name an existing recipe file")
    arms = [parse_arm(spec) for spec in args.arm]
    runs = plan(args.config, arms, args.seeds, args.output_dir, extra)
    out = Path(args.output_dir)
    if args.dry_run:
        for r in runs:
            print(f"{r.label:32s} {state(r, args.eval_config is not None):9s} {shlex.join(r.train_args(False))}")
    outcomes: dict[str, str] = {}
    if args.slurm:
        command = runner.submit_slurm(runs, out, shlex.split(args.sbatch_args), dry_run=args.dry_run)
        print(("+ " + shlex.join(command)) if command else "winnow-compare: every run has finished")
        if not args.dry_run:
            return 0  # the report: the same command with --report_only once the array has run
    elif not (args.dry_run or args.report_only):
        outcomes = runner.run_local(runs, args.eval_config, shlex.split(args.launcher) if args.launcher else None)
    if args.dry_run:
        return 0
    report_path = Path(args.report) if args.report else out / "report.md"
    names = [a.name for a in arms]
    logs = report.read_logs(runs)
    figure: Path | None = report_path.with_suffix(".png")
    if optional.installed("matplotlib"):  # a core install compares; the figure is the `demo` extra's
        report.plot(logs, names, figure)
    else:
        print(f"winnow-compare: no figure: {optional.missing_message('matplotlib', 'the comparison figure')}")
        figure = None
    command = "winnow-compare " + shlex.join(argv)
    report_path.write_text(report.build_report(runs, logs, names, args.seeds, command, figure and figure.name))
    failed = [label for label, outcome in outcomes.items() if outcome.startswith("failed")]
    print(f"winnow-compare: report {report_path}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def console_main() -> None:
    """``winnow-compare``: exit 2 with one line on a mistake in the command."""
    try:
        sys.exit(main())
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    console_main()
