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
  gets its own share through a per-chunk ``entropy_coef`` -- and TRL's logged metrics merged as if unchunked.
- :func:`chunked_logps`: the no-grad log-prob passes (old policy, reference) over the same kind of chunks,
  reassembled in row order.

Prompts are left-padded and completions right-padded (TRL's layout); a chunk keeps the columns where any of its
rows has a real token, found from the masks. Causal attention makes the dropped right padding irrelevant; the
dropped left padding shifts every position of a row by the same amount, which rotary position embeddings do not
see (relative attention) -- absolute-position models would.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from trainer import trl_contact

PROMPT_KEYS = ("prompt_ids", "prompt_mask")
# Loss types whose TRL normaliser counts rows, tokens of the micro-batch, or the generation batch's tokens.
ROW_WEIGHTED = frozenset({"grpo", "sapo", "dr_grpo", "luspo"})
GLOBAL_NORMALISED = frozenset({"dapo", "cispo", "vespo"})
# TRL metrics that are (global) token means -- or row means at sequence-level importance sampling -- per call.
TOKEN_MEAN_METRICS = ("kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
                      "cispo_clip_ratio")


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


def _chunk_inputs(inputs: dict[str, Any], budget: int):
    """(rows, chunk inputs) for each chunk of the micro-batch, plus the plan's padded/real token counts."""
    p_ext, c_ext = row_extents(inputs["prompt_mask"], inputs["completion_mask"])
    plan = plan_chunks(p_ext, c_ext, budget)
    stats = {"padded": 0, "real": int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum()), "over": 0}
    out = []
    for rows in plan:
        p_keep, c_keep = max(p_ext[r] for r in rows), max(max(c_ext[r] for r in rows), 1)
        cost = len(rows) * (p_keep + c_keep)
        stats["padded"] += cost
        stats["over"] += int(cost > budget)
        out.append((rows, slice_rows(inputs, rows, p_keep, c_keep)))
    return out, stats


def _loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def chunk_weights(trainer: Any, inputs: dict[str, Any], chunk: dict[str, Any]) -> tuple[float, float]:
    """(policy weight, entropy-bonus weight) of one chunk: its share of the micro-batch normaliser of the policy
    term (TRL's ``loss_type``) and of the entropy bonus (TRL's: token mean; ``entropy_aggregation: loss_type``:
    the policy's)."""
    B, b = inputs["completion_ids"].size(0), chunk["completion_ids"].size(0)
    tokens = max(float(_loss_mask(chunk).sum()), 1.0) / max(float(_loss_mask(inputs).sum()), 1.0)
    if trainer.loss_type in ROW_WEIGHTED:
        policy = b / B
    elif trainer.loss_type in GLOBAL_NORMALISED:
        policy = 1.0
    else:  # bnpo: the micro-batch's (clamped) loss-token count
        policy = tokens
    loss_type_bonus = trainer.args.entropy_aggregation == "loss_type" and trainer.args.loss_variant == "none"
    return policy, policy if loss_type_bonus else tokens


def chunked_loss(trainer: Any, model: Any, inputs: dict[str, Any], loss_fn: Callable[[Any, Any, dict], torch.Tensor],
                 backward: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """The micro-batch loss of ``loss_fn`` computed chunk by chunk (see module docstring). Every chunk but the last
    is backpropagated here (its graph freed at once); the returned tensor carries the last chunk's graph plus the
    others' detached values, so the caller's single ``backward`` completes the same gradient and reports the
    unchunked loss value."""
    chunks, stats = _chunk_inputs(inputs, trainer.args.micro_batch_tokens)
    metrics = trl_contact.metrics(trainer)
    marks = {k: len(v) for k, v in metrics.items()}
    coef = trainer.entropy_coef
    done, weights = 0.0, []
    last = None
    try:
        for i, (_, chunk) in enumerate(chunks):
            w_pol, w_ent = chunk_weights(trainer, inputs, chunk)
            trainer.entropy_coef = coef * w_ent / w_pol  # TRL scales the bonus by entropy_coef alone
            loss = loss_fn(trainer, model, chunk) * w_pol
            weights.append((w_pol, float(_loss_mask(chunk).sum()), chunk["completion_ids"].size(0)))
            if i + 1 < len(chunks):
                backward(loss)
                done += float(loss.detach())
            else:
                last = loss
    finally:
        trainer.entropy_coef = coef
    merge_metrics(trainer, metrics, marks, weights)
    metrics["tokens/padded_loss"].append(float(stats["padded"]))
    metrics["tokens/real_loss"].append(float(stats["real"]))
    metrics["tokens/loss_chunks"].append(float(len(chunks)))
    metrics["tokens/over_budget_rows"].append(float(stats["over"]))
    return last + done


def merge_metrics(trainer: Any, metrics: dict[str, list], marks: dict[str, int], weights: list[tuple]) -> None:
    """Replace the per-chunk values each metric received by the value the unchunked call would have logged
    (one process: TRL's global means are this process's means). Token means weight by loss tokens (rows at
    sequence-level importance sampling or for VESPO's per-sequence phi), ``policy_loss`` by the policy weight,
    the clip-ratio extremes take the min / max, ``entropy_coef`` the configured coefficient."""
    by_rows = trainer.args.importance_sampling_level == "sequence"
    for key in list(metrics):
        values = metrics[key][marks.get(key, 0):]
        if len(values) != len(weights):
            continue  # not appended once per chunk (e.g. entropy_coef only at optimizer-step boundaries)
        del metrics[key][marks.get(key, 0):]
        metrics[key].append(_merge(key, values, weights, by_rows, trainer.entropy_coef))
    if "entropy_coef" in metrics and len(metrics["entropy_coef"]) > marks.get("entropy_coef", 0):
        del metrics["entropy_coef"][marks.get("entropy_coef", 0):]
        metrics["entropy_coef"].append(trainer.entropy_coef)


def _merge(key: str, values: list[float], weights: list[tuple], by_rows: bool, coef: float) -> float:
    if key == "entropy_coef":
        return coef
    if key == "clip_ratio/low_min":
        finite = [v for v in values if not math.isnan(v)]
        return min(finite) if finite else float("nan")
    if key == "clip_ratio/high_max":
        finite = [v for v in values if not math.isnan(v)]
        return max(finite) if finite else float("nan")
    if key == "policy_loss":
        return sum(v * w[0] for v, w in zip(values, weights))
    rows = key == "vespo/phi_seq_mean" or (by_rows and key.startswith("clip_ratio"))
    w = [float(x[2]) if rows else x[1] for x in weights]
    return sum(v * x for v, x in zip(values, w)) / max(sum(w), 1.0)


def chunked_logps(forward: Callable[..., tuple], model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  logits_to_keep: int, budget: int, compute_entropy: bool, metrics: dict[str, list] | None,
                  name: str) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """A no-grad log-prob pass (``forward`` = TRL's ``_get_per_token_logps_and_entropies``) over token-budget
    chunks, reassembled in row order; columns a chunk trimmed away hold 0 (they are padding in every row)."""
    P = input_ids.size(1) - logits_to_keep
    inputs = {"prompt_ids": input_ids[:, :P], "prompt_mask": attention_mask[:, :P],
              "completion_ids": input_ids[:, P:], "completion_mask": attention_mask[:, P:]}
    chunks, stats = _chunk_inputs(inputs, budget)
    B = input_ids.size(0)
    logps = input_ids.new_zeros((B, logits_to_keep), dtype=torch.float32)
    entropies = torch.zeros_like(logps) if compute_entropy else None
    for rows, chunk in chunks:
        ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], dim=1)
        mask = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], dim=1)
        width = chunk["completion_ids"].size(1)
        lp, ent, _ = forward(model, ids, mask, width, compute_entropy=compute_entropy)
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
