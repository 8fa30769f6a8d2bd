"""Math-Verify equivalence checks with a hard wall-clock limit, callable from any thread.

Math-Verify's own timeouts use ``signal.alarm``: they only work in the main thread, and cannot interrupt a
long C-level operation (sympy evaluating ``9^{9^{9^9}}`` never returns). So parse+verify runs in small
persistent worker processes with Math-Verify's timeouts disabled; the parent waits on their pipes with
deadlines and SIGKILLs a worker that overruns, then starts a replacement at once (its ~0.3 s start overlaps
the rest of the batch, or whatever the caller does next).

Limits, cheapest first:

- before any worker sees it, a prediction longer than MAX_PRED_CHARS, nested deeper than MAX_PRED_DEPTH, with
  more than MAX_PRED_BRACKETS brackets, or building an enormous number (``9^{9^{9^9}}``, ``100000000!``:
  rewards/magnitude.py) scores False; a gold over the (looser) MAX_GOLD_* bounds scores None. Scans in the
  parent: a flood of ``(((...)))`` costs microseconds, not a time-out;
- each item has ``timeout`` seconds of wall-clock time in a worker (over it: None, worker killed and replaced);
- the whole call has ``batch_timeout`` seconds (default :func:`batch_deadline`) from the moment it is made, waits
  for a busy or restarting worker included, or ends at the caller's ``deadline`` (a reward that calls several
  times keeps one clock): items not answered by then score None and the call returns. Only the pool's first
  start-up in a process is not charged to the call that meets it.

One batch is spread over the pool: the calling thread drives up to MAX_WORKERS workers from one ``poll()`` loop
(no helper threads) and hands the items out one at a time as workers free up. A slow item holds up one worker,
not the batch; a worker with nothing left to do goes back to the pool at once for other callers.

Workers are plain ``subprocess`` children running this file under ``python -I`` rather than
``multiprocessing`` children: fork is unsafe in the threaded trainer, and spawn/forkserver re-import the
trainer's ``__main__`` script in the child (a script without a main guard would start training again).
``-I`` also keeps ``rewards/`` off the child's ``sys.path`` so no module of ``rewards/`` can shadow a stdlib one.
A worker parses model output, so it gets a minimal environment (an allowlist, :data:`_ENV_ALLOW`): none of the
trainer's tokens, keys or passwords.

This file imports only the standard library (and, in the parent, rewards/magnitude.py, which does too): the parent
never loads sympy; Math-Verify is imported in the worker only. Protocol (ASCII JSON lines): the parent sends
``[[gold, pred]]``, one item a line; the worker answers one line per item (true / false / null = unparsable gold), in
order. :func:`grade_batch` sends ``[[gold, completion, grader]]`` instead: another trainer's accuracy reward (TRL's
``accuracy_reward``, open-r1's ``accuracy``: :data:`GRADERS`) with its own Math-Verify settings on the whole
completion, under the same hard limits; its answer is true / false / "no_gold" (that reward could not parse the
gold).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

if __package__:  # the parent (rewards.verifier); a worker runs this file as a script and needs no pre-filter
    from .magnitude import too_big

DEFAULT_TIMEOUT = 2.0
MAX_PRED_CHARS = 2000  # an extracted answer longer than this is garbage: scored False without parsing
# Bracket bounds of a prediction, checked before parsing; ( [ { count, so \left( \right) and \{ \} do too. Real
# answers nest a few levels (\left(\frac{\sqrt{2+\sqrt{3}}}{2}\right)^{2} is 4 deep) and use well under 100
# brackets (a 6x6 matrix of fractions: 74). The parser's time grows steeply with depth (bare braces on a 2-core
# box: 10 deep 1.3 s, 14 deep 5 s, 20 deep never within 5 s), so deeper than 20 can never be scored in time,
# while degenerate output (a repetition loop of "(") nests hundreds deep. Slow answers within the bounds are cut
# by the per-item and batch deadlines.
MAX_PRED_DEPTH = 20
MAX_PRED_BRACKETS = 200
MAX_GOLD_CHARS = 10000  # golds are trusted but still bounded (longer ones count as unparsable -> None)
MAX_GOLD_DEPTH, MAX_GOLD_BRACKETS = 40, 1000  # likewise, twice / five times the prediction bounds
STARTUP_TIMEOUT = 60.0  # worker start (imports) is bounded separately from the per-item limit
MAX_WORKERS = int(os.environ.get("WINNOW_VERIFIER_WORKERS", "2"))  # workers one batch (or all callers) share
# Default batch deadline (batch_deadline): this many whole per-item limits of spare, plus this share of the limit
# per item and worker. Ordinary answers take ~30 ms (1/60 of the default limit), so only a batch full of
# sympy-hostile answers that pass the bracket bounds meets the deadline.
BATCH_SPARE_LIMITS = 2
BATCH_ITEM_SHARE = 0.25
_WORKER_MEMORY = 4 << 30  # address-space cap per worker: a runaway big-int power fails fast instead of OOM
# The worker's whole environment: an allowlist, so no secret (WANDB_API_KEY, HF_TOKEN, AWS_*, ...) reaches the
# process that parses model output, including ones nobody thought of. -I ignores PYTHON* anyway and the venv is
# found from sys.executable. Kept: PATH, locale and TMPDIR (process essentials); LD_LIBRARY_PATH (an interpreter
# from an HPC module or a relocated build may find libpython only through it); SYSTEMROOT (Python on Windows
# cannot start without it); sympy's speed knobs (ground types, cache); GLIBC_TUNABLES (the allocator policy set
# for the whole process tree, e.g. the Makefile's TEST_MALLOC; the suite has always run workers under it).
# Left out: OMP/MKL/OPENBLAS thread counts (the worker loads no BLAS or OpenMP library), HOME (nothing in the
# worker reads it; -I disables the user site directory).
_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "LD_LIBRARY_PATH", "SYSTEMROOT", "GLIBC_TUNABLES",
              "SYMPY_GROUND_TYPES", "SYMPY_USE_CACHE", "SYMPY_CACHE_SIZE")
_TIMEOUT, _EOF = object(), object()


def verify_answer(pred_answer: str | None, gold: str | None, timeout: float = DEFAULT_TIMEOUT) -> bool | None:
    """Whether the extracted answer ``pred_answer`` equals ``gold`` per Math-Verify (gold parsed first).

    ``pred_answer`` is the answer only (e.g. boxed content), not a whole completion. Returns None when
    the check ran out of ``timeout`` seconds of wall-clock time, or when the gold is empty/unparsable/over the
    gold bounds; False for a missing, oversized (MAX_PRED_CHARS), over-nested (MAX_PRED_DEPTH,
    MAX_PRED_BRACKETS) or unparsable prediction. Safe from any thread.
    """
    return verify_batch([(pred_answer, gold)], timeout)[0]


def verify_batch(pairs, timeout: float = DEFAULT_TIMEOUT, batch_timeout: float | None = None,
                 deadline: float | None = None) -> list[bool | None]:
    """:func:`verify_answer` for many ``(pred_answer, gold)`` pairs, spread over the worker pool.

    ``timeout`` bounds each item's parse+verify: an item that overruns gets None, its worker is killed and
    replaced, and the rest of the batch goes on. ``batch_timeout`` bounds the whole call (default
    :func:`batch_deadline` of the items that pass the bounds) from the moment it is made, waits for a worker
    (other callers' batches, a replacement still starting) included; ``deadline`` (a ``time.monotonic()``
    instant, instead of ``batch_timeout``) ends it at the caller's clock. Items not answered by then get None;
    the call returns within its time plus a few ms per worker killed (and, once per process, the pool's first
    start-up, at most STARTUP_TIMEOUT).
    """
    called = time.monotonic()
    _check_limits(timeout, batch_timeout)
    results: list[bool | None] = [None] * len(pairs)
    todo: list[tuple[int, str, str]] = []
    for i, (pred, gold) in enumerate(pairs):
        gold = "" if gold is None else str(gold).strip()
        pred = "" if pred is None else str(pred).strip()
        if not gold or len(gold) > MAX_GOLD_CHARS or _over_nested(gold, MAX_GOLD_DEPTH, MAX_GOLD_BRACKETS):
            results[i] = None
        elif (not pred or len(pred) > MAX_PRED_CHARS or _over_nested(pred, MAX_PRED_DEPTH, MAX_PRED_BRACKETS)
              or too_big(pred)):
            results[i] = False  # bounded before any parsing: a huge, flooded or number-bomb answer costs nothing
        else:
            todo.append((i, gold, pred))
    if todo:
        pool = _pool()
        end = _end(called, len(todo), timeout, batch_timeout, deadline, pool.size)
        for (i, _, _), r in zip(todo, pool.run([(g, p) for _, g, p in todo], timeout, end)):
            results[i] = r
    return results


def _check_limits(timeout: float, batch_timeout: float | None) -> None:
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if batch_timeout is not None and not batch_timeout > 0:
        raise ValueError(f"batch_timeout must be a positive number of seconds or None, got {batch_timeout!r}")


def _end(called: float, n_items: int, timeout: float, batch_timeout: float | None, deadline: float | None,
         workers: int) -> float:
    """The ``time.monotonic()`` instant a call made at ``called`` ends (verify_batch's docstring)."""
    if deadline is not None:
        return deadline
    return called + (batch_deadline(n_items, timeout, workers) if batch_timeout is None else batch_timeout)


# Other trainers' accuracy rewards, run in the worker with their own Math-Verify settings (see _worker_main):
# "trl": trl.rewards.accuracy_reward (TRL 1.16, trl/rewards/accuracy_rewards.py); "open_r1": open-r1's accuracy_reward
# (huggingface/open-r1@bd581c7e73bbd0b63b6605fc1ed4b51d231fa597:src/open_r1/rewards.py:11-50).
GRADERS = ("trl", "open_r1")
NO_GOLD = "no_gold"


def grade_batch(pairs, grader: str, timeout: float = DEFAULT_TIMEOUT, batch_timeout: float | None = None,
                deadline: float | None = None) -> list[bool | str | None]:
    """Another trainer's accuracy check of whole completions: ``(completion_text, gold)`` pairs graded as ``grader``
    (one of :data:`GRADERS`) grades them, each item under the hard ``timeout`` of :func:`verify_batch` (and the
    batch under ``batch_timeout``). True / False; :data:`NO_GOLD` when that reward cannot parse the gold; None when
    the item ran out of time. The prediction bounds of :func:`verify_batch` do not apply (the item is a whole
    completion, extracted in the worker as that trainer does); the gold bounds give :data:`NO_GOLD`. The call's
    clock is :func:`verify_batch`'s."""
    called = time.monotonic()
    if grader not in GRADERS:
        raise ValueError(f"grader must be one of {GRADERS}, got {grader!r}")
    _check_limits(timeout, batch_timeout)
    results: list[bool | str | None] = [None] * len(pairs)
    todo: list[tuple[int, str, str]] = []
    for i, (pred, gold) in enumerate(pairs):
        gold = "" if gold is None else str(gold)
        if len(gold) > MAX_GOLD_CHARS or _over_nested(gold, MAX_GOLD_DEPTH, MAX_GOLD_BRACKETS):
            results[i] = NO_GOLD
        else:
            todo.append((i, gold, "" if pred is None else str(pred)))
    if todo:
        pool = _pool()
        end = _end(called, len(todo), timeout, batch_timeout, deadline, pool.size)
        for (i, _, _), r in zip(todo, pool.run([(g, p, grader) for _, g, p in todo], timeout, end)):
            results[i] = r
    return results


def batch_deadline(n_items: int, timeout: float = DEFAULT_TIMEOUT, workers: int = MAX_WORKERS) -> float:
    """The default ``batch_timeout`` of :func:`verify_batch` for ``n_items`` sent to workers: ``timeout * (
    BATCH_SPARE_LIMITS + BATCH_ITEM_SHARE * ceil(n_items / workers))``, e.g. 6 s for 8 items at the default 2 s
    limit and 2 workers, 20 s for 64 (each item alone may still take its whole limit; the batch may not)."""
    per_worker = -(-max(0, n_items) // max(1, workers))
    return timeout * (BATCH_SPARE_LIMITS + BATCH_ITEM_SHARE * per_worker)


def warmup() -> None:
    """Start one worker and wait until it is ready, so the first real call doesn't pay start-up."""
    pool = _pool()
    pool.release(pool.acquire())


def _over_nested(s: str, max_depth: int, max_brackets: int) -> bool:
    """Whether ``s`` has more than ``max_brackets`` opening brackets ( [ { or nests them deeper than ``max_depth``
    (any mix counts: "(0,1]" is one level). Linear; unbalanced closers are ignored."""
    count = s.count("(") + s.count("[") + s.count("{")
    if count > max_brackets:
        return True
    if count <= max_depth:  # cannot nest deeper than it has brackets: skip the scan (the common case)
        return False
    depth = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            if depth > max_depth:
                return True
        elif ch in ")]}" and depth:
            depth -= 1
    return False


def _worker_env() -> dict[str, str]:
    return {k: os.environ[k] for k in _ENV_ALLOW if k in os.environ}


# ----------------------------------------------------------------------------------------- parent side


class _Worker:
    """One worker process; used by a single thread at a time (the pool hands it out)."""

    def __init__(self) -> None:
        cmd = [sys.executable, "-I", os.path.abspath(__file__), "--worker", str(os.getpid())]
        self.proc = _popen(cmd, _worker_env())
        self.t0 = time.monotonic()  # start-up is due by t0 + STARTUP_TIMEOUT
        self.buf, self.ready = b"", False
        self.item: int | None = None  # index of the item it is working on (in the caller's batch)
        self.since = 0.0  # when it began on that item
        _LIVE.add(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def read_line(self, deadline: float):
        """The next line from the worker, or _TIMEOUT / _EOF. poll(), not select(): fds may be > 1024."""
        poller = select.poll()
        poller.register(self.proc.stdout.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                return _TIMEOUT
            if not self.fill():
                return _EOF
        return self.next_line()

    def fill(self) -> bool:
        """Read what the pipe holds (call when poll() said so); False at EOF."""
        chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
        self.buf += chunk
        return bool(chunk)

    def next_line(self) -> bytes | None:
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def check_ready(self, line) -> None:
        if line != b"ready":
            self.close()
            raise RuntimeError(f"math verifier worker failed to start (got {line!r}); see its stderr")
        self.ready = True

    def ensure_ready(self) -> None:
        if not self.ready:
            self.check_ready(self.read_line(self.t0 + STARTUP_TIMEOUT))

    def send(self, items: list[tuple[str, str]], i: int) -> None:
        """Start the worker on ``items[i]``. OSError: the worker is gone."""
        payload = json.dumps([items[i]]) + "\n"  # ensure_ascii: lone surrogates survive
        self.proc.stdin.write(payload.encode("ascii"))
        self.proc.stdin.flush()
        self.item, self.since = i, time.monotonic()

    def close(self) -> None:
        _LIVE.discard(self)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()  # reap: no zombies
        with contextlib.suppress(OSError):  # flushing into a dead worker's stdin: nothing to save
            self.proc.stdin.close()
        self.proc.stdout.close()


class _Pool:
    """Up to ``size`` workers shared by all threads; a batch takes one or more of them for as long as it has
    work for them (:meth:`run`)."""

    def __init__(self, size: int) -> None:
        self.size, self.count, self.idle = max(1, size), 0, []
        self.cv = threading.Condition()
        self.started = 0  # items a worker began on (restarts after a kill included): what cost worker time
        self.warm = False  # a worker of this pool has been ready once

    def _take(self, block: bool, until: float | None = None) -> _Worker | None:
        """An idle worker, else a new one in a free slot (both possibly still starting); None if none is free
        and not ``block``, or none came free by ``until`` (a ``time.monotonic()`` instant)."""
        with self.cv:
            while block and not self.idle and self.count >= self.size:
                left = None if until is None else until - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.cv.wait(left)
            if not self.idle and self.count >= self.size:
                return None
            worker = self.idle.pop() if self.idle else None
            self.count += worker is None  # a new slot; the worker itself is started outside the lock
        try:
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.close()
                worker = _Worker()
            return worker
        except BaseException:
            self.release(None)
            raise

    def acquire(self) -> _Worker:
        """A ready worker; waits while all are busy, and for start-up."""
        worker = self._take(block=True)
        try:
            worker.ensure_ready()
            self.warm = True
            return worker
        except BaseException:
            self.release(None)
            raise

    def release(self, worker: _Worker | None) -> None:
        with self.cv:
            if worker is not None and worker.alive():
                worker.item = None
                self.idle.append(worker)
            else:
                self.count -= 1
            self.cv.notify()

    def close(self) -> None:
        """Stop the idle workers (a private pool in tests; the shared one is stopped at exit)."""
        with self.cv:
            idle, self.idle = self.idle, []
            self.count -= len(idle)
        for worker in idle:
            worker.close()

    def run(self, items: list[tuple[str, str]], timeout: float, end: float) -> list[bool | None]:
        """Results for ``items`` ((gold, pred) pairs) from up to ``size`` workers at once, by ``end`` (a
        ``time.monotonic()`` instant; module doc)."""
        out: list[bool | None] = [None] * len(items)
        pending = deque(range(len(items)))
        want = min(self.size, len(items))
        # One item per worker at a time: an item queued behind a slow one in the same pipe could wait a whole
        # limit while another worker idles. The round trip per item costs ~0.1 ms (an item ~30 ms).
        if not self.warm:  # the pool's first start-up in this process (imports): paid once, not by this call
            waited = time.monotonic()
            lanes = [self.acquire()]  # sets warm
            end += time.monotonic() - waited
        else:  # waiting for a worker (other batches, a replacement still starting) is on the call's clock
            first = self._take(block=True, until=end)
            if first is None:
                return out
            lanes = [first]
        finished = False
        try:
            while pending or any(w.item is not None for w in lanes):
                if time.monotonic() >= end:
                    break  # the rest keeps None; workers still busy are killed and replaced below
                while pending and len(lanes) < want and (extra := self._take(block=False)) is not None:
                    lanes.append(extra)  # more workers as they come free (another batch ends, a slot opens)
                for k, worker in enumerate(lanes):
                    if worker.ready and worker.item is None and pending:
                        i = pending.popleft()
                        try:
                            worker.send(items, i)
                        except OSError:  # died while idle (e.g. killed from outside): replace it, resend the item
                            pending.appendleft(i)
                            worker.close()
                            lanes[k] = _Worker()
                            continue
                        self._count_started()
                for worker in [w for w in lanes if w.item is None and not pending]:
                    lanes.remove(worker)  # nothing left for it: back to the pool for other callers now
                    self.release(worker)
                if not lanes:
                    break
                wake = min([end] + [w.since + timeout for w in lanes if w.item is not None]
                           + [w.t0 + STARTUP_TIMEOUT for w in lanes if not w.ready])
                poller = select.poll()
                for worker in lanes:
                    poller.register(worker.proc.stdout.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
                readable = {fd for fd, _ in poller.poll(max(0.0, wake - time.monotonic()) * 1000)}
                now = time.monotonic()
                for k, worker in enumerate(lanes):
                    alive = worker.fill() if worker.proc.stdout.fileno() in readable else True
                    while (line := worker.next_line()) is not None:
                        if not worker.ready:
                            worker.check_ready(line)
                        elif worker.item is not None:
                            out[worker.item], worker.item = json.loads(line), None
                    if not alive and not worker.ready:
                        worker.check_ready(_EOF)  # raises: a worker that cannot start is an install problem
                    elif not worker.ready and now >= worker.t0 + STARTUP_TIMEOUT:
                        worker.check_ready(_TIMEOUT)  # raises
                    elif not alive or (worker.item is not None and now >= worker.since + timeout):
                        # Overran its limit (or crashed): the item keeps None; kill the worker and start its
                        # replacement now, so the start overlaps the rest of the batch.
                        worker.close()
                        lanes[k] = _Worker()
            finished = True
            return out
        finally:
            for worker in lanes:
                if worker.item is not None:  # batch deadline, or interrupted: a stale answer may follow, never reuse
                    worker.close()
                    if finished:
                        with contextlib.suppress(OSError):  # no replacement now: the slot is freed instead
                            worker = _Worker()
                self.release(worker)

    def _count_started(self) -> None:
        with self.cv:
            self.started += 1


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


def _popen(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    # Workers are started from one long-lived executor thread: PR_SET_PDEATHSIG fires when the *thread* that
    # forked a worker exits, so forking from a short-lived caller thread would kill a worker others use.
    spawner = _singleton("spawner", lambda: ThreadPoolExecutor(1, thread_name_prefix="math-verifier-spawn"))
    return spawner.submit(subprocess.Popen, cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env).result()



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
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        import resource  # optional: POSIX only (the except below)

        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY, _WORKER_MEMORY))
    except Exception:  # noqa: BLE001 - not Linux: rely on atexit and stdin EOF
        pass
    if os.getppid() != parent_pid:  # parent died before prctl took effect
        return
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" warnings: we time out here
    # open-r1's equations=True warns on every call that the parser handles equations itself now
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    # lazy: only the worker processes grade; the trainer process that imports this module never loads sympy
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

    # TRL 1.16's accuracy_reward (trl/rewards/accuracy_rewards.py): the gold with parse's defaults, the completion
    # with LaTeX only (boxed first, units normalised, no anchor-less extraction), verify(gold, answer).
    trl_cfg = [LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
                                     try_extract_without_anchor=False)]
    # open-r1's accuracy_reward (huggingface/open-r1@bd581c7e73bbd0b63b6605fc1ed4b51d231fa597:src/open_r1/rewards.py
    # :11-50): the gold with LaTeX only, first match; the completion with its normalisation (equations on, malformed
    # operators and nits off); verify(answer, gold) -- its argument order.
    open_r1_norm = NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True, equations=True,
                                       boxed="all", units=True)
    open_r1_cfg = [LatexExtractionConfig(normalization_config=open_r1_norm, boxed_match_priority=0,
                                         try_extract_without_anchor=False)]

    def grade(gold: str, completion: str, grader: str) -> bool | str:
        try:
            if grader == "trl":
                g = parse(gold, parsing_timeout=None)
                if not g:
                    return "no_gold"
                p = parse(completion, trl_cfg, extraction_mode="first_match", parsing_timeout=None)
                return bool(verify(g, p, timeout_seconds=None))
            g = parse(gold, [LatexExtractionConfig()], extraction_mode="first_match", parsing_timeout=None)
            if not g:
                return "no_gold"
            p = parse(completion, open_r1_cfg, extraction_mode="first_match", parsing_timeout=None)
            return bool(verify(p, g, timeout_seconds=None))
        except Exception:  # noqa: BLE001 - as check(): garbage in is not equivalent
            return False

    os.write(out_fd, b"ready\n")
    for line in sys.stdin.buffer:
        for item in json.loads(line):
            answer = grade(*item) if len(item) == 3 else check(*item)
            os.write(out_fd, (json.dumps(answer) + "\n").encode())


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker_main(int(sys.argv[2]))
