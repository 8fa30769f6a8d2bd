"""RAGEN-2 template-collapse diagnostics: mutual-information proxies from an in-batch cross-score matrix.

Paper: "RAGEN-2" (arXiv:2604.06268), section 3.2 (H(Z) = I(X;Z) + H(Z|X); the retrieval and
``I_token`` proxies), section 3.5 (the released ``CollapseDetector``) and section 5.3 (MI-ZScore is the
MI-family metric that tracks task success best). Definitions follow the RAGEN reference notes
(``ragen.md`` section 2.5) where they are more precise than the paper. Pure tensor functions (no TRL /
accelerate imports).

The input is the cross-score matrix ``L`` (N, P): ``L[n, j] = log q(z_n | x_j)``, the teacher-forced
log-likelihood of reasoning trace z_n after prompt x_j, and ``true_prompt_ids`` (N,), the column of
each trace's own prompt. The same function serves both variants of the paper: pass the per-token mean
log-probs for the token-level metrics, or the summed sequence log-probs for the ``_seq`` ones (the
caller namespaces the keys); :func:`cross_log_prob_matrices` builds both from per-pair sums.

Columns must be distinct prompts: the caller deduplicates identical prompt token sequences (the
reference instead treats such columns as equivalent during retrieval). With duplicates, a trace's
own prompt is tied with its copy and the tie-aware retrieval below scores it as half a hit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def _check(L: torch.Tensor, true_prompt_ids: torch.Tensor, ks: Sequence[int], zscore_eps: float) -> None:
    if not isinstance(L, torch.Tensor) or L.dim() != 2:
        shape = tuple(getattr(L, "shape", ()))
        raise ValueError(f"cross_log_probs must be a 2-D (N_samples, P) tensor, got shape {shape}")
    N, P = L.shape
    if P < 2:
        raise ValueError(f"mutual information needs at least 2 distinct prompts (columns), got P={P}")
    if N < 1:
        raise ValueError("cross_log_probs has no rows (N_samples=0)")
    if not L.is_floating_point():
        raise ValueError(f"cross_log_probs must be a floating tensor, got {L.dtype}")
    if not bool(torch.isfinite(L).all()):
        raise ValueError("cross_log_probs must be finite (found NaN or +-inf)")
    ids = true_prompt_ids
    if not isinstance(ids, torch.Tensor) or ids.shape != (N,):
        raise ValueError(f"true_prompt_ids must be a ({N},) tensor, got shape {tuple(getattr(ids, 'shape', ()))}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"true_prompt_ids must be an integer tensor, got {ids.dtype}")
    if bool(((ids < 0) | (ids >= P)).any()):
        got = f"[{int(ids.min())}, {int(ids.max())}]"
        raise ValueError(f"true_prompt_ids must lie in [0, {P}), got values in {got}")
    if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks must be positive integers, got {tuple(ks)}")
    if not (zscore_eps > 0 and math.isfinite(zscore_eps)):
        raise ValueError(f"zscore_eps must be a finite positive number, got {zscore_eps}")


def cross_log_prob_matrices(
    token_logp_sums: torch.Tensor, token_counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token and sequence cross-score matrices from summed token log-probs (reference section 2.3).

    ``L_sum[n, j] = sum_t log q(z_n,t | x_j, z_n,<t)`` and ``L_mean = L_sum / T_n``: the trace z_n is the
    same whatever prompt precedes it, so its token count T_n does not depend on j.

    Args:
        token_logp_sums: (N, P) summed log-probs of each trace's tokens under each prompt.
        token_counts: (N,) or (N, P) number of scored tokens, all > 0 (empty traces are the caller's to drop).
    Returns:
        ``(L_mean, L_sum)``, both float64 (N, P).
    """
    if token_logp_sums.dim() != 2:
        raise ValueError(f"token_logp_sums must be (N, P), got shape {tuple(token_logp_sums.shape)}")
    counts = token_counts.to(torch.float64)
    if counts.dim() == 1:
        counts = counts.unsqueeze(1)  # (N, 1): one count per trace, shared by every column
    if counts.shape not in ((token_logp_sums.shape[0], 1), tuple(token_logp_sums.shape)):
        shapes = f"token_counts {tuple(token_counts.shape)} vs token_logp_sums {tuple(token_logp_sums.shape)}"
        raise ValueError(f"{shapes}: shapes do not match (need (N,) or (N, P) counts)")
    if not bool((counts > 0).all()):
        raise ValueError("token_counts must be > 0: a trace with no scored tokens has no per-token log-prob")
    L_sum = token_logp_sums.to(torch.float64)
    return L_sum / counts, L_sum


def _topk_hit(L: torch.Tensor, matched: torch.Tensor, k: int) -> torch.Tensor:
    """Per-row probability that the true column is among the k best under a uniformly random tie-break.

    With ``a`` columns scoring strictly above the true one and ``t`` (>= 1, itself included) tied with
    it, a random tie-break puts the true column uniformly at ranks a+1 .. a+t, so the hit probability
    is ``clamp(k - a, 0, t) / t``. This makes the metric invariant to column order, and identical
    columns score exactly k/P (chance) -- a plain argmax would credit whichever column comes first.
    """
    above = (L > matched.unsqueeze(1)).sum(dim=1)
    tied = (L == matched.unsqueeze(1)).sum(dim=1)
    return (k - above).clamp(min=0).minimum(tied).to(torch.float64) / tied


def mi_metrics(
    cross_log_probs: torch.Tensor,
    true_prompt_ids: torch.Tensor,
    ks: Sequence[int] = (2, 4, 8),
    zscore_eps: float = 1e-3,
) -> dict[str, float]:
    """MI-family collapse metrics of one cross-score matrix (section 3.2, section 3.5; reference section 2.5).

    With ``matched_n = L[n, true(n)] = l_true(z_n)`` and ``marginal_n = l_mix(z_n) = logsumexp_j L[n, j]
    - log P`` (the trace's likelihood under a uniform mixture over the batch prompts):

    - ``mi_estimate`` = mean_n(matched_n - marginal_n), the in-batch estimate I_hat of I(X; Z) (the
      paper's I_token on per-token scores). It is <= log P (``mi_upper_bound``), because matched_n <=
      logsumexp_j L[n, j]; it can be negative when traces are likelier under other prompts.
    - ``conditional_entropy`` = -mean(matched) ~ H(Z|X); ``reasoning_entropy`` = -mean(marginal) ~ H(Z);
      these estimates satisfy H(Z) = I(X;Z) + H(Z|X) by construction (up to rounding).
      ``matched_log_prob_mean`` and ``marginal_log_prob_mean`` are the raw means.
    - ``marginal_std``: population std (ddof 0) of marginal over rows; ``mi_zscore`` =
      mean_n[(matched_n - marginal_n) / (marginal_std + zscore_eps)], the MI-ZScore of section 5.3.
    - ``retrieval_accuracy``: fraction of traces whose best-scoring prompt is their own, ties counted as
      the expected hit of a random tie-break (:func:`_topk_hit`); ``retrieval_chance_level`` = 1/P (what
      template collapse drives it to), ``retrieval_above_chance`` = accuracy - 1/P.
    - for each k in ``ks`` with k < P: ``retrieval_at_{k}`` (true prompt among the k best, same tie rule),
      ``retrieval_chance_at_{k}`` = k/P, ``retrieval_above_chance_at_{k}``. The reference clips k to P
      instead; at k >= P the hit rate is 1 = chance whatever the policy, so those keys are omitted.

    Args:
        cross_log_probs: (N, P) float, ``L[n, j] = log q(z_n | x_j)``: per-token mean log-probs, or summed
            sequence log-probs for the ``_seq`` variant. Columns are distinct prompts, P >= 2.
        true_prompt_ids: (N,) integer, the column of each trace's own prompt.
        ks: cut-offs of the top-k retrieval metrics.
        zscore_eps: added to ``marginal_std`` in the z-score denominator (reference ``std_eps``).
    Returns:
        dict of python floats, computed in float64 whatever the input dtype.
    Raises:
        ValueError: non-2-D or non-finite L, P < 2, N = 0, ids of the wrong shape/dtype or out of range,
            non-positive ks or zscore_eps.
    """
    _check(cross_log_probs, true_prompt_ids, ks, zscore_eps)
    L = cross_log_probs.to(torch.float64)
    ids = true_prompt_ids.to(device=L.device, dtype=torch.long)
    N, P = L.shape
    log_P = math.log(P)
    matched = L.gather(1, ids.unsqueeze(1)).squeeze(1)
    # logsumexp relative to the row max: the gap matched - marginal is formed from O(1) terms, not as
    # the difference of two ~1e3-sized sequence log-probs (no cancellation in the _seq matrix), and is
    # exactly 0 for identical columns and exactly <= log P (matched - row_max <= 0, shifted lse >= 0).
    row_max = L.amax(dim=1)
    shifted_lse = torch.log(torch.exp(L - row_max.unsqueeze(1)).sum(dim=1))
    gap = (matched - row_max) - shifted_lse + log_P
    marginal = row_max + shifted_lse - log_P
    marginal_std = marginal.std(unbiased=False) if N > 1 else torch.zeros((), dtype=torch.float64)

    out = {
        "mi_estimate": float(gap.mean()),
        "mi_upper_bound": log_P,
        "conditional_entropy": float(-matched.mean()),
        "reasoning_entropy": float(-marginal.mean()),
        "matched_log_prob_mean": float(matched.mean()),
        "marginal_log_prob_mean": float(marginal.mean()),
        "marginal_std": float(marginal_std),
        "mi_zscore": float((gap / (marginal_std + zscore_eps)).mean()),
    }
    accuracy = float(_topk_hit(L, matched, 1).mean())
    out["retrieval_accuracy"] = accuracy
    out["retrieval_chance_level"] = 1.0 / P
    out["retrieval_above_chance"] = accuracy - 1.0 / P
    for k in ks:
        if k >= P:
            continue
        hit = float(_topk_hit(L, matched, k).mean())
        out[f"retrieval_at_{k}"] = hit
        out[f"retrieval_chance_at_{k}"] = k / P
        out[f"retrieval_above_chance_at_{k}"] = hit - k / P
    return out


def signature_retrieval(
    cross_log_probs: torch.Tensor,
    true_columns: torch.Tensor,
    column_signatures: torch.Tensor,
    ks: Sequence[int] = (2, 4, 8),
) -> dict[str, float]:
    """Retrieval when several columns hold the same prompt, as RAGEN scores its multi-turn sample
    (mll-lab-nu/RAGEN@20daedc ragen/trainer/collapse_metrics.py:610-691, the ``col_signatures`` branch): a trace is
    retrieved when its best-scoring column (top-k columns) carries the same prompt as its own column.

    - ``retrieval_accuracy``: mean over rows of [sig(argmax_j L[n, j]) == sig(true_n)];
    - ``retrieval_chance_level``: mean over rows of (#columns with the row's own signature) / P;
      ``retrieval_above_chance`` = accuracy - chance;
    - for each k < P: ``retrieval_at_{k}`` (own signature among the k best columns), chance min(1, chance x k),
      ``retrieval_above_chance_at_{k}``.

    Args:
        cross_log_probs: (N, P) float, ``L[n, j] = log q(z_n | x_j)``; columns may repeat a prompt.
        true_columns: (N,) integer, each row's own column.
        column_signatures: (P,) integer, equal for columns holding the same prompt.
        ks: cut-offs of the top-k metrics.
    Returns:
        dict of python floats.
    """
    L = cross_log_probs.to(torch.float64)
    N, P = L.shape
    if P < 2 or column_signatures.shape != (P,) or true_columns.shape != (N,):
        raise ValueError(f"signature_retrieval needs (N, P>=2) scores, ({N},) true columns and ({P},) signatures")
    sig = column_signatures.to(device=L.device, dtype=torch.long)
    own = sig[true_columns.to(device=L.device, dtype=torch.long)]
    counts = torch.bincount(sig, minlength=int(sig.max()) + 1)
    chance = float((counts[own].to(torch.float64) / P).mean())
    accuracy = float((sig[L.argmax(dim=1)] == own).to(torch.float64).mean())
    out = {"retrieval_accuracy": accuracy, "retrieval_chance_level": chance,
           "retrieval_above_chance": accuracy - chance}
    for k in ks:
        if k >= P:
            continue
        top = sig[torch.topk(L, k, dim=1).indices]
        hit = float((top == own.unsqueeze(1)).any(dim=1).to(torch.float64).mean())
        out[f"retrieval_at_{k}"] = hit
        out[f"retrieval_chance_at_{k}"] = min(1.0, chance * k)
        out[f"retrieval_above_chance_at_{k}"] = hit - min(1.0, chance * k)
    return out
