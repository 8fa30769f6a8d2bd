"""Covariance-based loss variants: Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of
Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617, §4.2).

Pure tensor functions, no TRL / accelerate imports. All inputs are per-token tensors (N, T) of *one*
micro-step's rows gathered from every process (the caller gathers), with ``mask`` the loss mask (1 = a
valid model token). Formulas follow the paper and the authors' released code (verl's
``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov`` in ``verl/trainer/ppo/core_algos.py``):

- token covariance (paper §4.2, the centred product whose batch mean is the first-order entropy change of
  §3, Lemma 1): ``Cov_k = (A_k - mean A) * (log pi_k - mean log pi)`` with both means over the valid tokens
  and the log-probs detached;
- Clip-Cov: among valid tokens with ``lb < Cov < ub`` that PPO did not already clip, a random
  ``max(floor(r * N_valid), 1)`` have their gradient cut (loss x 0) but stay in the token normaliser;
- KL-Cov: the top ``max(floor(k * N_valid), 1)`` valid tokens by Cov get ``+ beta * |log pi - log pi_old|``;
  no PPO clipping anywhere (every token's surrogate is the plain ``-A * r``).

Improvements over the released code, both about determinism across processes (the released code selects per
micro-batch *per GPU*, with an unseeded ``randperm``): the caller pools every process's micro-batch, and the
Clip-Cov draw orders the candidates by covariance before a seeded permutation, so the chosen set depends only on
the tokens' values and the seed -- not on how rows were shuffled or dealt over processes.
"""

from __future__ import annotations

import torch


def token_covariance(A: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cov_k = (A_k - mean A)(log pi_k - mean log pi) per token (Cui et al. §4.2), means over valid tokens.

    ``A`` is (N,) per rollout or (N, T) per token; ``logp`` (N, T) is detached here. Returns (N, T) float64
    with 0 at invalid positions (callers select with ``mask``; 0 is never a candidate of a positive lb).
    """
    valid = mask.bool()
    A_tok = (A.unsqueeze(1) if A.dim() == 1 else A).expand_as(logp).detach().double()
    lp = logp.detach().double()
    n = valid.sum().clamp(min=1)
    mean_A = torch.where(valid, A_tok, 0).sum() / n
    mean_lp = torch.where(valid, lp, 0).sum() / n
    return torch.where(valid, (A_tok - mean_A) * (lp - mean_lp), torch.zeros_like(lp))


def selection_count(ratio: float, num_valid: int) -> int:
    """Tokens to select: ``max(floor(ratio * N_valid), 1)`` as the released code (0 when nothing is valid)."""
    return max(int(ratio * num_valid), 1) if num_valid > 0 else 0


def clipped_surrogate_terms(
    ratio: torch.Tensor, A: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two per-token terms of PPO's clipped surrogate loss (Schulman et al. 2017, Eq. 7, negated to a loss):
    ``(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``. ``A``: (N,) per sequence or (N, T) per token. The one
    place the surrogate is written; :func:`clipped_surrogate` and :func:`ppo_clipped` read it."""
    A_tok = A.unsqueeze(1) if A.dim() == 1 else A
    return -A_tok * ratio, -A_tok * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)


def clipped_surrogate(ratio: torch.Tensor, A: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """PPO's clipped surrogate loss per token, ``max(-A r, -A clip(r)) = -min(r A, clip(r) A)`` as TRL writes it
    (negation is exact in floating point, so both spellings give the same bits)."""
    return torch.maximum(*clipped_surrogate_terms(ratio, A, eps_low, eps_high))


def ppo_clipped(ratio: torch.Tensor, A: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """Tokens whose clipped surrogate is the active (larger-loss) term, i.e. PPO already stopped their
    gradient: ``-A * clip(r) > -A * r``. Bool (N, T)."""
    pg1, pg2 = clipped_surrogate_terms(ratio, A, eps_low, eps_high)
    return pg2 > pg1


def clip_cov_selection(
    cov: torch.Tensor,
    mask: torch.Tensor,
    already_clipped: torch.Tensor,
    ratio: float,
    lb: float,
    ub: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Clip-Cov's token choice (Cui et al. §4.2, "Clip-Cov"): candidates are valid, not PPO-clipped tokens with
    ``lb < Cov < ub``; ``selection_count(ratio, N_valid)`` of them (or all, if fewer) are drawn uniformly.

    The candidates are ordered by covariance (stable) before a permutation drawn from ``generator``, so the
    result is a function of the token values and the generator state only. Returns bool (N, T)."""
    valid = mask.bool()
    candidate = valid & ~already_clipped & (cov > lb) & (cov < ub)
    n = min(selection_count(ratio, int(valid.sum())), int(candidate.sum()))
    selected = torch.zeros_like(valid)
    if n == 0:
        return selected
    flat = candidate.flatten().nonzero().squeeze(1)
    order = torch.sort(cov.flatten()[flat].cpu(), stable=True).indices  # canonical order, independent of layout
    pick = torch.randperm(flat.numel(), generator=generator)[:n]
    selected.view(-1)[flat[order[pick].to(flat.device)]] = True
    return selected


def kl_cov_selection(cov: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """KL-Cov's token choice (Cui et al. §4.2, "KL-Cov"): the ``selection_count(ratio, N_valid)`` valid tokens
    with the largest covariance (ties broken by value-stable sort). Returns bool (N, T)."""
    valid = mask.bool()
    n = selection_count(ratio, int(valid.sum()))
    selected = torch.zeros_like(valid)
    if n == 0:
        return selected
    flat = valid.flatten().nonzero().squeeze(1)
    order = torch.sort(cov.flatten()[flat], descending=True, stable=True).indices[:n]
    selected.view(-1)[flat[order]] = True
    return selected


def clip_cov_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    A: torch.Tensor,
    selected: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> torch.Tensor:
    """Per-token Clip-Cov loss: ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high)) * (1 - selected)``, r = exp(log pi -
    log pi_old). The selected tokens contribute 0 loss and 0 gradient; they still count in the normaliser the
    caller applies (the paper's token-mean over all valid tokens)."""
    loss = clipped_surrogate(torch.exp(logp - old_logp), A, eps_low, eps_high)
    return loss * (~selected).to(loss.dtype)


def kl_cov_token_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, A: torch.Tensor, selected: torch.Tensor, beta: float
) -> torch.Tensor:
    """Per-token KL-Cov loss: ``-A r + beta * |log pi - log pi_old| * selected`` -- no clipping, so a token whose
    ratio is far outside any clip range still gets the policy gradient."""
    A_tok = A.unsqueeze(1) if A.dim() == 1 else A
    r = torch.exp(logp - old_logp)
    return -A_tok * r + beta * (logp - old_logp).abs() * selected.to(logp.dtype)
