"""One table of how each ``loss_type`` turns per-token losses into a micro-batch's loss: the normaliser.

TRL 1.16 spells the aggregation out per loss type in ``GRPOTrainer._compute_loss``
(trl==1.16.0:trl/trainer/grpo_trainer.py:3153-3182); verl names the same choices in ``core_algos.agg_loss``
(``loss_agg_mode``). Everything in winnow that depends on the choice -- the loss itself when winnow computes it
(trainer/trl_contact.py ``trl_normalise``), the re-dealt and compacted rows' weights (trainer/algorithms/deal_plan.py,
pipeline/round.py), the token budget's chunk weights (trainer/pipeline/token_budget.py), the entropy bonus, the config
checks and the preflight's description -- reads this table, so a loss type's aggregation is stated once.

Each entry has two parts:

- ``per_row``: how a row's tokens are reduced first: ``token_mean`` (sum / the row's loss tokens), ``token_sum``, or
  ``none`` (the tokens go straight to the divisor);
- ``divisor``: what the micro-batch's sum is divided by: ``rows`` (the micro-batch's sequences),
  ``rows_x_max_len`` (sequences x ``max_completion_length``, Dr. GRPO's constant), ``micro_tokens`` (the micro-batch's
  loss tokens) or ``batch_tokens`` (the generation batch's loss tokens on every process, ``num_items_in_batch``).

A loss type whose divisor counts rows is *row-normalised*: removing a row from a step changes the divisor, so a
stage that drops rollouts must scale the kept rows (``MicroBatch.row_scale``); a token-normalised one re-weights
itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

PerRow = Literal["token_mean", "token_sum", "none"]
Divisor = Literal["rows", "rows_x_max_len", "micro_tokens", "batch_tokens"]


@dataclass(frozen=True)
class Normaliser:
    """How one loss type aggregates (module doc); ``verl`` is verl's ``loss_agg_mode`` of the same rule, if any."""

    per_row: PerRow
    divisor: Divisor
    verl: str | None
    text: str

    @property
    def counts_rows(self) -> bool:
        """Whether the divisor counts sequences (the loss type is row-normalised)."""
        return self.divisor in ("rows", "rows_x_max_len")


_SEQ_MEAN_TOKEN_MEAN = Normaliser("token_mean", "rows", "seq-mean-token-mean",
                                  "per-sequence token mean, averaged over the step's sequences")
_GLOBAL_TOKEN_MEAN = Normaliser("none", "batch_tokens", "token-mean",
                                "token mean over the step's tokens on every process")

NORMALISERS: dict[str, Normaliser] = {
    "grpo": _SEQ_MEAN_TOKEN_MEAN,
    "sapo": _SEQ_MEAN_TOKEN_MEAN,
    "luspo": Normaliser("token_sum", "rows", "seq-mean-token-sum",
                        "per-sequence token sum, averaged over the step's sequences"),
    # verl's seq-mean-token-sum-norm divides by max_completion_length alone, not by the sequences too: not the same
    "dr_grpo": Normaliser("none", "rows_x_max_len", None,
                          "token sum over the step's sequences / (sequences x max_completion_length)"),
    "bnpo": Normaliser("none", "micro_tokens", None,
                       "token mean over each process's micro-batch, averaged over micro-batches and processes"),
    "dapo": _GLOBAL_TOKEN_MEAN,
    "cispo": _GLOBAL_TOKEN_MEAN,
    "vespo": _GLOBAL_TOKEN_MEAN,
}
# Dr. GRPO with ``dr_grpo_token_sum`` (verl's seq-mean-token-sum): TRL's constant 1 / max_completion_length undone.
DR_GRPO_TOKEN_SUM = NORMALISERS["luspo"]

ROW_NORMALISED = frozenset(t for t, n in NORMALISERS.items() if n.counts_rows)
BATCH_TOKEN_NORMALISED = frozenset(t for t, n in NORMALISERS.items() if n.divisor == "batch_tokens")


def normaliser(loss_type: str) -> Normaliser:
    """The table's entry for ``loss_type``; ``KeyError`` names the loss types it knows."""
    try:
        return NORMALISERS[loss_type]
    except KeyError:
        raise KeyError(f"no normaliser for loss_type {loss_type!r}; known: {sorted(NORMALISERS)}") from None


def describe(loss_type: str, dr_grpo_token_sum: bool = False) -> str:
    """The aggregation in words, with verl's name where it has one (the preflight's "loss" line)."""
    n = DR_GRPO_TOKEN_SUM if loss_type == "dr_grpo" and dr_grpo_token_sum else normaliser(loss_type)
    return f"{n.text} (verl {n.verl})" if n.verl else n.text


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, *, max_completion_length: int,
              batch_tokens: torch.Tensor | float | None = None) -> torch.Tensor:
    """The micro-batch loss of ``per_token`` (rows x tokens) under ``mask`` by ``loss_type``'s normaliser, before
    gradient accumulation. ``batch_tokens`` is the divisor of the ``batch_tokens`` types (TRL: the generation batch's
    loss tokens per process, rescaled to one accumulation window by the caller)."""
    n = normaliser(loss_type)
    weighted = per_token * mask
    if n.per_row == "token_mean":
        rows = weighted.sum(-1) / mask.sum(-1).clamp(min=1.0)
    elif n.per_row == "token_sum":
        rows = weighted.sum(-1)
    else:
        rows = None
    if n.divisor == "rows":
        return rows.mean()
    if n.divisor == "rows_x_max_len":
        return weighted.sum() / (per_token.size(0) * max_completion_length)
    if n.divisor == "micro_tokens":
        return weighted.sum() / mask.sum().clamp(min=1.0)
    if batch_tokens is None:
        raise ValueError(f"loss_type {loss_type!r} divides by the generation batch's tokens: pass batch_tokens")
    return weighted.sum() / batch_tokens
