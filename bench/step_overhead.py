"""Step-time overhead of WinnowGRPOTrainer (every stage off) over TRL's GRPOTrainer, measured interleaved.

Both trainers are built once on the tiny test model with tests/harness.py's BASE_ARGS (real local generation)
and each runs its own, unmodified ``trainer.train()`` in a thread. A callback passes a baton between the two so
that exactly one of them runs at any moment (the first step waits until both have finished setting up), in
this order: ``--warmup`` untimed steps each, then ``--pairs`` pairs of timed steps (the order within a pair
alternates AB, BA, AB, ... so neither trainer always goes first), then one untimed closing step each (so
neither trainer's end-of-training work overlaps a timed step).

A timed step is the Trainer's on_step_begin -> on_step_end window: generation, reward scoring, the (winnow)
pipeline, loss, backward, optimizer and scheduler step; batch fetching and logging run outside it, while the
trainer still holds the baton. Wall time (time.perf_counter) is the headline; the stepping thread's user CPU
time is printed too (with OMP_NUM_THREADS=1 the step's compute runs on that thread; user time leaves out other
processes competing for the cores and the kernel's page-fault time). By default glibc malloc is pinned to one
arena that keeps its memory (see ``pin_malloc``): with glibc's defaults page faults, not the trainers, made
most of the step-to-step noise, and per-thread arenas a systematic gap between identical trainers.
``--aa`` runs TRL against TRL instead, to see the noise floor of the ratio on the machine at hand.

Before every step the global torch RNG is seeded with the step index, so at the same step both trainers sample
the same completions; with stages off their updates are identical too (checked at the end from the logged
per-step loss, token count and reward), i.e. both do exactly the same work.

    OMP_NUM_THREADS=1 .venv/bin/python bench/step_overhead.py --pairs 30 --warmup 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # harness.py
sys.path.insert(0, str(REPO))  # the working tree's packages first
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from benchlib import write_json  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

try:
    import resource

    _RUSAGE_THREAD = resource.RUSAGE_THREAD  # Linux
except (ImportError, AttributeError):  # pragma: no cover - other platforms: user time unavailable
    _RUSAGE_THREAD = None


def _thread_usage() -> tuple[float, int]:
    """(user CPU seconds, minor page faults) of the calling thread so far; (nan, 0) where unsupported."""
    if _RUSAGE_THREAD is None:
        return float("nan"), 0
    ru = resource.getrusage(_RUSAGE_THREAD)
    return ru.ru_utime, ru.ru_minflt


class Baton:
    """Lets the trainer threads run one at a time, following ``schedule`` (one name per step)."""

    def __init__(self, schedule: list[str]):
        self.schedule = schedule
        self.names = set(schedule)
        self.arrived: set[str] = set()
        self.pos = 0  # index into schedule of the step now running (or next to run)
        self.holder: str | None = None
        self.failed = False
        self.cond = threading.Condition()

    def take(self, name: str) -> int:
        """Called at a step's start: hand over the previous step (if ours), wait until every trainer has
        reached its first step and it is our turn. Returns the schedule position of the step about to run."""
        with self.cond:
            self.arrived.add(name)
            self._pass(name)
            self.cond.notify_all()
            self.cond.wait_for(
                lambda: self.failed
                or (self.arrived == self.names and self.pos < len(self.schedule) and self.schedule[self.pos] == name)
            )
            if self.failed:
                raise RuntimeError("the other trainer failed")
            self.holder = name
            return self.pos

    def release(self, name: str) -> None:
        """Called when a trainer is done: hand over its last step."""
        with self.cond:
            self._pass(name)

    def abort(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify_all()

    def _pass(self, name: str) -> None:
        if self.holder == name:
            self.holder = None
            self.pos += 1
            self.cond.notify_all()


class TimedTurns(TrainerCallback):
    """Takes the baton at on_step_begin, seeds the RNG with the step index, measures begin -> end."""

    def __init__(self, name: str, baton: Baton, seed: int):
        self.name, self.baton, self.seed = name, baton, seed
        self.wall: dict[int, float] = {}  # schedule position -> seconds (perf_counter)
        self.user: dict[int, float] = {}  # schedule position -> this thread's user CPU seconds
        self.faults: dict[int, int] = {}  # schedule position -> minor page faults of this thread
        self._pos = -1
        self._t0 = self._u0 = 0.0
        self._f0 = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self._pos = self.baton.take(self.name)
        torch.manual_seed(self.seed + state.global_step)
        self._u0, self._f0 = _thread_usage()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.wall[self._pos] = time.perf_counter() - self._t0
        u, f = _thread_usage()
        self.user[self._pos], self.faults[self._pos] = u - self._u0, f - self._f0

    def on_train_end(self, args, state, control, **kwargs):
        self.baton.release(self.name)


def pin_malloc(keep_heap: bool) -> str:
    """glibc only, before the trainer threads start: make both trainers allocate from one malloc arena
    (``mallopt(M_ARENA_MAX, 1)``, as MALLOC_ARENA_MAX=1), as a trainer in the main thread does; with
    ``keep_heap`` also serve every allocation from the heap and never give freed memory back to the OS
    (``M_MMAP_MAX=0``, ``M_TRIM_THRESHOLD=2**31-1``), so that after warm-up no step pays for page faults.

    Why: with glibc's defaults every step of this tiny model (152k vocabulary) allocates a few hundred MB of
    logit-sized buffers, some mapped fresh from the OS; how many fault in differs from step to step (from
    ~0 to 400k page faults for identical work -- see ``--verbose``), and with one arena per trainer thread the
    two arenas' different histories showed up as a systematic ~15% wall-time gap between two trainers
    doing identical work. Both trainers do the same allocations, so this removes noise, not overhead.
    Returns a description of what was applied."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        done = ["one arena"] if libc.mallopt(-8, 1) else []  # M_ARENA_MAX
        if keep_heap and libc.mallopt(-4, 0) and libc.mallopt(-1, 2**31 - 1):  # M_MMAP_MAX, M_TRIM_THRESHOLD
            done.append("no mmap, no trim")
    except (OSError, AttributeError):
        done = []
    return ", ".join(done) or "glibc defaults"


def build(kind: str, model: str, out: str, steps: int, aa: bool = False):
    """A trainer of ``kind`` ("trl" or "winnow") with the test harness's settings, stages off (with ``aa``
    the "winnow" slot gets a second TRL GRPOTrainer)."""
    from harness import BASE_ARGS, prompt_dataset, reward_length, reward_token_parity
    from trl import GRPOConfig, GRPOTrainer

    from trainer import WinnowConfig, WinnowGRPOTrainer

    cls, cfg = (GRPOTrainer, GRPOConfig) if kind == "trl" or aa else (WinnowGRPOTrainer, WinnowConfig)
    args = cfg(output_dir=os.path.join(out, kind), **{**BASE_ARGS, "max_steps": steps, "logging_steps": 1})
    return cls(
        model=model, reward_funcs=[reward_token_parity, reward_length], args=args, train_dataset=prompt_dataset()
    )


def _summary(label: str, win: list[float], trl: list[float]) -> str:
    ratios = [w / t for w, t in zip(win, trl)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return (
        f"{label}: winnow {statistics.median(win) * 1e3:7.1f} ms  trl {statistics.median(trl) * 1e3:7.1f} ms  "
        f"median per-pair ratio winnow/trl {statistics.median(ratios):.4f} (quartiles {q[0]:.4f} .. {q[2]:.4f})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=30, help="timed (Winnow, TRL) step pairs (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per trainer before timing (default 3)")
    p.add_argument("--seed", type=int, default=1234, help="base of the per-step RNG seed (default 1234)")
    p.add_argument("--fixed-order", action="store_true", help="always run Winnow first in a pair (default: alternate)")
    p.add_argument(
        "--malloc",
        choices=["keep-heap", "one-arena", "default"],
        default="keep-heap",
        help="glibc malloc settings for the run (default keep-heap; see pin_malloc): keep-heap = one arena, no "
        "mmap, no trim; one-arena = only M_ARENA_MAX=1; default = glibc's per-thread arenas and mmap/trim",
    )
    p.add_argument("--aa", action="store_true", help="A/A check: a second TRL GRPOTrainer in Winnow's place")
    p.add_argument("--verbose", action="store_true", help="also print every pair's times and page faults")
    p.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    ns = p.parse_args()
    if ns.pairs < 1 or ns.warmup < 0:
        p.error("--pairs must be >= 1 and --warmup >= 0")

    malloc_mode = "glibc defaults" if ns.malloc == "default" else pin_malloc(keep_heap=ns.malloc == "keep-heap")
    from harness import tiny_model_path
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model = tiny_model_path()
    steps = ns.warmup + ns.pairs + 1  # + one untimed closing step each
    schedule = ["winnow", "trl"] * ns.warmup
    pair_pos: list[dict[str, int]] = []
    for i in range(ns.pairs):
        order = ["winnow", "trl"] if ns.fixed_order or i % 2 == 0 else ["trl", "winnow"]
        pair_pos.append({name: len(schedule) + j for j, name in enumerate(order)})
        schedule += order
    schedule += ["winnow", "trl"]

    baton = Baton(schedule)
    with tempfile.TemporaryDirectory() as out:
        trainers = {kind: build(kind, model, out, steps, ns.aa) for kind in ("winnow", "trl")}
        callbacks = {}
        for kind, tr in trainers.items():
            callbacks[kind] = TimedTurns(kind, baton, ns.seed)
            tr.add_callback(callbacks[kind])
            tr.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
        errors: dict[str, BaseException] = {}

        def run(kind: str) -> None:
            try:
                trainers[kind].train()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors[kind] = e
                baton.abort()

        threads = [threading.Thread(target=run, args=(k,), name=k) for k in trainers]
        t_start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t_start
        if errors:
            for kind, e in errors.items():
                print(f"{kind} failed: {type(e).__name__}: {e}", file=sys.stderr)
            raise SystemExit(1)

    def timed(kind: str, what: str) -> list:
        return [getattr(callbacks[kind], what)[pp[kind]] for pp in pair_pos]

    win_t, trl_t = timed("winnow", "wall"), timed("trl", "wall")
    win_u, trl_u = timed("winnow", "user"), timed("trl", "user")
    if ns.verbose:
        win_f, trl_f = timed("winnow", "faults"), timed("trl", "faults")
        for i in range(ns.pairs):
            first = "winnow" if pair_pos[i]["winnow"] < pair_pos[i]["trl"] else "trl   "
            print(
                f"pair {i:3d} ({first} first)  wall: winnow {win_t[i] * 1e3:7.1f} trl {trl_t[i] * 1e3:7.1f} ms "
                f"ratio {win_t[i] / trl_t[i]:.4f}  | user: ratio {win_u[i] / trl_u[i]:.4f}  "
                f"| page faults: winnow {win_f[i]} trl {trl_f[i]}"
            )

    def per_step(kind: str, key: str) -> list:
        return [e.get(key) for e in trainers[kind].state.log_history if "loss" in e]

    same = all(per_step("winnow", k) == per_step("trl", k) for k in ("loss", "num_tokens", "reward"))
    print(
        f"pairs: {ns.pairs}  warm-up steps: {ns.warmup}  order: {'fixed' if ns.fixed_order else 'alternating'}  "
        f"torch threads: {torch.get_num_threads()}  OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}  "
        f"malloc: {malloc_mode}"
    )
    if ns.aa:
        print("A/A CHECK: 'winnow' below is a second TRL GRPOTrainer")
    print(f"median step time  winnow (stages off): {statistics.median(win_t) * 1e3:8.1f} ms")
    print(f"median step time  trl GRPOTrainer:     {statistics.median(trl_t) * 1e3:8.1f} ms")
    ratios = [w / t for w, t in zip(win_t, trl_t)]
    print(f"median per-pair ratio winnow/trl:      {statistics.median(ratios):8.4f}   (target <= 1.02)")
    print(_summary("wall time     ", win_t, trl_t))
    print(_summary("user CPU time ", win_u, trl_u))
    print(f"identical work (same per-step loss, tokens, reward in both): {'yes' if same else 'NO'}")
    print(f"wall time of the run: {wall:.1f} s")
    if ns.json:
        q = statistics.quantiles(ratios, n=4)
        write_json(ns.json, {"bench": "step_overhead", "pairs": ns.pairs, "aa": ns.aa,
                             "winnow_median_ms": statistics.median(win_t) * 1e3,
                             "trl_median_ms": statistics.median(trl_t) * 1e3,
                             "median_ratio": statistics.median(ratios), "ratio_quartiles": [q[0], q[2]],
                             "identical_work": same})


if __name__ == "__main__":
    main()
