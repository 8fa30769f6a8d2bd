"""One dealing of a generation batch's rows to micro-batches and optimizer steps, from the stage pipeline's decision.

After the stages decide (kept rows, advantages), this rank's share of the batch is built once and handed to the
trainer's buffer (trainer/pipeline/round.py) as ``steps_per_generation`` micro-batches:

1. removed rows leave the batch (compaction, below: every rank takes an equal share of the kept rows) or stay in it
   masked out of the loss and its normalisers (``compact_batch: false``, or a batch that cannot be re-dealt row by
   row, such as images); when nothing was removed (and no rank balance asks for a re-deal) the batch is TRL's,
   untouched;
2. the batch is shuffled and split as TRL 1.16 splits it (:func:`trainer.trl_contact.split_generation_batch`);
3. when stages can remove rows, the kept rows are moved to their optimizer steps (:func:`redeal`, by the plan of
   ``filtered_updates``: trainer/algorithms/deal_plan.py).

Every rank makes the same choices from the global decision, so the result needs no more communication than the
gather of the batch the stages read (trainer/pipeline/batch.py) and, for some loss types, one reduction (both
collective: every rank calls :func:`deal`).

Compaction: rollouts the stages removed leave the training batch instead of riding along masked.

Masking a removed rollout gives the right loss but still pays its forward and backward; the reference codes
then pad the smaller batch by duplicating rows, which biases the update. Here, after the stages decide, every
rank gathers the kept rows of the whole generation batch, takes an equal share (round-robin over the kept
rows' global order; with token-budget micro-batches, the same row counts chosen so every rank holds about as many
tokens: trainer/algorithms/rank_balance.py), and fills its share up to a multiple of ``steps_per_generation`` with
*zero-weight* rows: a copy of a kept row whose loss mask (TRL's ``tool_mask``) and advantage are zero, so it is
counted in no token normaliser and, through ``winnow_loss_scale``, in no row normaliser either. TRL then shuffles
and splits the smaller local batch into the same number of micro-steps as before, so every rank runs the same number
of forward/backward calls (DDP and ZeRO-3 collectives cannot deadlock, even for a rank that held no kept row).

Equivalence with the masked formulation (tested per loss type): token-normalised losses (dapo, cispo, vespo)
divide by the global kept-token count, which compaction keeps; row-normalised ones (grpo, sapo, dr_grpo,
luspo) divide by the micro-batch's row count, which compaction changes from B to B' -- the loss scale
``N/K * B'/B`` restores each kept row's weight exactly. Both hold step for step when one optimizer step
consumes the whole generation batch (``steps_per_generation == gradient_accumulation_steps``); with several
optimizer steps per generation, the re-deal then deals the kept rows over the steps
(``filtered_updates``) after TRL's shuffle. ``bnpo`` and TRL's entropy bonus normalise by the loss tokens of each
process's micro-batch (DDP then averages over processes), so they equal the masked formulation only with one
process and one micro-batch per optimizer step: with more processes the re-deal changes which kept rows share a
process, hence each process's normaliser (TRL's own bnpo likewise depends on how its shuffle deals rows).

Multimodal batches (pixel values, image counts) are left masked: their per-image tensors do not split by row.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from trainer import trl_contact
from trainer.algorithms.deal_plan import PROPORTIONAL, VERL_MINIBATCH, DealPlan, compacted_micro_rows, optimizer_steps
from trainer.algorithms.normalisers import BATCH_TOKEN_NORMALISED, ROW_NORMALISED
from trainer.algorithms.rank_balance import balanced_shares, round_robin_counts, round_robin_shares
from trainer.pipeline.batch import LEFT_PADDED, GatheredRows

logger = logging.getLogger(__name__)

KEPT_KEY = "winnow_kept"  # per-row bool the dealing adds to TRL's batch dict so its split carries it with the rows
_warned_compaction: set[str] = set()  # keys already warned of, once each per message
_warned_redeal: set[str] = set()


@dataclass(frozen=True)
class DealSettings:
    """The recipe's settings the dealing reads; identical on every process."""

    steps_per_generation: int  # S: micro-batches per generation batch
    accumulation: int  # A: gradient_accumulation_steps
    micro_batch_rows: int  # per_device_train_batch_size
    passes: int  # num_iterations: the micro-batches are replayed this many times
    filtered_updates: str  # deal_plan.FILTERED_UPDATES
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
    the batch's rows over every process as the stages read them (trainer/pipeline/batch.py). Collective."""
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


# -- compaction: removed rows leave the batch ------------------------------------------------------------

def row_keys(output: dict[str, Any]) -> list[str] | None:
    """Keys of the per-row tensors of TRL's batch dict, or None when it holds anything that cannot be
    re-dealt row by row (then the caller keeps the masked formulation)."""
    B = output["completion_ids"].shape[0]
    keys = []
    for key, value in output.items():
        if key in ("num_items_in_batch", "winnow_loss_scale"):
            continue
        if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == B:
            keys.append(key)
        elif value is not None and not (torch.is_tensor(value) and value.dim() == 0):  # scalars pass through
            if key not in _warned_compaction:
                _warned_compaction.add(key)
                logger.warning("batch compaction off for batches with %r; removed rollouts stay masked", key)
            return None
    return keys


def compact(
    output: dict[str, Any],
    keep: torch.Tensor,
    advantages: torch.Tensor,
    *,
    accelerator: Any,
    pad_token_id: int,
    steps_per_generation: int,
    micro_batch_rows: int,
    rows_per_step: int | None = None,
    balance_tokens: bool = False,
    gathered: GatheredRows | None = None,
) -> dict[str, Any] | None:
    """This rank's compacted share of the generation batch (collective: every rank must call it).

    ``keep`` (N,) and ``advantages`` (N,) or (N, T) are the pipeline's global decision; ``output`` is TRL's
    local batch dict. ``rows_per_step`` is the rows of each local micro-batch (default: the fewest that spread
    this rank's share over all micro-steps; trainer/algorithms/deal_plan.py sizes it per ``filtered_updates``). The
    result marks the rank's kept rows (``winnow_kept``). Returns the new dict, or None when the batch cannot
    be compacted. ``balance_tokens``: the ranks' shares keep round-robin's row counts but are chosen so their real
    tokens (prompt + completion) are about equal (trainer/algorithms/rank_balance.py), and the zero-weight filler is
    the shortest kept row. When any row is kept, the result carries ``winnow_rank_tokens`` (world,), each rank's
    real tokens including fillers, for the caller to log and remove. ``gathered``: the generation batch's
    :class:`GatheredRows` over ``output`` when the caller has one (keys its other readers gathered are not gathered
    again)."""
    keys = row_keys(output)
    if keys is None:
        return None
    world, rank = accelerator.num_processes, accelerator.process_index
    if gathered is None:
        gathered = GatheredRows(output, accelerator, pad_token_id)
    if gathered.output is not output:
        raise ValueError("compact: the gathered rows are of another batch dict")
    glob = {key: gathered[key] for key in keys}
    if "tool_mask" not in glob:  # TRL has no tool mask without tools: every model token counts (its pad is 1 too)
        glob["tool_mask"] = torch.ones_like(glob["completion_mask"])
        keys.append("tool_mask")
    N = glob["completion_ids"].shape[0]
    kept = keep.nonzero().squeeze(1)
    K = int(kept.numel())
    loss_tokens = glob["completion_mask"] * glob["tool_mask"]

    per_rank = max(1, math.ceil(K / world))
    if rows_per_step is None:
        rows_per_step = math.ceil(per_rank / steps_per_generation)
    size = rows_per_step * steps_per_generation
    real = (glob["prompt_mask"].sum(dim=1) + glob["completion_mask"].sum(dim=1))[kept]  # a kept row's tokens
    if balance_tokens and K:
        shares = balanced_shares(real.tolist(), world)
        filler_at = int(real.argmin())  # the cheapest row to carry at weight zero
    else:
        shares = round_robin_shares(K, world)
        filler_at = 0
    mine = kept[torch.tensor(shares[rank], dtype=torch.long, device=kept.device)]
    filler = kept[filler_at] if K else torch.tensor(0, device=keep.device)
    rows = torch.cat([mine, filler.repeat(size - mine.numel())])
    weight = torch.zeros(size, dtype=glob["tool_mask"].dtype, device=rows.device)
    weight[: mine.numel()] = 1

    # Row tensors first: TRL's shuffle takes the batch size from the first value of the dict.
    new = {key: glob[key][rows] for key in keys}
    new.update({k: v for k, v in output.items() if k not in new and torch.is_tensor(v) and v.dim() == 0})
    new["tool_mask"] = new["tool_mask"] * weight.unsqueeze(1)
    new["winnow_kept"] = weight > 0
    A = advantages[rows]
    if A.dim() == 2:
        A = A[:, : new["completion_ids"].shape[1]]
    new["advantages"] = A * (weight if A.dim() == 1 else weight.unsqueeze(1)).to(A.dtype)
    trim_padding(new)
    new["num_items_in_batch"] = loss_tokens[kept].sum() if K else loss_tokens.new_zeros(())
    # Row-normalised losses: TRL divides each micro-batch by its rows (now rows_per_step instead of
    # micro_batch_rows); the masked formulation weighted each kept row N/K / micro_batch_rows.
    scale = (N / max(K, 1)) * rows_per_step / micro_batch_rows
    new["winnow_loss_scale"] = torch.tensor(scale, device=A.device)
    if K == 0:
        new["winnow_all_dropped"] = torch.tensor(1, device=A.device)
    if K:  # each rank's real tokens, zero-weight fillers included: what its forwards pay for
        fill = real[filler_at]
        new["winnow_rank_tokens"] = torch.stack([
            real[torch.tensor(share, dtype=torch.long, device=real.device)].sum() + (size - len(share)) * fill
            for share in shares])
    return new


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


# -- the re-deal: kept rows moved to their optimizer steps (trainer/algorithms/deal_plan.py) ----------

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
                local_tokens[windows[i]] += float(loss_tokens(batch))
            tokens = reduce_sum(local_tokens)
            for i, batch in enumerate(out):
                batch["num_items_in_batch"] = (tokens[windows[i]] * S / A).to(torch.float32)
    for i, batch in enumerate(out):
        batch.pop("winnow_all_dropped", None)
        if plan.aligned and kept_in_window[windows[i]] == 0:  # the whole step is empty on every process
            batch["winnow_all_dropped"] = torch.tensor(1, device=kept_flags.device)
    return out


def loss_tokens(batch: dict[str, Any]) -> torch.Tensor:
    """This process's loss tokens of a (micro-)batch: TRL's completion mask times its loss-only tool mask."""
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
            if key not in _warned_redeal:
                _warned_redeal.add(key)
                logger.warning("optimizer-step dealing off for batches with %r; TRL's random split is kept", key)
            return None
    return local
