"""The global batch every stage sees: one generation batch, gathered from all processes.

Stages make group decisions, so they must see whole groups; TRL splits a generation batch across
processes and micro-steps, so the trainer gathers it first and every rank builds the same
``RolloutBatch`` (and therefore makes the same decisions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from trainer.algorithms.grpo import group_index, group_view, total_reward


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
