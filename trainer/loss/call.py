"""What one loss call gets besides the micro-batch: :class:`LossCall`, and the :class:`LossRecorder` its metrics go to.

Why a recorder instead of TRL's habit (each metric reduced over processes where it is computed): over token-budget
chunks one micro-batch is several loss calls, and ranks may run different numbers of them; the collectives must
run once per micro-step on every rank. So a loss records this process's statistics -- a (sum, count) pair per mean,
a value per rank, a local extreme -- and the caller reduces them once (:meth:`LossRecorder.flush`, two collectives
at most). Sums over chunks are exact: a token mean over the micro-batch is the chunks' summed totals over their
summed counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch


class LossRecorder:
    """This process's statistics of TRL's logged loss metrics, accumulated over one or more loss calls."""

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}  # key -> [sum, count]: a global mean (sum of sums / sum of counts)
        self.per_rank: dict[str, float] = {}  # key -> this rank's value: logged as the mean over ranks (NaN-aware)
        self.extremes: dict[str, tuple[str, float]] = {}  # key -> ("min" | "max", this rank's extreme)
        self.latest: dict[str, float] = {}  # key -> a value logged as it is (e.g. the entropy coefficient)

    def mean(self, key: str, total: torch.Tensor | float, count: torch.Tensor | float) -> None:
        """Add ``total`` over ``count`` items to the global mean logged as ``key``."""
        pair = self.sums.setdefault(key, [0.0, 0.0])
        pair[0] += float(total)
        pair[1] += float(count)

    def trl_mean(self, key: str, x: torch.Tensor, mask: torch.Tensor) -> None:
        """TRL 1.16's ``global_masked_mean`` of ``x`` (trl/trainer/grpo_trainer.py, in ``_compute_loss``): one value
        per row when ``x`` has a single column (sequence-level importance sampling), else a mean over ``mask``."""
        x = x.detach()
        if x.shape[1] == 1:
            self.mean(key, x.sum(), x.shape[0])
        else:
            self.mean(key, (x * mask).sum(), mask.sum())

    def rank_value(self, key: str, value: torch.Tensor | float, weight: float = 1.0) -> None:
        """Add ``weight * value`` to this rank's value of ``key`` (TRL: ``gather(value).nanmean()``)."""
        self.per_rank[key] = self.per_rank.get(key, 0.0) + weight * float(value)

    def extreme(self, key: str, values: torch.Tensor, kind: str) -> None:
        """This rank's NaN-ignoring ``kind`` ("min" / "max") of ``values``, kept over calls (TRL: ``nanmin`` /
        ``nanmax`` of the gathered per-row values)."""
        finite = values.detach().float()
        finite = finite[~finite.isnan()]
        local = float(finite.min() if kind == "min" else finite.max()) if finite.numel() else math.nan
        _, seen = self.extremes.get(key, (kind, math.nan))
        if math.isnan(seen):
            best = local
        elif math.isnan(local):
            best = seen
        else:
            best = min(seen, local) if kind == "min" else max(seen, local)
        self.extremes[key] = (kind, best)

    def flush(self, accelerator: Any, metrics: dict[str, list[float]]) -> None:
        """Reduce everything recorded over processes and append one value per key to ``metrics`` (TRL's metric
        lists); collective: every rank calls it with the same keys. Two collectives at most, none when empty."""
        device = accelerator.device
        world = accelerator.num_processes
        if self.sums:
            keys = sorted(self.sums)
            local = torch.tensor([x for k in keys for x in self.sums[k]], device=device, dtype=torch.float64)
            totals = (accelerator.reduce(local, reduction="sum") if world > 1 else local).view(-1, 2).tolist()
            for k, (s, c) in zip(keys, totals):
                metrics[k].append(s / max(c, 1.0))
        rank_keys, extreme_keys = sorted(self.per_rank), sorted(self.extremes)
        if rank_keys or extreme_keys:
            values = [self.per_rank[k] for k in rank_keys] + [self.extremes[k][1] for k in extreme_keys]
            local = torch.tensor([values], device=device, dtype=torch.float64)
            table = accelerator.gather(local) if world > 1 else local
            for j, k in enumerate(rank_keys + extreme_keys):
                column = table[:, j]
                finite = column[~column.isnan()]
                if not finite.numel():
                    metrics[k].append(math.nan)
                elif k in self.per_rank:
                    metrics[k].append(float(finite.mean()))
                else:
                    metrics[k].append(float(finite.min() if self.extremes[k][0] == "min" else finite.max()))
        for k, value in self.latest.items():
            metrics[k].append(value)
        self.__init__()


@dataclass
class LossCall:
    """The arguments of one loss call besides the micro-batch.

    - ``row_scale``: multiplies the per-token loss (policy and KL terms) of a row-normalised ``loss_type``: batch
      compaction's ``N / N_kept`` (dropped rollouts out of TRL's row count; trainer/pipeline/round.py), times
      ``max_completion_length`` under ``dr_grpo_token_sum``. None: no scale.
    - ``aggregate_entropy``: the entropy bonus takes the policy term's normaliser (``entropy_aggregation:
      loss_type``, and its row scale) instead of TRL's token mean.
    - ``policy_weight`` / ``entropy_weight``: a token-budget chunk's share of the micro-batch's policy normaliser,
      and the ratio of its entropy-bonus share to that (trainer/pipeline/token_budget.py); 1 and 1 unchunked. The
      caller multiplies the loss by ``policy_weight``; the loss multiplies its bonus by ``entropy_weight``.
    - ``chunked``: one of several calls for one micro-batch (never TRL's own loss then: its metrics reduce per call).
    - ``recorder``: where the loss records its logged metrics (:class:`LossRecorder`).
    - ``sampler_ratio``: the policy-to-sampler ratio must be logged (``max_staleness`` > 0: what the staleness
      costs, trainer/loss/forward.py), so winnow's copy of TRL's loss runs: TRL's own hides its log-probs.
    """

    row_scale: torch.Tensor | float | None = None
    aggregate_entropy: bool = False
    policy_weight: float = 1.0
    entropy_weight: float = 1.0
    chunked: bool = False
    recorder: LossRecorder = field(default_factory=LossRecorder)
    sampler_ratio: bool = False

    @property
    def plain(self) -> bool:
        """Whether nothing of winnow changes TRL's loss for this call, so TRL's own ``_compute_loss`` computes it."""
        return self.row_scale is None and not self.aggregate_entropy and not self.chunked and not self.sampler_ratio
