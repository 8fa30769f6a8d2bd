"""One dealing of a generation batch's rows to micro-batches and optimizer steps, from the stage pipeline's decision.

After the stages decide (kept rows, advantages), this rank's share of the batch is built once and handed to the
trainer's buffer (trainer/pipeline/generation_buffer.py) as ``steps_per_generation`` micro-batches:

1. removed rows leave the batch (compaction: every rank takes an equal share of the kept rows, trainer/pipeline/
   compaction.py) or stay in it masked out of the loss and its normalisers (``compact_batch: false``, or a batch that
   cannot be re-dealt row by row, such as images); when nothing was removed (and no rank balance asks for a re-deal)
   the batch is TRL's, untouched;
2. the batch is shuffled and split as TRL 1.16 splits it (:func:`trainer.trl_contact.split_generation_batch`);
3. when stages can remove rows, the kept rows are moved to their optimizer steps (``filtered_updates``,
   trainer/pipeline/step_dealing.py).

Every rank makes the same choices from the global decision, so the result needs no more communication than the
gather of the batch the stages read (trainer/pipeline/gathered.py) and, for some loss types, one reduction (both
collective: every rank calls :func:`deal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainer import trl_contact
from trainer.algorithms.normalisers import BATCH_TOKEN_NORMALISED, ROW_NORMALISED
from trainer.pipeline.compaction import compact
from trainer.pipeline.gathered import GatheredRows
from trainer.pipeline.rank_balance import round_robin_counts
from trainer.pipeline.step_dealing import KEPT_KEY, DealPlan, compacted_micro_rows, optimizer_steps, redeal


@dataclass(frozen=True)
class DealSettings:
    """The recipe's settings the dealing reads; identical on every process."""

    steps_per_generation: int  # S: micro-batches per generation batch
    accumulation: int  # A: gradient_accumulation_steps
    micro_batch_rows: int  # per_device_train_batch_size
    passes: int  # num_iterations: the micro-batches are replayed this many times
    filtered_updates: str  # step_dealing.FILTERED_UPDATES
    compact: bool  # compact_batch
    balance_tokens: bool  # compaction balances the ranks' tokens (balance_rank_tokens with a token budget, > 1 rank)
    loss_type: str  # TRL's loss_type: which normaliser a re-deal must correct (trainer/algorithms/normalisers.py)
    pad_token_id: int
    step_dealing: bool  # stages can remove rows: kept rows are dealt to their optimizer steps


@dataclass
class Dealt:
    """This rank's micro-batches of a generation batch, in order of use, and what the dealing counted."""

    micro_batches: list[dict[str, Any]]
    updates: int  # optimizer steps of the batch (all passes) that train at least one kept row
    rank_tokens: torch.Tensor | None = None  # (world,) each rank's real tokens after compaction, fillers included


def deal(output: dict[str, Any], keep: torch.Tensor, advantages: torch.Tensor, *, settings: DealSettings,
         first_micro_step: int, accelerator: Any, gathered: GatheredRows | None = None) -> Dealt:
    """Deal ``output`` (TRL's local batch dict, this rank's rows, advantages written) by the global decision ``keep``
    (N,) and ``advantages`` (N,) or (N, T), the micro-step counter standing at ``first_micro_step``; ``gathered``:
    the batch's rows over every process as the stages read them (trainer/pipeline/gathered.py). Collective."""
    S, A = settings.steps_per_generation, settings.accumulation
    batch, plan, rank_tokens = _remove_rows(output, keep, advantages, settings, first_micro_step, accelerator,
                                            gathered)
    micro_batches = trl_contact.split_generation_batch(batch, S)
    updates = optimizer_steps(first_micro_step, S, A, settings.passes)
    if plan is not None and settings.step_dealing:
        micro_batches = redeal(
            micro_batches,
            plan,
            accelerator.process_index,
            row_normalised=settings.loss_type in ROW_NORMALISED,
            token_normalised=settings.loss_type in BATCH_TOKEN_NORMALISED,
            reduce_sum=lambda t: accelerator.reduce(t, reduction="sum") if accelerator.num_processes > 1 else t,
        )
        updates = plan.updates()
    return Dealt(micro_batches, updates, rank_tokens)


def _remove_rows(
    output: dict[str, Any], keep: torch.Tensor, advantages: torch.Tensor, settings: DealSettings,
    first_micro_step: int, accelerator: Any, gathered: GatheredRows | None,
) -> tuple[dict[str, Any], DealPlan | None, torch.Tensor | None]:
    """Step 1: the batch to split (compacted, or ``output`` with removed rows masked in place), the plan that deals
    its kept rows, and the ranks' tokens after compaction; ``(output, None, None)`` when nothing was removed and
    nothing asks for a re-deal (TRL's batch as it is)."""
    S, world, rank = settings.steps_per_generation, accelerator.num_processes, accelerator.process_index
    if bool(keep.all()) and not settings.balance_tokens:
        return output, None, None  # nothing removed: TRL's masks and normalisers stay untouched (off means off)
    K = int(keep.sum())
    common = dict(mode=settings.filtered_updates, micro_batches=S, accumulation=settings.accumulation,
                  first_micro_step=first_micro_step, passes=settings.passes,
                  recipe_micro_rows=settings.micro_batch_rows)
    if settings.compact:
        micro_rows = compacted_micro_rows(K, world, S, settings.accumulation, settings.micro_batch_rows,
                                          settings.filtered_updates)
        compacted = compact(output, keep, advantages, accelerator=accelerator, pad_token_id=settings.pad_token_id,
                            steps_per_generation=S, micro_batch_rows=settings.micro_batch_rows,
                            rows_per_step=micro_rows, balance_tokens=settings.balance_tokens, gathered=gathered)
        if compacted is not None:
            rank_tokens = compacted.pop("winnow_rank_tokens", None)
            counts = tuple(round_robin_counts(K, world))
            return compacted, DealPlan(counts=counts, micro_rows=micro_rows, **common), rank_tokens
    # masked: removed rows stay, out of the loss (TRL's loss-only tool_mask) and of every normaliser
    B = output["completion_ids"].shape[0]
    rows = slice(rank * B, (rank + 1) * B)
    local_keep = keep[rows].unsqueeze(1)
    tool_mask = output.get("tool_mask")
    tool_mask = torch.ones_like(output["completion_mask"]) if tool_mask is None else tool_mask
    output["tool_mask"] = tool_mask * local_keep.to(tool_mask.dtype)  # loss-only mask: attention is untouched
    loss_mask = output["completion_mask"] * output["tool_mask"]
    output["num_items_in_batch"] = accelerator.gather(loss_mask.sum()).sum()
    N = keep.numel()
    output["winnow_loss_scale"] = torch.tensor(N / max(K, 1), device=output["advantages"].device)
    output[KEPT_KEY] = keep[rows].clone()
    counts = tuple(int(c) for c in keep.view(world, B).sum(dim=1))
    return output, DealPlan(counts=counts, micro_rows=B // S, **common), None
