"""Which optimizer step of a generation batch each kept rollout trains in: the plan (pure; every process computes the
same plan from the global kept counts). trainer/pipeline/round.py moves the rows where the plan puts them.

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

import math
from dataclasses import dataclass
from typing import Literal, get_args

FilteredUpdates = Literal["fixed", "proportional", "verl_minibatch"]  # WinnowConfig.filtered_updates's type
FILTERED_UPDATES: tuple[str, ...] = get_args(FilteredUpdates)
FIXED, PROPORTIONAL, VERL_MINIBATCH = FILTERED_UPDATES
WHOLE_STEPS = (PROPORTIONAL, VERL_MINIBATCH)  # modes whose kept rows fill whole optimizer steps of M rows


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
