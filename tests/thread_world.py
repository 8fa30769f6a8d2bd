"""``world`` processes played by threads, for code that calls accelerate's collectives on a generation batch
(compaction, the gathered rows): tests/pipeline/test_compaction.py and tests/pipeline/test_gathered.py."""

from __future__ import annotations

import threading

import torch


class ThreadWorld:
    """``world`` processes played by threads, for the collectives compaction calls: accelerate's
    ``pad_across_processes`` (pad ``dim`` to the largest size of any process with ``pad_index``, as
    accelerate.utils.operations.pad_across_processes writes it) and ``gather`` (every process's rows, rank order)."""

    def __init__(self, world: int):
        self.world, self._barrier, self._slots = world, threading.Barrier(world, timeout=60), [None] * world

    def _all(self, rank: int, t: torch.Tensor) -> list[torch.Tensor]:
        self._slots[rank] = t
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()
        return out

    def accelerator(self, rank: int):
        world = self

        class Process:
            num_processes, process_index = world.world, rank

            def pad_across_processes(self, t, dim=0, pad_index=0, pad_first=False):
                size = max(x.shape[dim] for x in world._all(rank, t))
                if size == t.shape[dim]:
                    return t
                new = t.new_zeros((*t.shape[:dim], size, *t.shape[dim + 1:])) + pad_index
                at = slice(size - t.shape[dim], size) if pad_first else slice(0, t.shape[dim])
                new[(slice(None),) * dim + (at,)] = t
                return new

            def gather(self, t):
                return torch.cat(world._all(rank, t))

        return Process()

    def run(self, fn) -> list:
        """``fn(rank, accelerator)`` on every rank at once; the results in rank order."""
        results, errors = [None] * self.world, []

        def target(rank):
            try:
                results[rank] = fn(rank, self.accelerator(rank))
            except BaseException as e:  # noqa: BLE001 -- re-raised below, in the test's thread
                errors.append(e)
                self._barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results
