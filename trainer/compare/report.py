"""A comparison's report from the runs' own files: ``metrics.jsonl`` (training curves and the logged prompt digest),
``recipe.resolved.yaml`` (the rollouts per step) and ``eval/summary.json`` (winnow-eval's Mean@k).

Per arm: final and area-under-curve training reward, final eval accuracy, IQM across seeds; per arm against the
baseline: the paired per-seed difference with its bootstrap 95 % interval and the probability of improvement
(trainer/compare/stats.py); the pairing check (every arm of a seed logged the same prompt digests at the same
steps); and one figure, reward against optimizer steps, generated tokens and wall time, every seed faint and the
arm's mean bold.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from trainer.compare import stats
from trainer.compare.plan import EVAL_DIR, Run, finished_training, read_records, read_status
from trainer.pipeline.step_logs import PROMPT_DIGEST

REWARD = "reward"


@dataclass
class RunLog:
    """One run's curves, read back from its folder."""

    run: Run
    steps: np.ndarray
    reward: np.ndarray
    generated_tokens: np.ndarray  # cumulative completion tokens over every process
    wall_s: np.ndarray  # cumulative step time
    digests: dict[int, float] = field(default_factory=dict)
    eval_scores: dict[str, float] = field(default_factory=dict)  # "<benchmark>/<metric>" -> value
    finished: bool = False


def rollouts_per_step(resolved: dict) -> int:
    """Completions trained per optimizer step: per-device batch x accumulation x processes (the recipe's
    ``launch_processes``, one when it names none)."""
    world = int(resolved.get("launch_processes") or 1)
    return int(resolved["per_device_train_batch_size"]) * int(resolved.get("gradient_accumulation_steps") or 1) * world


def read_run(run: Run) -> RunLog | None:
    """The run's curves (None if it logged no training step yet)."""
    every = read_records(run.output_dir)
    records = [r for r in every if isinstance(r.get(REWARD), (int, float))]
    if not records:
        return None
    resolved_path = run.output_dir / "recipe.resolved.yaml"
    resolved = yaml.safe_load(resolved_path.read_text()) if resolved_path.is_file() else {}
    per_step = rollouts_per_step(resolved) if "per_device_train_batch_size" in resolved else 1
    lengths = np.array([float(r.get("completions/mean_length", math.nan)) for r in records])
    log = RunLog(
        run=run,
        steps=np.array([int(r["step"]) for r in records]),
        reward=np.array([float(r[REWARD]) for r in records]),
        generated_tokens=np.cumsum(np.nan_to_num(lengths) * per_step),
        wall_s=np.cumsum([float(r.get("step_time", 0.0)) for r in records]),
        digests={int(r["step"]): float(r[PROMPT_DIGEST]) for r in records if PROMPT_DIGEST in r},
        finished=finished_training(every),
    )
    summary_path = run.output_dir / EVAL_DIR / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        for bench, values in summary["systems"].get(run.arm.name, {}).get("benchmarks", {}).items():
            for metric, value in values.items():
                if metric.startswith("mean@") and isinstance(value, (int, float)):
                    log.eval_scores[f"{bench}/{metric}"] = float(value)
    return log


def read_logs(runs: list[Run]) -> dict[str, RunLog]:
    """Every run that logged a training step, by label (each folder read once: the report and the figure share it)."""
    return {r.label: log for r in runs if (log := read_run(r)) is not None}


def pairing(logs: dict[str, RunLog], seeds: list[int], arms: list[str]) -> tuple[bool, list[str]]:
    """Whether every arm of each seed logged the same prompt digest at every step they share, and one line per seed
    that broke or could not be checked."""
    problems = []
    for seed in seeds:
        present = [logs.get(f"{a}/seed-{seed}") for a in arms]
        present = [p for p in present if p is not None]
        if len(present) < 2:
            continue
        if any(not p.digests for p in present):
            problems.append(f"seed {seed}: a run logged no {PROMPT_DIGEST} (older trainer): pairing not checked")
            continue
        reference = present[0]
        for other in present[1:]:
            shared = sorted(set(reference.digests) & set(other.digests))
            bad = [s for s in shared if reference.digests[s] != other.digests[s]]
            if bad:
                problems.append(f"seed {seed}: {other.run.arm.name} saw other prompts than {reference.run.arm.name} "
                                f"from step {bad[0]} on")
    return not problems, problems


def _fmt(x: float, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def summary_metrics(log: RunLog) -> dict[str, float]:
    """The per-run numbers the report compares: final and AUC reward (over steps), and each eval score."""
    out = {"final reward": stats.final_value(log.reward), "reward AUC": stats.area_under_curve(log.steps, log.reward)}
    out.update({f"eval {k}": v for k, v in sorted(log.eval_scores.items())})
    return out


def build_report(runs: list[Run], logs: dict[str, RunLog], arms: list[str], seeds: list[int], command: str,
                 figure: str | None) -> str:
    """The markdown report of a comparison from its runs' ``logs`` (:func:`read_logs`); the baseline is
    ``arms[0]``."""
    finished = {label for label, log in logs.items() if log.finished}
    lines = ["# Comparison report", "", f"Command: `{command}`", "",
             f"Arms: {', '.join(arms)} (baseline: {arms[0]}); seeds: {', '.join(map(str, seeds))}; "
             f"{len(finished)} of {len(runs)} runs finished.", ""]
    failed = [(r.label, read_status(r.output_dir).get("outcome")) for r in runs]
    failed = [(label, o) for label, o in failed if o and o.startswith("failed")]
    for label, outcome in failed:
        lines.append(f"- {label}: {outcome}")
    ok, problems = pairing(logs, seeds, arms)
    lines += ["", "**Pairing** (same prompts in the same order per seed, from the logged prompt digest): "
              + ("held for every seed." if ok else "NOT held:"), *[f"- {p}" for p in problems], ""]

    per_run = {label: summary_metrics(logs[label]) for label in finished}
    names = sorted({m for v in per_run.values() for m in v}, key=lambda m: (not m.endswith("reward"), m))
    lines += ["## Per arm (mean ± sd over finished seeds; IQM = interquartile mean)", "",
              "| arm | seeds | " + " | ".join(f"{m} (mean ± sd) | {m} IQM" for m in names) + " |",
              "|---|---|" + "---|---|" * len(names)]
    for arm in arms:
        values = {m: np.array([per_run[f"{arm}/seed-{s}"][m] for s in seeds
                               if f"{arm}/seed-{s}" in per_run and m in per_run[f"{arm}/seed-{s}"]]) for m in names}
        n = sum(f"{arm}/seed-{s}" in per_run for s in seeds)
        cells = []
        for m in names:
            v = values[m]
            sd = float(v.std(ddof=1)) if len(v) > 1 else float("nan")
            cells += [f"{_fmt(float(v.mean()) if len(v) else math.nan)} ± {_fmt(sd)}",
                      _fmt(stats.iqm(v) if len(v) else math.nan)]
        lines.append(f"| {arm} | {n} | " + " | ".join(cells) + " |")
    lines += ["", f"## Against {arms[0]}: paired per-seed differences", "",
              "Each seed's difference arm − baseline; mean with its bootstrap 95 % interval (BCa, SciPy), the "
              "probability of improvement P(arm > baseline) over runs (rliable's definition) and the seeds where the "
              "arm is ahead.", "",
              "| arm | metric | pairs | mean diff | 95 % interval | P(improvement) | seeds ahead |",
              "|---|---|---|---|---|---|---|"]
    for arm in arms[1:]:
        for m in names:
            pairs = [(per_run[f"{arm}/seed-{s}"][m], per_run[f"{arms[0]}/seed-{s}"][m]) for s in seeds
                     if m in per_run.get(f"{arm}/seed-{s}", {}) and m in per_run.get(f"{arms[0]}/seed-{s}", {})]
            if not pairs:
                continue
            a, b = np.array(pairs).T
            ci = stats.paired_difference(a, b)
            lines.append(f"| {arm} | {m} | {len(pairs)} | {_fmt(ci.estimate)} | [{_fmt(ci.low)}, {_fmt(ci.high)}] | "
                         f"{_fmt(stats.probability_of_improvement(a, b), 2)} | {int((a > b).sum())} of {len(pairs)} |")
    lines += ["", "Final reward: mean over the last quarter of logged steps; reward AUC: the reward curve's mean "
              "height over optimizer steps (trapezoids); eval: winnow-eval's Mean@k of the final model. With 3 seeds "
              "an interval is rough (BCa under-covers at few seeds) and P(improvement) moves in steps of 1/9.", ""]
    if figure:
        lines += [f"![reward per optimizer step, generated token and wall second]({figure})", ""]
    return "\n".join(lines)


def plot(logs: dict[str, RunLog], arms: list[str], png: Path, window: int = 5) -> Path:
    """Reward against optimizer steps, generated tokens and wall time: each seed faint, the arm's mean over seeds
    bold (at each step's mean x). Curves are a running mean over ``window`` steps (per-step rewards of a few
    prompts are noisy)."""
    import matplotlib  # optional: matplotlib, the `demo` extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: matplotlib, the `demo` extra (after its backend is set)

    def smooth(y: np.ndarray) -> np.ndarray:
        w = max(1, min(window, len(y)))
        return np.convolve(y, np.ones(w) / w, mode="valid") if len(y) >= w else y

    axes_x = (("steps", "optimizer step"), ("generated_tokens", "generated tokens"), ("wall_s", "wall time (s)"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(arms):
        arm_logs = [log for log in logs.values() if log.run.arm.name == arm]
        if not arm_logs:
            continue
        n = min(len(log.reward) for log in arm_logs)
        for ax, (attr, label) in zip(axes, axes_x):
            for log in arm_logs:
                x = np.asarray(getattr(log, attr), dtype=float)
                y = smooth(log.reward)
                ax.plot(x[len(x) - len(y):], y, color=colors[i % len(colors)], alpha=0.25, linewidth=1)
            x_mean = np.mean([np.asarray(getattr(log, attr), dtype=float)[:n] for log in arm_logs], axis=0)
            y_mean = smooth(np.mean([log.reward[:n] for log in arm_logs], axis=0))
            ax.plot(x_mean[len(x_mean) - len(y_mean):], y_mean, color=colors[i % len(colors)], linewidth=2.5,
                    label=f"{arm} (n={len(arm_logs)})")
            ax.set_xlabel(label)
            ax.set_ylabel(f"reward (running mean of {window})")
    axes[0].legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
