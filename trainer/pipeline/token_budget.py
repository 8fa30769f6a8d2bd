"""Token-budget micro-batches (``micro_batch_tokens``): a micro-batch's rows in length-sorted chunks whose padded
token count stays within a budget, each chunk trimmed to its own longest row.

TRL pads every micro-batch to its longest row and sizes it by rows, so a few long reasoning traces set both the
padding cost and the memory peak (verl's ``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu`` is the same idea;
no library offers it for TRL, hence this file). Three pieces:

- :func:`plan_chunks`: first-fit decreasing on the padded cost ``rows x (longest prompt + longest completion)``;
  a single row over the budget gets a chunk of its own (counted in ``tokens/over_budget_rows``).
- :func:`chunked_loss`: the training loss as a sum of chunk losses, each chunk run forward + backward, weighted so
  the sum (value and gradient) is the unchunked micro-batch loss for every TRL 1.16 ``loss_type`` -- the policy
  term (KL included, which shares its normaliser) scales by the chunk's share of TRL's normaliser (rows for
  grpo/sapo/dr_grpo/luspo, clamped loss tokens for bnpo, 1 for dapo/cispo/vespo whose normaliser is the global
  ``num_items_in_batch``); the entropy bonus, whose normaliser can differ (TRL: token mean of the micro-batch),
  gets its own share through the chunk's ``LossCall.entropy_weight`` -- and TRL's logged metrics recorded per
  chunk and reduced once, as if unchunked (trainer/loss/call.py).
- :func:`chunked_logps`: the no-grad log-prob passes (old policy, reference) over the same kind of chunks,
  reassembled in row order. Teacher scoring (trainer/methods/uecr/teacher.py) and the collapse detector's cross-scoring
  plan their chunks with the same pure planner, :func:`plan_trimmed`.

Several processes: the weights are TRL's per-rank normalisers (``dapo``'s global ``num_items_in_batch /
num_processes`` passes through), so each rank's chunk sum is TRL's loss on that rank; gradients sync once per
micro-step (DDP ``no_sync`` / DeepSpeed off-boundary backward for the earlier chunks), the metric collectives
run once per micro-step on the chunks' summed local statistics, and under multi-process DeepSpeed (ZeRO-3: every
forward and backward is a collective) ranks pad to the largest chunk count with zero-weight filler chunks.

Prompts are left-padded and completions right-padded (TRL's layout); a chunk keeps the columns where any of its
rows has a real token, found from the masks. Causal attention makes the dropped right padding irrelevant; the
dropped left padding shifts every position of a row by the same amount, which rotary position embeddings do not
see (relative attention) -- absolute-position models would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable

import torch
from accelerate.utils import DistributedType

from trainer import trl_contact
from trainer.algorithms.normalisers import normaliser
from trainer.config.errors import ConfigError
from trainer.loss.call import LossCall, LossRecorder

PROMPT_KEYS = ("prompt_ids", "prompt_mask")


def row_extents(prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> tuple[list[int], list[int]]:
    """Per row: columns of the prompt from its first real token to the end (left padding), and completion columns
    up to its last real token (right padding)."""
    P = prompt_mask.size(1)
    has_p = prompt_mask.bool()
    first = torch.where(has_p.any(1), has_p.int().argmax(1), torch.full_like(has_p[:, 0], P, dtype=torch.long))
    has_c = completion_mask.bool()
    T = completion_mask.size(1)
    last = torch.where(has_c.any(1), T - has_c.flip(1).int().argmax(1), torch.zeros_like(first))
    return (P - first).tolist(), last.tolist()


def padded_cost(rows: list[int], p_ext: list[int], c_ext: list[int]) -> int:
    """Tokens a forward over ``rows`` pays for: rows x (longest prompt + longest completion, at least 1)."""
    return len(rows) * (max(p_ext[r] for r in rows) + max(max(c_ext[r] for r in rows), 1))


def plan_chunks(p_ext: list[int], c_ext: list[int], budget: int) -> list[list[int]]:
    """First-fit decreasing: rows by length (longest first) into the first chunk whose padded cost stays within
    ``budget``; a row alone over the budget opens (and keeps) a chunk of its own."""
    order = sorted(range(len(p_ext)), key=lambda r: (-(p_ext[r] + c_ext[r]), r))
    chunks: list[list[int]] = []
    for r in order:
        for chunk in chunks:
            if padded_cost(chunk + [r], p_ext, c_ext) <= budget:
                chunk.append(r)
                break
        else:
            chunks.append([r])
    return [sorted(c) for c in chunks]


def slice_rows(inputs: dict[str, Any], rows: list[int], p_keep: int, c_keep: int) -> dict[str, Any]:
    """The micro-batch restricted to ``rows``, prompt tensors to their last ``p_keep`` columns and completion-width
    tensors to their first ``c_keep``; scalars (``num_items_in_batch``, row scales) pass through."""
    B, P = inputs["prompt_ids"].shape
    T = inputs["completion_ids"].size(1)
    index = torch.tensor(rows, device=inputs["prompt_ids"].device)
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if not (torch.is_tensor(value) and value.dim() >= 1 and value.size(0) == B):
            out[key] = value
            continue
        value = value.index_select(0, index)
        if value.dim() >= 2 and key in PROMPT_KEYS:
            value = value[:, P - p_keep:]
        elif value.dim() >= 2 and value.size(1) == T:
            value = value[:, :c_keep]
        out[key] = value
    return out


def plan_trimmed(p_ext: list[int], c_ext: list[int], budget: int) -> tuple[list[tuple[list[int], int, int]], dict]:
    """:func:`plan_chunks` with each chunk's kept widths: ``(rows, longest prompt, longest completion (>= 1))`` per
    chunk, and the plan's ``padded`` token count and ``over``-budget chunks. Pure (no tensors): every pass that
    chunks rows -- loss, old/reference log-probs, teacher scoring, the collapse detector -- plans with it."""
    chunks, padded, over = [], 0, 0
    for rows in plan_chunks(p_ext, c_ext, budget):
        cost = padded_cost(rows, p_ext, c_ext)
        padded += cost
        over += int(cost > budget)
        chunks.append((rows, max(p_ext[r] for r in rows), max(max(c_ext[r] for r in rows), 1)))
    return chunks, {"padded": padded, "over": over}


def shortest_row(p_ext: list[int], c_ext: list[int]) -> int:
    """The row a filler forward runs: the shortest (prompt + completion), the cheapest forward there is."""
    return min(range(len(p_ext)), key=lambda i: p_ext[i] + c_ext[i])


def _chunk_inputs(inputs: dict[str, Any], budget: int):
    """(rows, chunk inputs) for each chunk of the micro-batch, the plan's padded/real token counts, and the row
    extents (prompt, completion) it was planned from. A chunk keeps two completion columns at least where the
    micro-batch has two: TRL's metrics tell per-row from per-token tensors by their column count
    (``LossRecorder.trl_mean``), so a chunk must not turn a per-token tensor into a one-column one."""
    extents = row_extents(inputs["prompt_mask"], inputs["completion_mask"])
    plan, stats = plan_trimmed(*extents, budget)
    stats["real"] = int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
    least = min(2, inputs["completion_ids"].size(1))
    out = [(rows, slice_rows(inputs, rows, p_keep, max(c_keep, least))) for rows, p_keep, c_keep in plan]
    return out, stats, extents


def _loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def chunk_weights(trainer: Any, inputs: dict[str, Any], chunk: dict[str, Any],
                  aggregate_entropy: bool) -> tuple[float, float]:
    """(policy weight, entropy-bonus weight) of one chunk: its share of the micro-batch normaliser of the policy
    term (TRL's ``loss_type``) and of the entropy bonus (TRL's: token mean; with ``aggregate_entropy``, the
    ``LossCall``'s: the policy's)."""
    B, b = inputs["completion_ids"].size(0), chunk["completion_ids"].size(0)
    tokens = max(float(_loss_mask(chunk).sum()), 1.0) / max(float(_loss_mask(inputs).sum()), 1.0)
    divisor = normaliser(trainer.loss_type)  # trainer/algorithms/normalisers.py
    if divisor.counts_rows:
        policy = b / B
    elif divisor.divisor == "batch_tokens":  # a constant of the generation batch: each chunk's sum is its share
        policy = 1.0
    else:  # micro_tokens (bnpo): the micro-batch's (clamped) loss-token count
        policy = tokens
    return policy, policy if aggregate_entropy else tokens


def check_trainer(trainer: Any) -> None:
    """What the token budget cannot chunk, known only once TRL has read the model: an MoE router's load-balancing
    loss (``output_router_logits``) is one value per forward, not a sum over rows."""
    if trainer.args.micro_batch_tokens is not None and trainer.aux_loss_enabled:
        raise ConfigError("micro_batch_tokens", "the MoE router's load-balancing loss is not a sum over rows, so "
                          "chunks would change it", "use micro_batch_tokens: null with output_router_logits")


def balances_rank_tokens(args: Any, world: int) -> bool:
    """Whether compaction deals each rank about the same real tokens (``balance_rank_tokens``): only under a token
    budget, where a rank's forwards cost its tokens, not its rows, and only with several ranks and compaction."""
    return args.micro_batch_tokens is not None and args.balance_rank_tokens and world > 1 and args.compact_batch


def micro_batch_loss(trainer: Any, model: Any, inputs: dict[str, Any], loss_fn: Callable[..., torch.Tensor],
                     call: LossCall) -> torch.Tensor:
    """One micro-batch's loss of ``loss_fn``: in training under a token budget, over its chunks
    (:func:`chunked_loss`, each chunk's forward and backward here); else one call. The padded and real tokens the
    forwards paid for are logged either way (``tokens/padded_loss``, ``tokens/real_loss``)."""
    training = model.training and torch.is_grad_enabled()
    if trainer.args.micro_batch_tokens is not None and training:
        return chunked_loss(trainer, model, inputs, loss_fn, trainer.accelerator.backward, call)
    loss = loss_fn(trainer, model, inputs, call)
    if training:
        metrics = trl_contact.metrics(trainer)
        metrics["tokens/padded_loss"].append(float(inputs["prompt_ids"].numel() + inputs["completion_ids"].numel()))
        metrics["tokens/real_loss"].append(float(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()))
    return loss


def weighted_parts(trainer: Any, inputs: dict[str, Any]) -> list[tuple[dict[str, Any], float, bool]]:
    """A second model trained on the policy's micro-batches (PPO's critic) runs the same forwards: ``(inputs,
    weight, is_filler)`` for each token-budget chunk (:func:`loss_chunks`, weighted by :func:`chunk_weights`'
    policy share, fillers at 0), or the micro-batch whole with weight 1 without a budget."""
    if trainer.args.micro_batch_tokens is None:
        return [(inputs, 1.0, False)]
    calls, _ = loss_chunks(trainer, inputs)
    return [(chunk, 0.0 if filler else chunk_weights(trainer, inputs, chunk, False)[0], filler)
            for chunk, filler in calls]


def chunked_loss(trainer: Any, model: Any, inputs: dict[str, Any], loss_fn: Callable[..., torch.Tensor],
                 backward: Callable[[torch.Tensor], None], call: LossCall) -> torch.Tensor:
    """The micro-batch loss of ``loss_fn`` computed chunk by chunk (see module docstring). Every chunk but the last
    is backpropagated here (its graph freed at once); the returned tensor carries the last chunk's graph plus the
    others' detached values, so the caller's single ``backward`` completes the same gradient and reports the
    unchunked loss value.

    ``call`` is the micro-batch's :class:`LossCall`: each chunk gets a copy with its weights, recording into
    ``call.recorder``, which the caller reduces once (so ranks with different chunk counts stay in lockstep); under
    DDP the earlier chunks run under ``no_sync`` (only the last backward of a sync micro-step all-reduces), under
    DeepSpeed they backpropagate through the engine off the accumulation boundary, and ZeRO-3 ranks pad to the
    largest chunk count with zero-weight filler chunks (every forward and backward there is a collective)."""
    calls, stats = loss_chunks(trainer, inputs)
    partial_context, partial_backward = _partial_backward(trainer, model, backward)
    done, last = 0.0, None
    for i, (chunk, is_filler) in enumerate(calls):
        final = i + 1 == len(calls)
        with contextlib.nullcontext() if final else partial_context():
            if is_filler:  # same collectives as a real chunk, zero contribution, its metrics recorded nowhere
                loss = loss_fn(trainer, model, chunk, dataclasses.replace(call, chunked=True,
                                                                          recorder=LossRecorder())) * 0.0
            else:
                w_pol, w_ent = chunk_weights(trainer, inputs, chunk, call.aggregate_entropy)
                chunk_call = dataclasses.replace(call, chunked=True, policy_weight=w_pol, entropy_weight=w_ent / w_pol)
                loss = loss_fn(trainer, model, chunk, chunk_call) * w_pol
            if not final:
                partial_backward(loss)
                done += float(loss.detach())
        if final:
            last = loss
    metrics = trl_contact.metrics(trainer)
    metrics["tokens/padded_loss"].append(float(stats["padded"]))
    metrics["tokens/real_loss"].append(float(stats["real"]))
    metrics["tokens/loss_chunks"].append(float(stats["chunks"]))
    metrics["tokens/over_budget_rows"].append(float(stats["over"]))
    return last + done


def loss_chunks(trainer: Any, inputs: dict[str, Any]) -> tuple[list[tuple[dict[str, Any], bool]], dict[str, int]]:
    """The training micro-batch ``inputs`` as token-budget chunks, in the order every training pass runs them:
    ``(chunk inputs, is_filler)`` -- the zero-weight filler chunks last (multi-process DeepSpeed: every rank runs the
    largest chunk count) -- and the plan's ``padded`` / ``real`` / ``over`` token counts and real ``chunks``. The
    policy's loss (:func:`chunked_loss`) and a second trained model on the same micro-batches (PPO's critic) run
    the same chunks, each weighted by :func:`chunk_weights`."""
    chunks, stats, extents = _chunk_inputs(inputs, trainer.args.micro_batch_tokens)
    fillers = _filler_count(trainer.accelerator, len(chunks), inputs["completion_ids"].device)
    stats["chunks"] = len(chunks)
    calls = [(c, False) for _, c in chunks] + ([(_filler_chunk(inputs, extents), True)] * fillers if fillers else [])
    return calls, stats


def _is_deepspeed(accelerator: Any) -> bool:
    return accelerator.distributed_type == DistributedType.DEEPSPEED


def _filler_count(accelerator: Any, n_chunks: int, device: torch.device) -> int:
    """Filler forwards this rank adds so every rank runs the same number (DeepSpeed over several processes: ZeRO-3
    gathers parameters in every forward and reduces gradients in every backward; one max all-reduce)."""
    if accelerator.num_processes == 1 or not _is_deepspeed(accelerator):
        return 0
    return equal_forward_fillers(accelerator, n_chunks, device)


def equal_forward_fillers(accelerator: Any, n_chunks: int, device: torch.device) -> int:
    """Forwards this rank must add so that every rank runs the largest chunk count (one max all-reduce; 0 on one
    process): the teacher and collapse scorers keep their forward counts equal on every backend, as they did with
    row micro-batches."""
    if accelerator is None or accelerator.num_processes == 1:
        return 0
    most = int(accelerator.reduce(torch.tensor([n_chunks], device=device), reduction="max"))
    return most - n_chunks


def _filler_chunk(inputs: dict[str, Any], extents: tuple[list[int], list[int]]) -> dict[str, Any]:
    """The micro-batch's shortest row, trimmed: a cheap forward whose loss is multiplied by 0 (finite, so its
    gradient is exactly 0); a rank with no rows at all does not occur (compaction pads with zero-weight rows)."""
    p_ext, c_ext = extents
    r = shortest_row(p_ext, c_ext)
    return slice_rows(inputs, [r], max(p_ext[r], 1), max(c_ext[r], 1))


def _partial_backward(trainer: Any, model: Any, backward: Callable[[torch.Tensor], None]):
    """(context for a non-final chunk's forward + backward, its backward). DDP: ``no_sync``, so only the final
    backward of a sync micro-step all-reduces (a no-op context on one process). DeepSpeed: the engine's own
    backward off the accumulation boundary -- accelerate's would step the optimizer -- unscaled, as transformers
    passes ``scale_wrt_gas=False`` (TRL's loss is already scaled for accumulation)."""
    acc = trainer.accelerator
    if _is_deepspeed(acc):
        engine = acc.deepspeed_engine_wrapped.engine

        def ds_backward(loss: torch.Tensor) -> None:
            engine.set_gradient_accumulation_boundary(False)
            engine.backward(loss, scale_wrt_gas=False)

        return contextlib.nullcontext, ds_backward
    return functools.partial(acc.no_sync, model), backward


def no_grad_logps(trainer: Any, forward: Callable[..., tuple], phase: Callable[[str], Any], model: Any,
                  input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, batch_size: int,
                  compute_entropy: bool = False, compute_aux_loss: bool = False, **kwargs: Any) -> tuple:
    """A batched no-grad pass of TRL's log-prob ``forward`` (old policy or reference: the calls that pass
    ``batch_size``), timed by ``phase(name)`` and its tokens logged in training; with ``micro_batch_tokens`` over
    token-budget chunks instead of row slices. Every no-grad pass of the policy's or reference's log-probs runs here:
    TRL's own (through the trainer's override of its forward) and the old-policy row input's
    (trainer/pipeline/trl_stages.py)."""
    name = "ref_logps" if model is getattr(trainer, "ref_model", None) else "old_logps"
    metrics = trl_contact.metrics(trainer) if trainer.model.training else None
    budget = trainer.args.micro_batch_tokens
    with phase(name):
        if budget is None or compute_aux_loss or any(v is not None for v in kwargs.values()):
            if metrics is not None:
                metrics[f"tokens/padded_{name}"].append(float(input_ids.numel()))
                metrics[f"tokens/real_{name}"].append(float(attention_mask.sum()))
            return forward(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                           compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs)
        return chunked_logps(forward, model, input_ids, attention_mask, logits_to_keep, budget, compute_entropy,
                             metrics, name, trainer.accelerator)


def chunked_logps(forward: Callable[..., tuple], model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  logits_to_keep: int, budget: int, compute_entropy: bool, metrics: dict[str, list] | None,
                  name: str, accelerator: Any = None) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """A no-grad log-prob pass (``forward`` = TRL's ``_get_per_token_logps_and_entropies``) over token-budget
    chunks, reassembled in row order; columns a chunk trimmed away hold 0 (they are padding in every row). With
    ``accelerator`` under multi-process DeepSpeed, every rank runs the same number of forwards (filler chunks,
    results discarded)."""
    P = input_ids.size(1) - logits_to_keep
    inputs = {"prompt_ids": input_ids[:, :P], "prompt_mask": attention_mask[:, :P],
              "completion_ids": input_ids[:, P:], "completion_mask": attention_mask[:, P:]}
    chunks, stats, extents = _chunk_inputs(inputs, budget)
    fillers = _filler_count(accelerator, len(chunks), input_ids.device) if accelerator is not None else 0
    B = input_ids.size(0)
    logps = input_ids.new_zeros((B, logits_to_keep), dtype=torch.float32)
    entropies = torch.zeros_like(logps) if compute_entropy else None
    for rows, chunk in chunks + ([(None, _filler_chunk(inputs, extents))] * fillers if fillers else []):
        ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], dim=1)
        mask = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], dim=1)
        width = chunk["completion_ids"].size(1)
        lp, ent, _ = forward(model, ids, mask, width, compute_entropy=compute_entropy)
        if rows is None:  # a filler: ZeRO-3's collectives in lockstep with ranks that have more chunks
            continue
        index = torch.tensor(rows, device=input_ids.device)
        logps = logps.to(lp.dtype)
        logps[index, :width] = lp
        if entropies is not None:
            entropies = entropies.to(ent.dtype)
            entropies[index, :width] = ent
    if metrics is not None:
        metrics[f"tokens/padded_{name}"].append(float(stats["padded"]))
        metrics[f"tokens/real_{name}"].append(float(stats["real"]))
    return logps, entropies, None
