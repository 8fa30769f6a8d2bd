"""DAPO's data-side pieces (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv 2503.14476): the dynamic-sampling group rule (§3.2, eq. 11's constraint ``0 < |{o_i : correct}| < G``)
and overlong reward shaping (§3.4, eq. 13). Clip-higher (§3.1) and the token-level loss (§3.3) are TRL's
``epsilon_high`` and ``loss_type: dapo``.

Pure tensor/number functions, no TRL / accelerate imports.
"""

from __future__ import annotations

import torch

from trainer.algorithms.grpo import group_view


def mixed_groups(values: torch.Tensor, G: int) -> torch.Tensor:
    """DAPO's dynamic-sampling rule (§3.2, eq. 11): keep a prompt group iff its metric is not constant.

    For a 0/1 (or +-1) accuracy this is exactly ``0 < #correct < G``; for a total reward it keeps every group
    with a non-zero reward spread (verl's ``filter_groups`` keeps ``std > 0``). NaN values (rollouts no reward
    function scored) are left out; a group with fewer than two finite values is dropped. Returns (P,) bool."""
    g = group_view(values.double(), G)
    finite = torch.isfinite(g)
    big, small = torch.tensor(float("inf"), dtype=g.dtype), torch.tensor(float("-inf"), dtype=g.dtype)
    hi = torch.where(finite, g, small).amax(dim=1)
    lo = torch.where(finite, g, big).amin(dim=1)
    return (finite.sum(dim=1) >= 2) & (hi > lo)
