"""Per-file table of what the suite costs, from the resource probe's lines (tests/resource_probe.py).

    python tests/probe_report.py logs/probe [--top 25] [--by file|tier|test] [--summary-only]

Per file (or tier): tests, summed wall time of every phase, the setup share (fixtures: launches, servers, model
loads), the peak RSS of the test process (the worker) during any of its phases, alone and with its children, and
the RSS its tests left behind in the worker (last phase's RSS after minus the first phase's RSS before, in the
order they ran).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _load(probe_dir: Path) -> list[dict]:
    rows = []
    for path in sorted(probe_dir.glob("tests.*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def _key(row: dict, by: str) -> str:
    file = row["nodeid"].split("::")[0]
    if by == "file":
        return file
    if by == "test":
        return row["nodeid"]
    from conftest import tier_of

    return tier_of(Path(__file__).resolve().parents[1] / file)


def table(rows: list[dict], by: str) -> list[dict]:
    """One entry per key: tests, wall, setup, peak (with children), own_peak (the test process alone), retained
    (bytes), sorted by wall time."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[_key(row, by)].append(row)
    out = []
    for key, rs in groups.items():
        retained = 0
        for worker in {r["worker"] for r in rs}:
            mine = [r for r in rs if r["worker"] == worker]
            retained += mine[-1]["rss_after"] - mine[0]["rss_before"]
        out.append({
            "key": key, "tests": len({r["nodeid"] for r in rs if r["phase"] == "call"}),
            "wall_s": sum(r["duration_s"] for r in rs),
            "setup_s": sum(r["duration_s"] for r in rs if r["phase"] == "setup"),
            "peak": max(r["tree_peak"] for r in rs), "own_peak": max(r.get("own_peak", 0) for r in rs),
            "retained": retained,
        })
    return sorted(out, key=lambda e: -e["wall_s"])


def summaries(probe_dir: Path) -> list[dict]:
    """The summary line of each pytest run that wrote into ``probe_dir``."""
    path = probe_dir / "summary.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def print_summary(probe_dir: Path) -> None:
    """One line per pytest run, then the suite: summed wall time, and the highest peak of any run."""
    runs = summaries(probe_dir)
    for s in runs:
        print(f"pytest -m {s['markexpr']!r}: {s['tests']} tests, {s['wall_s'] / 60:.1f} min, peak RSS "
              f"{s.get('process_peak_rss', 0) / 2**30:.2f} GiB in one pytest process, "
              f"{s['pytest_peak_rss'] / 2**30:.2f} GiB in the pytest processes together, "
              f"{s['tree_peak_rss'] / 2**30:.2f} GiB with the processes they started")
    if runs:
        print(f"suite: {sum(s['tests'] for s in runs)} tests, pytest {sum(s['wall_s'] for s in runs) / 60:.1f} min, "
              f"peak RSS {max(s.get('process_peak_rss', 0) for s in runs) / 2**30:.2f} GiB in one pytest process, "
              f"{max(s['pytest_peak_rss'] for s in runs) / 2**30:.2f} GiB in the pytest processes together, "
              f"{max(s['tree_peak_rss'] for s in runs) / 2**30:.2f} GiB with the processes they started")


def main(argv: list[str] | None = None) -> None:
    """Print the markdown table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe_dir", type=Path)
    ap.add_argument("--by", choices=["file", "tier", "test"], default="file")
    ap.add_argument("--top", type=int, default=0, help="only the N most expensive rows (0: all)")
    ap.add_argument("--summary-only", action="store_true", help="only the per-run and whole-suite summary")
    ap.add_argument("--wall-seconds", action="store_true", help="only the summed wall time of the pytest runs, in s")
    args = ap.parse_args(argv)
    if args.wall_seconds:
        print(round(sum(s["wall_s"] for s in summaries(args.probe_dir))))
        return
    if args.summary_only:
        print_summary(args.probe_dir)
        return
    entries = table(_load(args.probe_dir), args.by)
    total = sum(e["wall_s"] for e in entries)
    print(f"| {args.by} | tests | wall s | setup s | peak RSS GiB, test process | with its children | retained MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for e in entries[: args.top or None]:
        print(f"| {e['key']} | {e['tests']} | {e['wall_s']:.0f} | {e['setup_s']:.0f} | {e['own_peak'] / 2**30:.2f} "
              f"| {e['peak'] / 2**30:.2f} | {e['retained'] / 2**20:.0f} |")
    print(f"| all ({len(entries)}) | {sum(e['tests'] for e in entries)} | {total:.0f} | "
          f"{sum(e['setup_s'] for e in entries):.0f} | {max((e['own_peak'] for e in entries), default=0) / 2**30:.2f} "
          f"| {max((e['peak'] for e in entries), default=0) / 2**30:.2f} | |")
    print()
    print_summary(args.probe_dir)


if __name__ == "__main__":
    main()
