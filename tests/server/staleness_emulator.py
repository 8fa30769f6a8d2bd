"""A deterministic stand-in for a vLLM server under overlapped generation (trainer/server/overlap.py): generation
takes a set time and returns tokens that say which weights produced them; a weight sync while a generation runs is
an error. The ordering, versions and waits of the overlap are checked on the CPU with it, without vLLM; the real
server is measured in bench/."""

from __future__ import annotations

import threading
import time
from typing import Any

from trainer.server.overlap import GenerationQueue


class FakeServer:
    """One set of weights (``version``), one generation at a time, each taking ``generation_s`` seconds."""

    def __init__(self, generation_s: float = 0.0, sync_s: float = 0.0, fail_at: int | None = None):
        self.generation_s, self.sync_s, self.fail_at = generation_s, sync_s, fail_at
        self.version = 0
        self.events: list[tuple[str, int]] = []  # ("sync", version) / ("start", batch) / ("end", batch), in order
        self.generated: list[int] = []  # batch indices, once per generation call
        self._busy = threading.Lock()

    def sync(self, version: int) -> None:
        """Load the weights of ``version``; refuses while a generation runs (the overlap must never do that)."""
        if not self._busy.acquire(blocking=False):
            raise AssertionError(f"weight sync to version {version} while a generation is running")
        try:
            self.events.append(("sync", version))
            time.sleep(self.sync_s)
            self.version = version
        finally:
            self._busy.release()

    def generate(self, request: dict[str, Any]) -> dict[str, Any]:
        """``request``: ``{"index": k, "prompts": [...]}``. Completions are ``[version, k, prompt]``: the weights
        at the start and at the end of the call must agree."""
        with self._busy:
            k = request["index"]
            self.events.append(("start", k))
            self.generated.append(k)
            start_version = self.version
            time.sleep(self.generation_s)
            if self.fail_at == k:
                self.events.append(("end", k))
                raise ConnectionError(f"the server dropped batch {k}")
            assert self.version == start_version
            self.events.append(("end", k))
            return {"index": k, "version": start_version,
                    "completions": [[start_version, k, p] for p in request["prompts"]]}


def prompts_of(k: int, n: int = 4) -> list[int]:
    """The prompts of generation batch ``k`` (what a dataloader would yield)."""
    return [100 * k + i for i in range(n)]


def drive(queue: GenerationQueue, first: int, last: int, train_s: float = 0.0,
          on_batch: Any = None) -> list[Any]:
    """Run the trainer's side of the protocol (trainer/server/overlap.py) for generation batches ``first`` ..
    ``last``: ``start_batch(k)`` (publish version k, submit up to batch k + s), take batch k, then "train" for
    ``train_s`` seconds.
    Returns the taken results in order."""
    taken = []
    for k in range(first, last + 1):
        queue.start_batch(k, lambda j: {"index": j, "prompts": prompts_of(j)})
        got = queue.take(k)
        taken.append(got)
        if on_batch is not None:
            on_batch(k, got)
        time.sleep(train_s)
    return taken
