"""A pytest plugin that measures what the suite costs: wall time and resident memory, per test and in all.

Registered by tests/conftest.py. Two parts:
- in the process that runs tests (the only one without xdist, each worker with it), one JSON line per test phase
  (setup / call / teardown): its duration and end time, this process's RSS before and after, its own peak RSS
  during the phase, and the peak RSS of this process plus its children (the launched processes, the vLLM server);
- in the controlling process (the only one without xdist, the xdist controller with it), a sampler of the whole
  process tree: the peak RSS of the largest pytest process, the peak of the summed RSS of pytest and its workers,
  and of those plus everything they started.

With ``WINNOW_PROBE_DIR`` set, the lines go to ``<dir>/tests.<worker>.jsonl`` and one summary line per pytest run
to ``<dir>/summary.jsonl``; tests/probe_report.py turns them into the per-file table of docs/testing.md. Without it
only the summary line is printed at the end. Samples are 0.25 s apart: a spike shorter than that can be missed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import psutil

SAMPLE_S = 0.25


def _rss(proc: psutil.Process) -> int:
    try:
        return proc.memory_info().rss
    except psutil.Error:  # ended mid-walk
        return 0


def _is_xdist_worker(proc: psutil.Process) -> bool:
    """execnet starts each xdist worker as ``python -u -c "import sys;exec(eval(sys.stdin.readline()))"``."""
    try:
        return any("sys.stdin.readline()" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def _tree_rss(proc: psutil.Process) -> tuple[int, int, int]:
    """(summed RSS of ``proc`` and all its descendants, summed RSS of the pytest processes alone: ``proc`` and its
    xdist workers, without what they launched, and the largest of those pytest processes)."""
    try:
        children = proc.children(recursive=True)
        workers = [p for p in proc.children() if _is_xdist_worker(p)]
    except psutil.Error:
        return 0, 0, 0
    own = _rss(proc)
    pytest_rss = [own] + [_rss(p) for p in workers]
    return own + sum(_rss(p) for p in children), sum(pytest_rss), max(pytest_rss)


class _Sampler(threading.Thread):
    """Keeps the peak summed RSS of this process tree since the last :meth:`reset`."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="resource-probe")
        self.proc = psutil.Process()
        self.peak = self.pytest_peak = self.process_peak = self.window_peak = self.own_window_peak = 0
        self.stopped = threading.Event()

    def sample(self) -> int:
        """Take one sample; returns the tree's summed RSS."""
        tree, pytest_only, largest = _tree_rss(self.proc)
        self.own_window_peak = max(self.own_window_peak, _rss(self.proc))
        self.peak = max(self.peak, tree)
        self.pytest_peak = max(self.pytest_peak, pytest_only)
        self.process_peak = max(self.process_peak, largest)
        self.window_peak = max(self.window_peak, tree)
        return tree

    def run(self) -> None:
        while not self.stopped.wait(SAMPLE_S):
            self.sample()

    def reset_window(self) -> None:
        self.window_peak = self.own_window_peak = 0
        self.sample()


class ResourceProbe:
    """The plugin object (see the module docstring)."""

    def __init__(self, config) -> None:
        self.worker = config.workerinput["workerid"] if hasattr(config, "workerinput") else None
        self.summary = None
        out = os.environ.get("WINNOW_PROBE_DIR")
        self.out = Path(out) if out else None
        self.sampler = _Sampler()
        self.sampler.start()
        self.started = time.time()
        self.lines = None
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            self.lines = open(self.out / f"tests.{self.worker or 'main'}.jsonl", "a")
        self.rss_before = 0
        self.runs_tests = False  # an xdist controller only receives its workers' reports: it writes no lines

    def _phase_start(self) -> None:
        self.runs_tests = True
        self.rss_before = self.sampler.proc.memory_info().rss
        self.sampler.reset_window()

    def pytest_runtest_setup(self, item):  # noqa: ARG002
        self._phase_start()

    def pytest_runtest_call(self, item):  # noqa: ARG002
        self._phase_start()

    def pytest_runtest_teardown(self, item, nextitem):  # noqa: ARG002
        self._phase_start()

    def pytest_runtest_logreport(self, report) -> None:
        if self.lines is None or not self.runs_tests:
            return
        rss = self.sampler.proc.memory_info().rss
        self.lines.write(json.dumps({
            "nodeid": report.nodeid, "phase": report.when, "outcome": report.outcome,
            "duration_s": round(report.duration, 3), "rss_before": self.rss_before, "rss_after": rss,
            "tree_peak": max(self.sampler.window_peak, rss), "own_peak": max(self.sampler.own_window_peak, rss),
            "end": round(time.time(), 2), "worker": self.worker or "main",
        }) + "\n")
        self.lines.flush()

    def pytest_sessionfinish(self, session) -> None:
        self.sampler.stopped.set()
        self.sampler.sample()
        if self.lines is not None:
            self.lines.close()
        if self.worker is not None:
            return
        summary = {"wall_s": round(time.time() - self.started, 1), "tree_peak_rss": self.sampler.peak,
                   "pytest_peak_rss": self.sampler.pytest_peak, "process_peak_rss": self.sampler.process_peak,
                   "tests": session.testscollected,
                   "markexpr": session.config.option.markexpr, "exitstatus": int(session.exitstatus)}
        if self.out is not None:
            with open(self.out / "summary.jsonl", "a") as fh:  # one line per pytest run (make test runs two)
                fh.write(json.dumps(summary) + "\n")
        self.summary = summary

    def pytest_terminal_summary(self, terminalreporter) -> None:
        summary = self.summary
        if summary:
            terminalreporter.write_line(
                f"resource probe: pytest wall {summary['wall_s'] / 60:.1f} min, peak RSS of one pytest process "
                f"{summary['process_peak_rss'] / 2**30:.2f} GiB, of the pytest processes together "
                f"{summary['pytest_peak_rss'] / 2**30:.2f} GiB, of everything they started with them "
                f"{summary['tree_peak_rss'] / 2**30:.2f} GiB")
