"""Which optimizer step of a generation batch each kept rollout trains in.

TRL generates one batch per ``steps_per_generation`` (S) micro-steps, shuffles it, splits it into S
micro-batches, and every ``gradient_accumulation_steps`` (A) of them make one optimizer step: U = S / A
steps per generation batch. When stages removed rollouts, that random split can leave an optimizer step
without a kept rollout although the batch kept plenty (the step is then skipped). So after TRL's split,
and only when stages removed something, each process re-deals its rows over the same S micro-batches
(TRL's shuffle still decides the order among kept rows). Placement is a pure function of the per-process
kept counts, which every process knows from the global decision, so every process agrees on which steps
are empty without communicating. ``filtered_updates`` chooses the rule:

- ``fixed`` (default): kept rows are dealt round-robin over the micro-batches, taking the first micro-batch
  of every step before the second of any, with process r continuing where process r-1 stopped -- the i-th
  kept row of the global batch lands in step i mod U. A step is empty only when the whole generation batch
  kept fewer rows than it has steps. Loss weights are the masked formulation's, unchanged.
- ``proportional`` (RAGEN; mll-lab-nu/RAGEN@20daedc:ragen/trainer/agent_trainer.py, ``adjust_batch`` at line 62
  and its call with the mini-batch split at lines 1190-1200): kept rows fill whole optimizer steps of the recipe's
  mini-batch M = per_device_train_batch_size x A x processes, so the generation batch takes ceil(K/M) updates for K
  kept rows. Each update is the loss TRL computes on a batch of exactly its rows: row-normalised losses get the
  scale M_j-row mean (``winnow_loss_scale``), token-normalised ones the step's own token count
  (``num_items_in_batch``; one all-reduce of U numbers). The remaining steps are empty and skipped.
  Upstream pads the kept rows to a multiple of M by duplicating random rows (``batch_adjust_mode: copy``);
  a duplicate counts twice in its update's mean, which biases it towards the copied rows, so here the last
  update averages over the rows it has. On the masked path (``compact_batch: false``) rows cannot move
  between processes, so with several processes and unevenly kept rows it may take more than ceil(K/M)
  updates (each still a full mean over its rows).
- ``verl_minibatch`` (verl's ``dp_actor.update_policy``, as the GRPODropout authors ran it:
  hexuandeng/GRPODropout@4ad3b3b:verl/verl/workers/actor/dp_actor.py, ``data.split(ppo_mini_batch_size)`` and
  ``loss = policy_loss / self.gradient_accumulation``): the same ceil(K/M) updates as ``proportional``, but every
  update's loss is divided by the full mini-batch M, whatever it holds -- verl's accumulation count is fixed, so a
  partial last mini-batch takes a proportionally smaller step and nothing is renormalised by the kept count. Row-
  normalised losses only (``grpo``, ``sapo``, ``dr_grpo``, ``luspo``: the config refuses the others); scale
  ``winnow_loss_scale`` = the local micro-batch rows / per_device_train_batch_size, so every trained row weighs 1/M.

Empty steps whose whole accumulation window holds no kept row on any process are marked
``winnow_all_dropped``: outside DeepSpeed they run no forward and no backward (every process skips the
same micro-batches, so no collective is left waiting).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, get_args

import torch

logger = logging.getLogger(__name__)

FilteredUpdates = Literal["fixed", "proportional", "verl_minibatch"]  # WinnowConfig.filtered_updates's type
FILTERED_UPDATES: tuple[str, ...] = get_args(FilteredUpdates)
FIXED, PROPORTIONAL, VERL_MINIBATCH = FILTERED_UPDATES
WHOLE_STEPS = (PROPORTIONAL, VERL_MINIBATCH)  # modes whose kept rows fill whole optimizer steps of M rows
KEPT_KEY = "winnow_kept"  # per-row bool the trainer adds to TRL's batch dict so the deal can find kept rows
_warned: set[str] = set()


@dataclass(frozen=True)
class DealPlan:
    """Everything the deal needs; identical on every process."""

    mode: str  # one of FILTERED_UPDATES
    counts: tuple[int, ...]  # kept rows each process holds, in process order
    micro_batches: int  # S
    accumulation: int  # A
    micro_rows: int  # rows of each local micro-batch
    first_micro_step: int  # the generation buffer's micro-step counter when the batch was generated
    passes: int = 1  # num_iterations: TRL replays the same micro-batches this many times
    recipe_micro_rows: int = 0  # per_device_train_batch_size: M = this x A x processes (verl_minibatch's divisor)

    @property
    def aligned(self) -> bool:
        """Every optimizer step lies inside this generation batch (steps_per_generation divisible by A)."""
        return self.micro_batches % self.accumulation == 0 and self.first_micro_step % self.accumulation == 0

    def window(self, micro: int, pass_index: int = 0) -> int:
        """Index (within this batch) of the optimizer step that trains micro-batch ``micro`` in a pass."""
        phase = (self.first_micro_step + pass_index * self.micro_batches) % self.accumulation
        return (phase + micro) // self.accumulation

    def placement(self, rank: int) -> list[int]:
        """Micro-batch of each of process ``rank``'s kept rows (in their local order)."""
        k, S, A = self.counts[rank], self.micro_batches, self.accumulation
        if self.mode in WHOLE_STEPS:
            per_step = A * self.micro_rows
            return [(p // per_step) * A + (p % per_step) % A for p in range(k)]
        # fixed: the first micro-batch of every step, then the second of every step, ...
        order = sorted(range(S), key=lambda i: (i - _first_of_window(self, i), self.window(i)))
        offset = sum(self.counts[:rank])
        return [order[(offset + p) % S] for p in range(k)]

    def kept_per_micro_batch(self) -> list[int]:
        """Kept rows of every process together in each micro-batch."""
        per_micro = [0] * self.micro_batches
        for rank in range(len(self.counts)):
            for micro in self.placement(rank):
                per_micro[micro] += 1
        return per_micro

    def updates(self) -> int:
        """Optimizer steps of this generation batch (all passes) that hold at least one kept row."""
        per_micro = self.kept_per_micro_batch()
        return optimizer_steps(self.first_micro_step, self.micro_batches, self.accumulation, self.passes,
                               [n > 0 for n in per_micro])


def optimizer_steps(first_micro_step: int, micro_batches: int, accumulation: int, passes: int = 1,
                    used: list[bool] | None = None) -> int:
    """Distinct optimizer steps that train a generation batch's micro-batches (only the ``used`` ones, default all).

    TRL runs the batch's S micro-batches ``passes`` times in a row, micro-steps first_micro_step ...
    first_micro_step + S x passes - 1, and every A consecutive micro-steps make one optimizer step. Steps are
    numbered over the whole run, not per pass: with S = 3, A = 2 and 2 passes the middle step takes the last
    micro-batch of pass 1 and the first of pass 2, and is one step, not one per pass (3 steps, not 4). A step that
    straddles two generation batches (S x passes not a multiple of A) counts for each batch it trains."""
    used = [True] * micro_batches if used is None else used
    return len({(first_micro_step + t * micro_batches + i) // accumulation
                for t in range(passes) for i in range(micro_batches) if used[i]})


def _first_of_window(plan: DealPlan, micro: int) -> int:
    """First micro-batch of this generation batch in ``micro``'s optimizer step."""
    w = plan.window(micro)
    return next(i for i in range(plan.micro_batches) if plan.window(i) == w)


def compacted_micro_rows(kept: int, world: int, micro_batches: int, accumulation: int, micro_batch_rows: int,
                         mode: str) -> int:
    """Rows per local micro-batch after compaction: the fewest that hold each process's share of ``kept``
    rows under ``mode``'s placement (fixed: spread over all S micro-batches; proportional: whole steps of
    ``micro_batch_rows`` x A rows per process; verl_minibatch places as proportional)."""
    per_rank = max(1, math.ceil(kept / world))
    if mode in WHOLE_STEPS:
        return math.ceil(min(per_rank, micro_batch_rows * accumulation) / accumulation)
    return math.ceil(per_rank / micro_batches)


def redeal(
    micro_batches: list[dict[str, Any]],
    plan: DealPlan,
    rank: int,
    *,
    row_normalised: bool,
    token_normalised: bool,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor],
) -> list[dict[str, Any]]:
    """This process's micro-batches with its kept rows moved where ``plan`` puts them (collective in
    proportional mode with a token-normalised loss: every process must call it).

    ``micro_batches`` is TRL's split of the local generation batch, carrying :data:`KEPT_KEY`; the key is
    removed from the result."""
    local = _concat(micro_batches)
    kept_flags = local.pop(KEPT_KEY) if local is not None else None
    if local is None or kept_flags is None:
        for batch in micro_batches:
            batch.pop(KEPT_KEY, None)
        return micro_batches
    S, c = plan.micro_batches, plan.micro_rows
    kept = kept_flags.bool().nonzero().squeeze(1).tolist()
    rest = (~kept_flags.bool()).nonzero().squeeze(1).tolist()
    if len(kept) != plan.counts[rank] or kept_flags.numel() != S * c:
        raise RuntimeError(f"deal plan expects {plan.counts[rank]} kept of {S * c} rows, batch has {len(kept)} of "
                           f"{kept_flags.numel()}")
    buckets: list[list[int]] = [[] for _ in range(S)]
    for row, micro in zip(kept, plan.placement(rank)):
        buckets[micro].append(row)
    for bucket in buckets:  # fill with removed / zero-weight rows, in TRL's shuffled order
        need = c - len(bucket)
        bucket.extend(rest[:need])
        rest = rest[need:]
    order = torch.tensor([row for bucket in buckets for row in bucket], device=kept_flags.device)
    out = [{k: (v[order[i * c:(i + 1) * c]] if torch.is_tensor(v) and v.dim() else v) for k, v in local.items()}
           for i in range(S)]

    per_micro = plan.kept_per_micro_batch()
    windows = [plan.window(i) for i in range(S)]
    kept_in_window = [0] * (max(windows) + 1)
    for i, n in enumerate(per_micro):
        kept_in_window[windows[i]] += n
    if plan.mode == VERL_MINIBATCH and row_normalised:
        # TRL weighs a row 1/(c*A*world); verl's fixed accumulation count weighs every row 1/M, M = b*A*world
        for batch in out:
            batch["winnow_loss_scale"] = torch.tensor(c / plan.recipe_micro_rows, device=kept_flags.device)
    if plan.mode == PROPORTIONAL:
        world, A = len(plan.counts), plan.accumulation
        if row_normalised:  # TRL weighs a row 1/(c*A*world); the step's own mean weighs it 1/kept_in_window
            for i, batch in enumerate(out):
                batch["winnow_loss_scale"] = torch.tensor(c * A * world / max(kept_in_window[windows[i]], 1),
                                                           device=kept_flags.device)
        if token_normalised:  # TRL's normaliser per step is num_items * A / S: make it the step's own tokens
            local_tokens = torch.zeros(len(kept_in_window), dtype=torch.float64, device=kept_flags.device)
            for i, batch in enumerate(out):
                local_tokens[windows[i]] += float(_loss_tokens(batch))
            tokens = reduce_sum(local_tokens)
            for i, batch in enumerate(out):
                batch["num_items_in_batch"] = (tokens[windows[i]] * S / A).to(torch.float32)
    for i, batch in enumerate(out):
        batch.pop("winnow_all_dropped", None)
        if plan.aligned and kept_in_window[windows[i]] == 0:  # the whole step is empty on every process
            batch["winnow_all_dropped"] = torch.tensor(1, device=kept_flags.device)
    return out


def _loss_tokens(batch: dict[str, Any]) -> torch.Tensor:
    mask = batch["completion_mask"]
    return (mask * batch["tool_mask"]).sum() if batch.get("tool_mask") is not None else mask.sum()


def _concat(micro_batches: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Undo TRL's split (keeping its shuffled row order), or None for batches that do not split by row."""
    first = micro_batches[0]
    rows = first[KEPT_KEY].shape[0] if KEPT_KEY in first else None
    local: dict[str, Any] = {}
    for key, value in first.items():
        if value is None or (torch.is_tensor(value) and value.dim() == 0):
            local[key] = value
        elif torch.is_tensor(value) and value.shape[0] == rows:
            local[key] = torch.cat([batch[key] for batch in micro_batches])
        else:  # images and other per-sample lists: keep TRL's split
            if key not in _warned:
                _warned.add(key)
                logger.warning("optimizer-step dealing off for batches with %r; TRL's random split is kept", key)
            return None
    return local
