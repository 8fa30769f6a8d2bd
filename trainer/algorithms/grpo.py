"""Group statistics shared by every method: group views and the GRPO advantage.

Pure tensor functions (no TRL / accelerate imports). Rows are ordered group by group: rows
``[g*G, (g+1)*G)`` are the G rollouts of prompt group ``g`` -- the order TRL's ``RepeatSampler`` and
``accelerator.gather`` produce on the global batch.

NaN rewards mark *unscorable* rollouts (every reward function returned ``None``); they are left out of
their group's statistics and get advantage 0, exactly as TRL does.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

StdKind = Literal["unbiased", "population"]  # WinnowConfig.advantage_std's type: the one list of options
STD_KINDS: tuple[str, ...] = get_args(StdKind)
SCALE_KINDS = ("group", "batch", "none")


def group_view(x: torch.Tensor, G: int) -> torch.Tensor:
    """Reshape a per-rollout tensor (N, ...) to (P, G, ...) with P = N / G prompt groups."""
    if x.shape[0] % G != 0:
        raise ValueError(f"{x.shape[0]} rollouts do not split into groups of G={G}")
    return x.view(x.shape[0] // G, G, *x.shape[1:])


def group_index(N: int, G: int, device: torch.device | None = None) -> torch.Tensor:
    """Group id of each of N rollouts, (N,) long: ``[0]*G + [1]*G + ...``."""
    return torch.arange(N, device=device) // G


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False, std: str = "unbiased") -> torch.Tensor:
    """Standard deviation ignoring NaNs.

    ``std="unbiased"`` applies Bessel's correction (NaN when fewer than 2 finite values), which is
    TRL's ``nanstd``; ``std="population"`` divides by the count (ddof = 0), as UECR's F.4 and the
    RAGEN-2 variance formula specify. Operation order follows TRL's so results agree bit for bit.
    """
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    if std == "unbiased":
        count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
        correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
        variance = variance * correction
    out = torch.sqrt(variance)
    if not keepdim:
        out = out.squeeze() if dim is None else out.squeeze(dim)
    return out


def grpo_advantages(
    R: torch.Tensor,
    G: int,
    scale_rewards: str = "group",
    std: str = "unbiased",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO group-relative advantage (DeepSeekMath eq. for outcome supervision; TRL's default).

    ``A_i = (R_i - mean_{j in group} R_j) / (sigma + eps)`` with sigma the group std
    (``scale_rewards="group"``), the std over the whole batch (``"batch"``), or no division
    (``"none"``, Dr. GRPO). ``std`` picks the estimator (TRL: unbiased; population = ddof 0).

    Args:
        R: (N,) total reward per rollout; NaN = unscorable (excluded from the statistics, A = 0).
        G: group size (``num_generations``).
    Returns:
        ``(A, sigma)``: advantages (N,) and the std each row was scaled by (N,) (also returned for
        ``"none"``, for zero-std telemetry).
    """
    if scale_rewards not in SCALE_KINDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_KINDS}, got {scale_rewards!r}")
    mean = torch.nanmean(group_view(R, G), dim=1).repeat_interleave(G, dim=0)
    if scale_rewards == "batch":
        sigma = nanstd(R, std=std).expand_as(R) if R.numel() > 1 else torch.zeros_like(R)
    elif G > 1:
        sigma = nanstd(group_view(R, G), dim=1, std=std).repeat_interleave(G, dim=0)
    else:
        sigma = torch.zeros_like(R)
    A = R - mean
    if scale_rewards != "none":
        A = A / (sigma + eps)
    return torch.nan_to_num(A, nan=0.0), sigma


def normalize_then_sum_advantages(
    R_k: torch.Tensor,
    weights: torch.Tensor,
    G: int,
    std: str = "unbiased",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-reward GRPO advantage of GDPO/TRL's ``normalize_then_sum`` aggregation.

    Each reward function's column is normalised within its group, the normalised columns are summed
    with ``weights``, and the sum is normalised over the batch.

    Args:
        R_k: (N, K) rewards per function (NaN = that function did not score that rollout).
        weights: (K,) reward weights.
    Returns:
        ``(A, sigma)`` as in :func:`grpo_advantages` (sigma is the batch std of the weighted sum).
    """
    grouped = group_view(R_k, G)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True, std=std) if G > 1 else torch.zeros_like(mean_k)
    z = ((grouped - mean_k) / (std_k + eps)).view(-1, R_k.shape[1])
    S = (z * weights.to(z.device).unsqueeze(0)).nansum(dim=1)
    S[torch.isnan(R_k).all(dim=1)] = torch.nan
    sigma = nanstd(S, std=std).expand_as(S) if S.numel() > 1 else torch.zeros_like(S)
    A = (S - torch.nanmean(S)) / (sigma + eps)
    return torch.nan_to_num(A, nan=0.0), sigma


def total_reward(R_k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum of the per-function rewards (N, K) -> (N,); NaN where no function scored the row."""
    R = (R_k * weights.to(R_k.device).unsqueeze(0)).nansum(dim=1)
    R[torch.isnan(R_k).all(dim=1)] = torch.nan
    return R
