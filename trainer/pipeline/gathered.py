"""TRL's batch dict of one generation batch, gathered from every process once.

Several readers need the whole generation batch, not this rank's rows: the stages' ``RolloutBatch``
(trainer/pipeline/batch.py), compaction (trainer/pipeline/compaction.py), the collapse probe and DAPO's relogging of
the assembled batch. They all read it through one :class:`GatheredRows`, which gathers each key of TRL's dict the
first time it is read and hands out the same tensor after that, so a key crosses the processes once per generation
batch however many readers it has. Every key is padded as TRL 1.16 pads it (:data:`TRL_PAD`), so the gathered rows
are the rows TRL would have built on one process.

Collective: every rank must read the same keys in the same order, which holds because every rank runs the same
code on the same decisions. A key whose tensor was replaced in the local dict since it was gathered (the masked
dealing rewrites ``tool_mask``) is gathered again.
"""

from __future__ import annotations

from typing import Any

import torch


def gather_padded(accelerator: Any, t: torch.Tensor, pad: float = 0, pad_first: bool = False) -> torch.Tensor:
    """Rows of ``t`` from every process, in rank order (collective). Per-token tensors (dim >= 2) are padded
    to the longest length of any rank first: right-padded, or left-padded for prompts (``pad_first``)."""
    t = t.contiguous()
    if t.dim() >= 2:
        t = accelerator.pad_across_processes(t, dim=1, pad_index=pad, pad_first=pad_first)
    return accelerator.gather(t) if accelerator.num_processes > 1 else t


LEFT_PADDED = frozenset({"prompt_ids", "prompt_mask"})
PAD_TOKEN = object()  # stands for the tokenizer's pad token id in TRL_PAD
# What TRL 1.16 holds in the padded columns of each per-token key of its batch dict: a re-dealt row (compaction, rank
# balancing, dynamic sampling's merge of rounds) is padded to a wider batch with the same values, so every reduction
# that reads them unmasked sees the row as TRL laid it out. trl==1.16.0:trl/trainer/grpo_trainer.py:2443-2483
# (pad(...) of the ids, masks, sampler log-probs and tool mask); the vLLM importance-sampling ratio is
# exp((old - sampling) * mask) (same file:2661-2674), exp(0) = 1 in every masked column, and VESPO sums its log over
# every column, unmasked (same file:3001-3003): padded with 0 it adds log 1e-8 per column and zeroes the row's phi.
# Keys not listed (old/reference log-probs: model outputs that TRL masks wherever it reads them; per-token advantages)
# pad with 0.
TRL_PAD = {
    "prompt_ids": PAD_TOKEN,
    "prompt_mask": 0,
    "completion_ids": PAD_TOKEN,
    "completion_mask": 0,
    "sampling_per_token_logps": 0,
    "tool_mask": 1,
    "importance_sampling_ratio": 1,  # inside any sane clip range (TRL's clip_min <= 1 <= clip_max)
}


def pad_value(key: str, pad_token_id: int) -> int:
    """The value TRL 1.16 pads ``key``'s per-token tensor with (:data:`TRL_PAD`; 0 for keys it does not list)."""
    value = TRL_PAD.get(key, 0)
    return pad_token_id if value is PAD_TOKEN else value


def gather_key(accelerator: Any, key: str, t: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """``t`` (TRL's batch value for ``key``) from every process, padded as TRL pads that key (collective)."""
    return gather_padded(accelerator, t, pad_value(key, pad_token_id), key in LEFT_PADDED)


class GatheredRows:
    """Read-only, gather-on-first-read view of ``output`` (TRL's local batch dict) over every process."""

    def __init__(self, output: dict[str, Any], accelerator: Any, pad_token_id: int):
        self.output, self.accelerator, self.pad_token_id = output, accelerator, pad_token_id
        self._gathered: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # key -> (local tensor, gathered)
        self.gathers = 0  # how many keys crossed the processes (a test reads it)

    def __contains__(self, key: str) -> bool:
        return self.output.get(key) is not None

    def __getitem__(self, key: str) -> torch.Tensor:
        local = self.output[key]
        seen = self._gathered.get(key)
        if seen is not None and seen[0] is local:
            return seen[1]
        rows = gather_key(self.accelerator, key, local, self.pad_token_id)
        self._gathered[key] = (local, rows)
        self.gathers += 1
        return rows

    def loss_mask(self) -> torch.Tensor:
        """(N, T) the model tokens of every row: TRL's completion mask times its tool/env mask where it has one."""
        mask = self["completion_mask"]
        return mask * self["tool_mask"] if "tool_mask" in self else mask
