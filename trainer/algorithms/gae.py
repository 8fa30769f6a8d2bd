"""PPO with a learned value function: generalised advantage estimation (Schulman et al. 2016, "High-Dimensional
Continuous Control Using Generalized Advantage Estimation", eq. 16), the clipped value loss and the critic's
diagnostics, written as verl computes them (volcengine/verl@26b5d6b2bbf0202683e49d9999f9174179ab5af3:
verl/trainer/ppo/core_algos.py ``compute_gae_advantage_return`` and ``compute_value_loss``; verl/utils/
torch_functional.py ``masked_whiten``), the code RAGEN-2's PPO rows ran on.

Tensors are (rows, tokens) over the response: ``response_mask`` is 1 on tokens the policy sampled and 0 on padding
and, in a multi-turn trajectory, on the environment's observation tokens between turns. The recursion skips those:
an observation token neither bootstraps a value nor carries a TD error, so the advantage flows across it from the
next model token as if it were not there.

Pure tensor functions, no TRL / accelerate imports.
"""

from __future__ import annotations

import torch

WHITEN_EPS = 1e-8  # verl's masked_whiten: rsqrt(var + 1e-8)
EXPLAINED_VAR_EPS = 1e-5  # verl's metric_utils: Var(R) + 1e-5


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the tokens where ``mask`` is 1 (a scalar)."""
    return (values * mask).sum() / mask.sum()


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (Bessel-corrected) variance of ``values`` over the masked tokens, as verl's ``masked_var``; needs
    at least two masked tokens."""
    count = mask.sum()
    if count < 2:
        raise ValueError(f"the masked variance needs at least 2 tokens (got {int(count)})")
    centred = values - masked_mean(values, mask)
    return masked_mean(centred**2, mask) * count / (count - 1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(values - mean) * rsqrt(var + 1e-8)`` with the mean and unbiased variance over the masked tokens (verl's
    ``masked_whiten``, shift_mean=True). Unmasked tokens are shifted and scaled too; callers mask them."""
    return (values - masked_mean(values, mask)) * torch.rsqrt(masked_var(values, mask) + WHITEN_EPS)


def gae_advantages(token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns, (rows, tokens) each.

    Backwards over the tokens, with ``V_next`` and ``A_next`` the value and advantage of the next *masked* token
    (0 past the last one)::

        delta_t = r_t + gamma * V_next - V_t
        A_t     = delta_t + gamma * lam * A_next        on masked tokens
        A_t     = A_next, V_next unchanged              on unmasked ones (they are skipped)

    ``returns = A + V`` (before whitening: the value targets), then ``A`` is whitened over the mask (masked mean,
    unbiased masked variance). With gamma = lam = 1 (RAGEN's PPO) ``A_t`` before whitening is the sum of the rewards
    from t on minus ``V_t``. No gradient flows (the values are the critic's old predictions).
    """
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        rewards = token_rewards.to(values.dtype)
        rows, tokens = values.shape
        next_value = torch.zeros(rows, dtype=values.dtype, device=values.device)
        next_advantage = torch.zeros_like(next_value)
        advantages = torch.empty_like(values)
        for t in reversed(range(tokens)):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            advantage = delta + gamma * lam * next_advantage
            m = mask[:, t]
            next_value = values[:, t] * m + (1 - m) * next_value
            next_advantage = advantage * m + (1 - m) * next_advantage
            advantages[:, t] = next_advantage
        returns = advantages + values
        return masked_whiten(advantages, mask), returns


def last_token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(rows, tokens) token rewards with each row's scalar score on its last masked token and 0 elsewhere, as verl
    and RAGEN place an outcome reward (the episode's reward at its last response token). A row with no masked token
    gets no reward."""
    mask = response_mask.bool()
    tokens = mask.shape[1]
    positions = torch.arange(tokens, device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).amax(dim=1)  # (rows,), -1 when the row has no masked token
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    has = last >= 0
    rewards[has.nonzero(as_tuple=True)[0], last[has]] = scores[has]
    return rewards


def clipped_value_terms(value_preds: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor,
                        cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's per-token clipped value loss before aggregation, ``0.5 * max((V - R)^2, (clip(V, V_old - c,
    V_old + c) - R)^2)``, and where the clipped term is the larger (bool): the parts every aggregation shares."""
    clipped = torch.clamp(value_preds, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_loss = (value_preds - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped_loss, clipped_loss), clipped_loss > unclipped_loss


def clipped_value_loss(value_preds: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``compute_value_loss`` (token-mean): :func:`clipped_value_terms` averaged over the mask, and the
    fraction of tokens where the clipped term is the larger (``critic/vf_clipfrac``)."""
    mask = response_mask.to(value_preds.dtype)
    per_token, clipped = clipped_value_terms(value_preds, returns, old_values, cliprange_value)
    return masked_mean(per_token, mask), masked_mean(clipped.to(mask.dtype), mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``1 - Var(R - V) / (Var(R) + 1e-5)`` over the masked tokens, unbiased variances (verl's
    ``critic/vf_explained_var``, verl/trainer/ppo/metric_utils.py ``compute_data_metrics``): 1 when the critic
    predicts the returns exactly, 0 when it does no better than their mean."""
    mask = response_mask.to(values.dtype)
    return 1.0 - masked_var(returns - values, mask) / (masked_var(returns, mask) + EXPLAINED_VAR_EPS)
