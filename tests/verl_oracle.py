"""verl's vanilla dual-clip PPO policy loss per token, transcribed from verl (verl/trainer/ppo/core_algos.py
``compute_policy_loss``, the loss both the GRPODropout fork and RAGEN's actor call: RAGEN's verl submodule
volcengine/verl@d62da49 core_algos.py:856-881): the reference the recipes' TRL losses are checked against."""

from __future__ import annotations

import torch


def verl_dual_clip_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, A: torch.Tensor, eps_low: float,
                              eps_high: float, clip_ratio_c: float) -> torch.Tensor:
    """Per-token loss before aggregation: PPO's clipped surrogate, and for A < 0 at most -A x clip_ratio_c."""
    ratio = torch.exp(torch.clamp(logp - old_logp, min=-20.0, max=20.0))
    pg_losses1 = -A * ratio
    pg_losses2 = -A * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -A * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    return torch.where(A < 0, clip_pg_losses2, clip_pg_losses1)
