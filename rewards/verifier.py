"""Math-Verify equivalence checks with a hard wall-clock limit, callable from any thread.

Math-Verify's own timeouts use ``signal.alarm``: they only work in the main thread, and cannot interrupt a
long C-level operation (sympy evaluating ``9^{9^{9^9}}`` never returns). So parse+verify runs in small
persistent worker processes with Math-Verify's timeouts disabled; the parent waits on a pipe with a
deadline and SIGKILLs a worker that overruns, then starts a replacement at once (its ~0.3 s start overlaps
whatever the caller does next, instead of being added to the next call).

Workers are plain ``subprocess`` children running this file under ``python -I`` rather than
``multiprocessing`` children: fork is unsafe in the threaded trainer, and spawn/forkserver re-import the
trainer's ``__main__`` script in the child (a script without a main guard would start training again).
``-I`` also keeps ``rewards/`` off the child's ``sys.path`` so no module of ``rewards/`` can shadow a stdlib one.

This file imports only the standard library: the parent never loads sympy; Math-Verify is imported in the
worker only. Protocol (ASCII JSON lines): parent sends ``[[gold, pred], ...]``; the worker answers one line
per item (true / false / null = unparsable gold) as it finishes it, so every item gets its own deadline.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

DEFAULT_TIMEOUT = 2.0
MAX_PRED_CHARS = 2000  # an extracted answer longer than this is garbage: scored False without parsing
MAX_GOLD_CHARS = 10000  # golds are trusted but still bounded (longer ones count as unparsable -> None)
STARTUP_TIMEOUT = 60.0  # worker start (imports) is bounded separately from the per-item limit
MAX_WORKERS = int(os.environ.get("WINNOW_VERIFIER_WORKERS", "2"))  # concurrent callers beyond this queue
_WORKER_MEMORY = 4 << 30  # address-space cap per worker: a runaway big-int power fails fast instead of OOM
_TIMEOUT, _EOF = object(), object()


def verify_answer(pred_answer: str | None, gold: str | None, timeout: float = DEFAULT_TIMEOUT) -> bool | None:
    """Whether the extracted answer ``pred_answer`` equals ``gold`` per Math-Verify (gold parsed first).

    ``pred_answer`` is the answer only (e.g. boxed content), not a whole completion. Returns None when
    the check ran out of ``timeout`` seconds of wall-clock time, or when the gold is empty/unparsable;
    False for a missing, oversized (> MAX_PRED_CHARS) or unparsable prediction. Safe from any thread.
    """
    return verify_batch([(pred_answer, gold)], timeout)[0]


def verify_batch(pairs, timeout: float = DEFAULT_TIMEOUT) -> list[bool | None]:
    """:func:`verify_answer` for many ``(pred_answer, gold)`` pairs, in one round trip to one worker.

    ``timeout`` bounds each item's parse+verify; an item that overruns gets None, its worker is killed
    and replaced, and the rest of the batch continues on the replacement. A batch of n items thus takes
    at most n * timeout (plus worker start-up, bounded by STARTUP_TIMEOUT).
    """
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    results: list[bool | None] = [None] * len(pairs)
    todo: list[tuple[int, str, str]] = []
    for i, (pred, gold) in enumerate(pairs):
        gold = "" if gold is None else str(gold).strip()
        pred = "" if pred is None else str(pred).strip()
        if not gold or len(gold) > MAX_GOLD_CHARS:
            results[i] = None
        elif not pred or len(pred) > MAX_PRED_CHARS:
            results[i] = False  # bounded before any parsing: a huge completion costs nothing
        else:
            todo.append((i, gold, pred))
    if todo:
        for (i, _, _), r in zip(todo, _pool().run([(g, p) for _, g, p in todo], timeout)):
            results[i] = r
    return results


def warmup() -> None:
    """Start one worker and wait until it is ready, so the first real call doesn't pay start-up."""
    pool = _pool()
    pool.release(pool.acquire())


# ----------------------------------------------------------------------------------------- parent side


class _Worker:
    """One worker process; used by a single thread at a time (the pool hands it out)."""

    def __init__(self) -> None:
        cmd = [sys.executable, "-I", os.path.abspath(__file__), "--worker", str(os.getpid())]
        self.proc = _popen(cmd)
        self.buf, self.ready = b"", False
        _LIVE.add(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def read_line(self, deadline: float):
        """The next line from the worker, or _TIMEOUT / _EOF. poll(), not select(): fds may be > 1024."""
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                return _TIMEOUT
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return _EOF
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def ensure_ready(self) -> None:
        if not self.ready:
            line = self.read_line(time.monotonic() + STARTUP_TIMEOUT)
            if line != b"ready":
                self.close()
                raise RuntimeError(f"math verifier worker failed to start (got {line!r}); see its stderr")
            self.ready = True

    def close(self) -> None:
        _LIVE.discard(self)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()  # reap: no zombies
        with contextlib.suppress(OSError):  # flushing into a dead worker's stdin: nothing to save
            self.proc.stdin.close()
        self.proc.stdout.close()


class _Pool:
    """Up to ``size`` workers shared by all threads; a thread holds one worker for a whole batch."""

    def __init__(self, size: int) -> None:
        self.size, self.count, self.idle = max(1, size), 0, []
        self.cv = threading.Condition()

    def acquire(self) -> _Worker:
        with self.cv:
            while not self.idle and self.count >= self.size:
                self.cv.wait()
            worker = self.idle.pop() if self.idle else None
            self.count += worker is None  # a new slot; the worker itself is started outside the lock
        try:
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.close()
                worker = _Worker()
            worker.ensure_ready()
            return worker
        except BaseException:
            self.release(None)
            raise

    def release(self, worker: _Worker | None) -> None:
        with self.cv:
            if worker is not None and worker.alive():
                self.idle.append(worker)
            else:
                self.count -= 1
            self.cv.notify()

    def run(self, items: list[tuple[str, str]], timeout: float) -> list[bool | None]:
        out: list[bool | None] = []
        worker, finished = self.acquire(), False
        try:
            while len(out) < len(items):
                worker.ensure_ready()
                try:
                    payload = json.dumps(items[len(out):]) + "\n"  # ensure_ascii: lone surrogates survive
                    worker.proc.stdin.write(payload.encode("ascii"))
                    worker.proc.stdin.flush()
                except OSError:  # worker died between calls: replace it and resend
                    worker.close()
                    worker = _Worker()
                    continue
                while len(out) < len(items):
                    line = worker.read_line(time.monotonic() + timeout)
                    if line is _TIMEOUT or line is _EOF:
                        # Overran (or crashed): this item scores None; kill and replace the worker now.
                        out.append(None)
                        worker.close()
                        worker = _Worker()
                        break
                    out.append(json.loads(line))
            finished = True
            return out
        finally:
            if not finished:  # interrupted mid-batch: the worker may still send stale lines, never reuse it
                worker.close()
            self.release(worker)


_LIVE: set[_Worker] = set()
_STATE: dict = {}
_STATE_LOCK = threading.Lock()


def _singleton(name: str, factory):
    with _STATE_LOCK:
        if name not in _STATE:
            _STATE[name] = factory()
        return _STATE[name]


def _pool() -> _Pool:
    return _singleton("pool", lambda: _Pool(MAX_WORKERS))


def _popen(cmd: list[str]) -> subprocess.Popen:
    # Workers are started from one long-lived executor thread: PR_SET_PDEATHSIG fires when the *thread* that
    # forked a worker exits, so forking from a short-lived caller thread would kill a worker others use.
    spawner = _singleton("spawner", lambda: ThreadPoolExecutor(1, thread_name_prefix="math-verifier-spawn"))
    return spawner.submit(subprocess.Popen, cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE).result()


def _after_fork_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) must not share the parent's workers, locks or spawner thread.
    global _STATE_LOCK, _LIVE
    _STATE_LOCK, _LIVE = threading.Lock(), set()
    _STATE.clear()


def _shutdown() -> None:
    for worker in list(_LIVE):
        worker.close()


def _worker_pids() -> list[int]:
    """Pids of the live workers (for tests)."""
    return [w.proc.pid for w in list(_LIVE)]


atexit.register(_shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ----------------------------------------------------------------------------------------- worker side


def _as_boxed(s: str) -> str:
    """Answer text -> ``\\boxed{...}``, the anchor Math-Verify extracts first; math delimiters dropped."""
    s = s.replace("~", " ").replace("\\ ", " ").strip()  # TeX spaces: a trailing "10~" would not parse
    for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) > len(a) + len(b) and s.startswith(a) and s.endswith(b):
            s = s[len(a) : -len(b)].strip()
    s = s.rstrip(".").strip()  # "Answer: 5." -- a sentence's full stop is not part of the answer
    return s if ("\\boxed" in s or "\\fbox" in s) else "\\boxed{" + s + "}"


def _worker_main(parent_pid: int) -> None:
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints from libraries go to stderr and can never corrupt the protocol
    try:  # die with the parent even while stuck in a C call that a Python-level check could not interrupt
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY, _WORKER_MEMORY))
    except Exception:  # noqa: BLE001 - not Linux: rely on atexit and stdin EOF
        pass
    if os.getppid() != parent_pid:  # parent died before prctl took effect
        return
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" warnings: we time out here
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold_cfg = [LatexExtractionConfig(), ExprExtractionConfig()]
    # open-r1 accuracy-reward settings for predictions (boxed first, no nits), except malformed_operators on:
    # "\frac12" and "\sqrt2" are valid TeX that models write. equations=False: deprecated in
    # latex2sympy2-extended 1.11, the parser handles "x = 5" itself.
    pred_norm = NormalizationConfig(basic_latex=True, units=True, malformed_operators=True, nits=False,
                                    boxed="all", equations=False)  # fmt: skip
    pred_cfg = [LatexExtractionConfig(boxed_match_priority=0, normalization_config=pred_norm),
                ExprExtractionConfig()]  # fmt: skip

    def check(gold: str, pred: str) -> bool | None:
        try:
            g = parse(_as_boxed(gold), gold_cfg, extraction_mode="first_match", parsing_timeout=None)
            if not g:
                return None
            p = parse(_as_boxed(pred), pred_cfg, extraction_mode="first_match", parsing_timeout=None)
            return bool(p) and bool(verify(g, p, timeout_seconds=None))
        except Exception:  # noqa: BLE001 - garbage in (RecursionError, MemoryError, ...): not equivalent
            return False

    os.write(out_fd, b"ready\n")
    for line in sys.stdin.buffer:
        for gold, pred in json.loads(line):
            os.write(out_fd, (json.dumps(check(gold, pred)) + "\n").encode())


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker_main(int(sys.argv[2]))
