"""What ``max_staleness`` buys when generation times jitter, with one server (issue "Generation at GPU scale", item
7): the overlap's queue (trainer/server/overlap.py) driven by the staleness emulator (tests/server/
staleness_emulator.py: one set of weights, one generation at a time, a sync refused while one runs), generation
``--short`` seconds or, one batch in ``--every``, ``--long``; training ``--train`` seconds per batch. Printed per s:
the wall time of ``--batches`` batches beside the bounds ``sum(G_k) + sum(T)`` (sync), ``sum(max(G_k, T))`` (one
batch generated between two syncs) and ``max(sum(G_k), sum(T))`` (a buffer that absorbs jitter).

    .venv/bin/python bench/overlap_jitter.py --json bench/results/overlap_jitter.json
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import benchlib

sys.path.insert(0, str(benchlib.REPO / "tests" / "server"))
from staleness_emulator import FakeServer, prompts_of  # noqa: E402

from trainer.server.overlap import GenerationQueue  # noqa: E402


class JitteryServer(FakeServer):
    """The emulator with one generation time per batch."""

    def __init__(self, times: list[float]):
        super().__init__()
        self.times = times

    def generate(self, request):
        self.generation_s = self.times[request["index"]]
        return super().generate(request)


def run(s: int, times: list[float], batches: int, train_s: float) -> float:
    """Wall seconds of ``batches`` batches at staleness ``s``."""
    server = JitteryServer(times)
    queue = GenerationQueue(s, server.generate, server.sync)
    start = time.monotonic()
    for k in range(batches):
        queue.start_batch(k, lambda j: {"index": j, "prompts": prompts_of(j)})
        queue.take(k)
        time.sleep(train_s)
    wall = time.monotonic() - start
    queue.close()
    return wall


def main(argv: list[str] | None = None) -> int:
    """Print (and with --json write) the measure."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--train", type=float, default=0.1)
    p.add_argument("--short", type=float, default=0.05)
    p.add_argument("--long", type=float, default=0.25)
    p.add_argument("--every", type=int, default=3, help="one batch in this many is long (drawn, seed 0)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rng = random.Random(0)
    times = [args.long if rng.randrange(args.every) == 0 else args.short for _ in range(args.batches + 8)]
    G = times[:args.batches]
    bounds = {"sync": sum(G) + args.batches * args.train, "one_per_sync": sum(max(g, args.train) for g in G),
              "jitter_absorbed": max(sum(G), args.batches * args.train)}
    walls = {s: run(s, times, args.batches, args.train) for s in (0, 1, 2, 3)}
    for s, wall in walls.items():
        print(f"s = {s}: {wall:.2f} s for {args.batches} batches")
    print("bounds: " + ", ".join(f"{k} {v:.2f} s" for k, v in bounds.items()))
    if args.json:
        benchlib.write_json(args.json, {"walls_s": walls, "bounds_s": bounds, "settings": vars(args)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
