"""Plots and tables from finished runs, without re-running anything.

    python launch/plot.py --runs outputs/demo/smollm2-arithmetic outputs/demo/smollm2-arithmetic-snr \\
        --out outputs/plots/curves.png                      # training curves from each run's metrics.jsonl
    python launch/plot.py --eval outputs/eval/cpu-champ     # table.md + benchmarks.png from summary.json

Training curves default to reward, entropy and the kept-rollout ratio (``--keys`` to choose others, e.g.
``snr/kept_ratio collapse/mi_estimate``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from trainer.eval.report import markdown_table, plot_benchmarks, plot_training_curves  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    """Draw what the flags ask for."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="*", type=Path, default=[], help="training output folders (hold metrics.jsonl)")
    p.add_argument("--keys", nargs="*", default=["reward", "entropy", "stages/kept_ratio"], help="metrics to plot")
    p.add_argument("--out", type=Path, default=Path("curves.png"), help="PNG for the training curves")
    p.add_argument("--eval", type=Path, default=None, help="an evaluation output_dir (holds summary.json)")
    cli = p.parse_args(argv)
    if not cli.runs and cli.eval is None:
        p.error("nothing to do: give --runs and/or --eval")
    if cli.runs:
        cli.out.parent.mkdir(parents=True, exist_ok=True)
        plot_training_curves(cli.runs, cli.out, keys=tuple(cli.keys))
        print(f"training curves: {cli.out}")
    if cli.eval is not None:
        summary = json.loads((cli.eval / "summary.json").read_text())
        table = markdown_table(summary)
        (cli.eval / "table.md").write_text(table)
        plot_benchmarks(summary, cli.eval / "benchmarks.png")
        print(table)


if __name__ == "__main__":
    main()
