"""The generation batch over every process: TRL's batch dict gathered once (:class:`GatheredRows`), the stages'
typed view of it (:class:`RolloutBatch`), and the two row helpers compaction and DAPO's refill share
(:func:`row_keys`, :func:`trim_padding`).

Stages make group decisions, so they must see whole groups; TRL splits a generation batch across
processes and micro-steps, so the trainer gathers it first and every rank builds the same
``RolloutBatch`` (and therefore makes the same decisions).

Several readers need the whole generation batch, not this rank's rows: the stages' ``RolloutBatch``,
compaction (trainer/pipeline/round.py), the collapse probe and DAPO's relogging of
the assembled batch. They all read it through one :class:`GatheredRows`, which gathers each key of TRL's dict the
first time it is read and hands out the same tensor after that, so a key crosses the processes once per generation
batch however many readers it has. Every key is padded as TRL 1.16 pads it (:data:`TRL_PAD`), so the gathered rows
are the rows TRL would have built on one process.

Collective: every rank must read the same keys in the same order, which holds because every rank runs the same
code on the same decisions. A key whose tensor was replaced in the local dict since it was gathered (the masked
dealing rewrites ``tool_mask``) is gathered again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from trainer.algorithms.grpo import group_index, group_view, total_reward

# The dealing's per-micro-batch facts (trainer/pipeline/round.py), as it writes them into TRL's batch dicts (and a
# mid-batch checkpoint stores them: trainer/guards/generation_resume.py); a MicroBatch carries them as attributes.
ROW_SCALE_KEY = "winnow_loss_scale"
ALL_DROPPED_KEY = "winnow_all_dropped"
KEPT_KEY = "winnow_kept"  # per-row bool the dealing adds to TRL's batch dict so its split carries it with the rows
logger = logging.getLogger(__name__)
_warned_compaction: set[str] = set()  # keys already warned of, once each


@dataclass
class RolloutBatch:
    """Gathered tensors of one generation batch (N = all rollouts of all processes, T = padded length).

    Rows are ordered group by group (G consecutive rows share a prompt). Per-token tensors are right
    padded; ``mask`` is the loss mask (completion mask times TRL's tool/env mask: 1 = model token).
    """

    R_k: torch.Tensor  # (N, K) reward per reward function, NaN = not scored
    reward_weights: torch.Tensor  # (K,)
    reward_names: list[str]
    G: int  # group size
    completion_ids: torch.Tensor  # (N, T)
    mask: torch.Tensor  # (N, T) float loss mask
    old_logps: torch.Tensor | None = None  # (N, T) log pi_old(y_t) at the sampling temperature
    entropies: torch.Tensor | None = None  # (N, T) old-policy token entropy at the sampling temperature
    extras: dict[str, Any] = field(default_factory=dict)  # room for stage inputs (teacher scores, ...)
    # Each configured stage's checkpointed state (Stage.state), by Stage.state_key; shared with every subset.
    stage_state: dict[str, Any] = field(default_factory=dict)
    # Running state, updated by the pipeline as stages return.
    keep: torch.Tensor | None = None  # (N,) bool
    advantages: torch.Tensor | None = None  # (N,) or (N, T), set by a stage that transforms advantages
    estimate_advantages: Callable[["RolloutBatch"], torch.Tensor] | None = None
    _base_advantages: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.keep is None:
            self.keep = torch.ones(self.N, dtype=torch.bool, device=self.R_k.device)

    @property
    def N(self) -> int:
        """Number of rollouts in the global batch."""
        return self.R_k.shape[0]

    @property
    def P(self) -> int:
        """Number of prompt groups."""
        return self.N // self.G

    @property
    def R(self) -> torch.Tensor:
        """Total (weighted) reward per rollout (N,), NaN where no reward function scored it."""
        return total_reward(self.R_k, self.reward_weights)

    @property
    def group_index(self) -> torch.Tensor:
        """Group id of each rollout (N,)."""
        return group_index(self.N, self.G, device=self.R_k.device)

    @property
    def lengths(self) -> torch.Tensor:
        """Number of loss tokens per rollout (N,)."""
        return self.mask.sum(dim=1)

    @property
    def trainable(self) -> torch.Tensor:
        """(N,) bool: rollouts with at least one loss token. The others (a truncated rollout under
        ``mask_truncated_completions``, an episode with no model token) keep their reward in the GRPO group
        statistics, as TRL does, but are never deletion candidates and weigh nothing in a stage's per-group
        statistic: they are never trained, so they must not set the baseline of rows that are."""
        return self.mask.sum(dim=1) > 0

    def subset(self, rows: torch.Tensor) -> "RolloutBatch":
        """The batch restricted to ``rows`` ((N,) bool, whole groups), with the same estimator attached: what a
        stage sees once earlier stages removed groups (their rows must not enter its ranking or statistics)."""
        if rows.shape != (self.N,) or bool((self.groups(rows).any(dim=1) != self.groups(rows).all(dim=1)).any()):
            raise ValueError("RolloutBatch.subset takes an (N,) bool mask of whole groups")

        def pick(t: Any) -> Any:
            return t[rows] if torch.is_tensor(t) and t.dim() >= 1 and t.shape[0] == self.N else t

        return RolloutBatch(
            R_k=self.R_k[rows], reward_weights=self.reward_weights, reward_names=self.reward_names, G=self.G,
            completion_ids=self.completion_ids[rows], mask=self.mask[rows], old_logps=pick(self.old_logps),
            entropies=pick(self.entropies), extras={k: pick(v) for k, v in self.extras.items()},
            keep=self.keep[rows], estimate_advantages=self.estimate_advantages, stage_state=self.stage_state,
        )

    def groups(self, x: torch.Tensor) -> torch.Tensor:
        """View a per-rollout tensor (N, ...) as (P, G, ...)."""
        return group_view(x, self.G)

    def base_advantages(self) -> torch.Tensor:
        """The configured advantage estimator's output, computed once on first use.

        A stage that transforms advantages (GRPODropout's recentering) reads them here; otherwise the
        pipeline evaluates the estimator after the filter and dropout stages.
        """
        if self._base_advantages is None:
            if self.estimate_advantages is None:
                raise RuntimeError("RolloutBatch has no advantage estimator attached")
            self._base_advantages = self.estimate_advantages(self)
        return self._base_advantages


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


def row_keys(output: dict[str, Any]) -> list[str] | None:
    """Keys of the per-row tensors of TRL's batch dict, or None when it holds anything that cannot be
    re-dealt row by row (then the caller keeps the masked formulation)."""
    B = output["completion_ids"].shape[0]
    keys = []
    for key, value in output.items():
        if key in ("num_items_in_batch", ROW_SCALE_KEY):
            continue
        if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == B:
            keys.append(key)
        elif value is not None and not (torch.is_tensor(value) and value.dim() == 0):  # scalars pass through
            if key not in _warned_compaction:
                _warned_compaction.add(key)
                logger.warning("batch compaction off for batches with %r; removed rollouts stay masked", key)
            return None
    return keys


def trim_padding(batch: dict[str, torch.Tensor]) -> None:
    """Drop columns that are padding in every selected row (the gathered batch is padded to the longest
    row of any rank): prompt columns on the left, completion columns on the right."""
    prompt_cols = batch["prompt_mask"].any(dim=0).nonzero()
    start = int(prompt_cols[0]) if prompt_cols.numel() else 0
    completion_cols = batch["completion_mask"].any(dim=0).nonzero()
    end = int(completion_cols[-1]) + 1 if completion_cols.numel() else 1
    T = batch["completion_ids"].shape[1]
    for key, t in list(batch.items()):
        if key in LEFT_PADDED:
            batch[key] = t[:, start:]
        elif t.dim() >= 2 and t.shape[1] == T:
            batch[key] = t[:, :end]
