"""Reports from :func:`trainer.eval.metrics.summarize` output and from training runs' ``metrics.jsonl``.

- :func:`markdown_table`: the papers' Table 1 layout -- one row per system, one column per benchmark
  (accuracy metrics in %), a last "Avg." column (unweighted mean over the shown benchmarks), and the best
  value of each column in bold.
- :func:`plot_benchmarks`: grouped bar chart, one group per benchmark, one bar per system.
- :func:`plot_training_curves`: one subplot per logged key, one line per run.

Plots use matplotlib's headless Agg backend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainer.tools.run_artifacts import read_records

MISSING = "–"


def _is_accuracy(metric: str) -> bool:
    return metric == "mean" or metric.startswith("mean@") or metric.startswith("pass@")


def _cell(summary: Mapping[str, Any], system: str, bench: str, metric: str) -> float | None:
    value = summary["systems"][system]["benchmarks"].get(bench, {}).get(metric)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def markdown_table(
    summary: Mapping[str, Any],
    benchmarks: Sequence[str] | None = None,
    metric: str = "mean",
    digits: int = 2,
    percent: bool | None = None,
) -> str:
    """Markdown table: rows = systems, columns = ``benchmarks`` (default: all, in summary order) + "Avg.".

    ``metric`` is any per-benchmark key of the summary ("mean", "mean@32", "pass@1", "entropy", ...).
    Accuracy metrics ("mean*", "pass@*") are shown in % unless ``percent`` says otherwise. Avg. is the
    unweighted mean of the row's shown cells, "–" if any is missing. The highest value of each column
    (after rounding to ``digits``; ties all bold) is bold.
    """
    benchmarks = list(summary["benchmarks"] if benchmarks is None else benchmarks)
    systems = list(summary["systems"])
    scale = 100.0 if (percent if percent is not None else _is_accuracy(metric)) else 1.0

    rows: list[list[float | None]] = []
    for system in systems:
        cells = [_cell(summary, system, b, metric) for b in benchmarks]
        shown = [c for c in cells if c is not None]
        avg = math.fsum(shown) / len(shown) if shown and len(shown) == len(cells) else None
        rows.append([None if c is None else round(c * scale, digits) for c in cells + [avg]])

    best = []
    for j in range(len(benchmarks) + 1):
        col = [r[j] for r in rows if r[j] is not None]
        best.append(max(col) if col else None)

    def fmt(value: float | None, j: int) -> str:
        if value is None:
            return MISSING
        text = f"{value:.{digits}f}"
        return f"**{text}**" if value == best[j] else text

    lines = [
        "| System | " + " | ".join([*benchmarks, "Avg."]) + " |",
        "|---|" + "---:|" * (len(benchmarks) + 1),
    ]
    for system, row in zip(systems, rows):
        lines.append(f"| {system} | " + " | ".join(fmt(v, j) for j, v in enumerate(row)) + " |")
    return "\n".join(lines) + "\n"


def plot_benchmarks(
    summary: Mapping[str, Any], path: str | Path, metric: str = "mean", benchmarks: Sequence[str] | None = None
) -> Path:
    """Grouped bar chart of ``metric`` (in % for accuracy metrics): one group per benchmark, one bar per system."""
    import matplotlib  # optional: matplotlib, the `demo` extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: matplotlib, the `demo` extra (after its backend is set)

    benchmarks = list(summary["benchmarks"] if benchmarks is None else benchmarks)
    systems = list(summary["systems"])
    scale = 100.0 if _is_accuracy(metric) else 1.0
    x = np.arange(len(benchmarks))
    width = 0.8 / max(len(systems), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 + len(benchmarks) * (0.4 + 0.25 * len(systems))), 4))
    for i, system in enumerate(systems):
        values = [_cell(summary, system, b, metric) for b in benchmarks]
        heights = [np.nan if v is None else v * scale for v in values]
        ax.bar(x - 0.4 + width * (i + 0.5), heights, width, label=system)
    ax.set_xticks(x)
    crowded = len(benchmarks) > 5
    ax.set_xticklabels(benchmarks, rotation=30 if crowded else 0, ha="right" if crowded else "center")
    ax.set_ylabel(f"{metric} (%)" if scale == 100.0 else metric)
    ax.grid(axis="y", alpha=0.3)
    if systems:
        ax.legend(fontsize="small")
    return _save(fig, path)


def read_run_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All records of ``<run_dir>/metrics.jsonl`` that carry a ``step`` (FileNotFoundError if absent)."""
    return [r for r in read_records(Path(run_dir) / "metrics.jsonl") if "step" in r]


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    steps, values = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            steps.append(float(r["step"]))
            values.append(float(v))
    return steps, values


def plot_training_curves(
    run_dirs: Sequence[str | Path],
    path: str | Path,
    keys: Sequence[str] = ("reward", "entropy", "stages/kept_ratio"),
) -> Path:
    """One subplot per key, one line per run (labelled by the run folder's name), from each ``metrics.jsonl``.

    Rows without a key (or with a non-finite / non-numeric value) are skipped for that key; a key no run
    logged gets an empty subplot saying so.
    """
    import matplotlib  # optional: matplotlib, the `demo` extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: matplotlib, the `demo` extra (after its backend is set)

    keys = list(keys)
    if not keys:
        raise ValueError("plot_training_curves needs at least one key")
    runs = [(Path(d).name or str(d), read_run_metrics(d)) for d in run_dirs]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        drawn = False
        for label, rows in runs:
            steps, values = _series(rows, key)
            if steps:
                ax.plot(steps, values, marker=".", linewidth=1, label=label)
                drawn = True
        if drawn:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    """Lay out, write the PNG (creating its folder) and free the figure."""
    import matplotlib.pyplot as plt  # optional: matplotlib, the `demo` extra

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
