"""What a training run leaves in its output folder besides checkpoints: a metrics log and a plot.

- ``metrics.jsonl``: one JSON object per ``Trainer.log`` call (the same values W&B receives), written by
  the main process only, flushed every line so a killed run keeps everything logged so far.
- ``metrics.png``: reward and token entropy per optimizer step, drawn at the end of training (and
  redrawable with :func:`plot_metrics` from any ``metrics.jsonl``).

Also here: the learning verdict of ``python -m trainer.tools.run_artifacts OUTPUT_DIR`` and the filter that keeps a
resume of a tied-embedding model from printing transformers' "missing keys" alarm for the tied copy.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import math
import os
import weakref
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from trainer.tools import optional

logger = logging.getLogger(__name__)

PLOTTED = (("reward", "mean reward"), ("entropy", "token entropy (nats)"))


class MetricsFileCallback(TrainerCallback):
    """Append every log record to ``<output_dir>/metrics.jsonl``; draw ``metrics.png`` when training ends."""

    def __init__(self, output_dir: str | Path, plot: bool = True):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.plot = plot

    def on_train_begin(self, args, state, control, **kwargs):
        """On resume, drop the records a killed run wrote after the checkpoint it resumes from: those steps are
        trained (and logged) again, so the file keeps one record per step."""
        if not state.is_world_process_zero or state.global_step == 0 or not self.path.exists():
            return
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        kept = [line for line in lines if json.loads(line).get("step", 0) <= state.global_step]
        if len(kept) != len(lines):
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, self.path)

    def on_log(self, args, state, control, logs: dict[str, Any] | None = None, **kwargs):
        """Write one line per log call (main process only)."""
        if not state.is_world_process_zero or not logs:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"step": state.global_step, **{k: _jsonable(v) for k, v in logs.items()}}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        """Draw the plot next to the log (main process only)."""
        if state.is_world_process_zero and self.plot and self.path.exists():
            if not optional.installed("matplotlib"):  # a core install trains; the plot is the `demo` extra's
                logger.warning("metrics.png not drawn: %s", optional.missing_message("matplotlib", "plot: true"))
                return
            plot_metrics(self.path, self.path.with_suffix(".png"))


class _TiedKeysFilter(logging.Filter):
    """Drop transformers' "There were missing keys in the checkpoint model loaded: [...]" when every missing key
    is a parameter tied to another one: safetensors stores a tied tensor once (``lm_head.weight`` shares the
    embedding's storage), so the load restores it through its twin and nothing is missing.

    The filter lives on a module-level logger, so it holds its trainer weakly: a strong reference kept every trainer
    (and its model, optimizer and buffers) alive for the life of the process, one per ``build_trainer`` call."""

    def __init__(self, trainer: Any):
        super().__init__()
        self.trainer = weakref.ref(trainer)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        trainer = self.trainer()
        if trainer is None or not message.startswith("There were missing keys in the checkpoint model loaded:"):
            return True
        return not set(_listed_keys(message)) <= tied_parameter_names(trainer.model)


def _listed_keys(message: str) -> list[str]:
    try:
        return list(ast.literal_eval(message.split(":", 1)[1].strip().rstrip(".")))
    except (ValueError, SyntaxError):
        return []


def tied_parameter_names(model: Any) -> set[str]:
    """Names of parameters that share their storage with another parameter of ``model``."""
    by_storage: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_storage.setdefault(param.data_ptr(), []).append(name)
    return {name for names in by_storage.values() if len(names) > 1 for name in names}


def quiet_tied_weight_warning(trainer: Any) -> None:
    """Install :class:`_TiedKeysFilter` on the Trainer's logger for ``trainer`` (dropping the filters of trainers
    that no longer exist, so building many trainers in one process does not stack them)."""
    logger = logging.getLogger("transformers.trainer")
    for old in [f for f in logger.filters if isinstance(f, _TiedKeysFilter) and f.trainer() is None]:
        logger.removeFilter(old)
    logger.addFilter(_TiedKeysFilter(trainer))


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl``, in order (FileNotFoundError if absent). A line that does not parse -- the
    last one of a run killed while writing it -- is passed over: the one reader of the file for every caller (the
    plot, the eval report's curves, winnow-compare)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Training-step records of a ``metrics.jsonl`` (those that carry a ``reward``), in order."""
    return [r for r in read_records(path) if "reward" in r]


def plot_metrics(jsonl: str | Path, png: str | Path) -> Path:
    """Plot reward and entropy per step from ``jsonl`` into ``png`` (matplotlib, headless)."""
    import matplotlib  # optional: matplotlib, the `demo` extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: matplotlib, the `demo` extra (after its backend is set)

    rows = read_metrics(jsonl)
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(10, 3.6))
    for ax, (key, label) in zip(axes, PLOTTED):
        points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, marker=".", linewidth=1)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(Path(jsonl).parent.name)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return Path(png)


def quarter_comparison(rows: list[dict[str, Any]], key: str = "reward") -> dict[str, float]:
    """Mean of ``key`` over the first and last quarter of steps, and the standard error of their
    difference (Welch: sqrt(s1^2/n1 + s2^2/n2)) -- the demo's learning criterion."""
    values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    q = max(len(values) // 4, 1)
    first, last = values[:q], values[-q:]

    def mean_var(xs: list[float]) -> tuple[float, float]:
        m = sum(xs) / len(xs)
        v = sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
        return m, v

    (m1, v1), (m2, v2) = mean_var(first), mean_var(last)
    se = math.sqrt(v1 / len(first) + v2 / len(last))
    return {"first_quarter": m1, "last_quarter": m2, "difference": m2 - m1, "stderr": se, "steps_per_quarter": q}


def main(argv: list[str] | None = None) -> None:
    """``python -m trainer.tools.run_artifacts OUTPUT_DIR``: redraw the plot and print the quarter comparison."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("output_dir", type=Path, help="a training run's output folder (holds metrics.jsonl)")
    cli = parser.parse_args(argv)
    jsonl = cli.output_dir / "metrics.jsonl"
    rows = read_metrics(jsonl)
    png = plot_metrics(jsonl, jsonl.with_suffix(".png"))
    times = sorted(float(r["step_time"]) for r in rows if isinstance(r.get("step_time"), (int, float)))
    print(
        f"{len(rows)} steps; median step time {times[len(times) // 2] if times else float('nan'):.1f} s; plot: {png}"
    )
    print(learning_verdict(rows))


MIN_STEPS_PER_QUARTER = 2  # a standard error needs two values on each side


def learning_verdict(rows: list[dict[str, Any]]) -> str:
    """The demo's learning check as one line: last quarter of rewards vs the first, against 2 x stderr; with
    fewer than two steps per quarter there is no standard error, so no verdict."""
    n = sum(1 for r in rows if isinstance(r.get("reward"), (int, float)))
    if n < 4 * MIN_STEPS_PER_QUARTER:
        return f"reward: {n} steps, too few steps to judge (need at least {4 * MIN_STEPS_PER_QUARTER})"
    q = quarter_comparison(rows)
    verdict = "learned" if q["difference"] > 2 * q["stderr"] else "no significant change"
    return (f"reward: first quarter {q['first_quarter']:.3f}, last quarter {q['last_quarter']:.3f}, "
            f"difference {q['difference']:+.3f} (2 x stderr = {2 * q['stderr']:.3f}): {verdict}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


if __name__ == "__main__":
    main()
