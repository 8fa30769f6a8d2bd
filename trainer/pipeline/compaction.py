"""Batch compaction: rollouts the stages removed leave the training batch instead of riding along masked.

Masking a removed rollout gives the right loss but still pays its forward and backward; the reference codes
then pad the smaller batch by duplicating rows, which biases the update. Here, after the stages decide, every
rank gathers the kept rows of the whole generation batch, takes an equal share (round-robin over the kept
rows' global order; with token-budget micro-batches, the same row counts chosen so every rank holds about as many
tokens: trainer/pipeline/rank_balance.py), and fills its share up to a multiple of ``steps_per_generation`` with
*zero-weight* rows: a copy of a kept row whose loss mask (TRL's ``tool_mask``) and advantage are zero, so it is
counted in no token normaliser and, through ``winnow_loss_scale``, in no row normaliser either. TRL then shuffles
and splits the smaller local batch into the same number of micro-steps as before, so every rank runs the same number
of forward/backward calls (DDP and ZeRO-3 collectives cannot deadlock, even for a rank that held no kept row).

Equivalence with the masked formulation (tested per loss type): token-normalised losses (dapo, cispo, vespo)
divide by the global kept-token count, which compaction keeps; row-normalised ones (grpo, sapo, dr_grpo,
luspo) divide by the micro-batch's row count, which compaction changes from B to B' -- the loss scale
``N/K * B'/B`` restores each kept row's weight exactly. Both hold step for step when one optimizer step
consumes the whole generation batch (``steps_per_generation == gradient_accumulation_steps``); with several
optimizer steps per generation, trainer/pipeline/step_dealing.py then deals the kept rows over the steps
(``filtered_updates``) after TRL's shuffle. ``bnpo`` and TRL's entropy bonus normalise by the loss tokens of each
process's micro-batch (DDP then averages over processes), so they equal the masked formulation only with one
process and one micro-batch per optimizer step: with more processes the re-deal changes which kept rows share a
process, hence each process's normaliser (TRL's own bnpo likewise depends on how its shuffle deals rows).

Multimodal batches (pixel values, image counts) are left masked: their per-image tensors do not split by row.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from trainer.pipeline.gathered import LEFT_PADDED, GatheredRows
from trainer.pipeline.rank_balance import balanced_shares, round_robin_shares

logger = logging.getLogger(__name__)

_warned: set[str] = set()


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
            if key not in _warned:
                _warned.add(key)
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
    this rank's share over all micro-steps; trainer/pipeline/step_dealing.py sizes it per ``filtered_updates``). The
    result marks the rank's kept rows (``winnow_kept``). Returns the new dict, or None when the batch cannot
    be compacted. ``balance_tokens``: the ranks' shares keep round-robin's row counts but are chosen so their real
    tokens (prompt + completion) are about equal (trainer/pipeline/rank_balance.py), and the zero-weight filler is
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
