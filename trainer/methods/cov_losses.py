"""``loss_variant: clip_cov | kl_cov`` -- Cui et al. 2025's covariance-based losses as TRL micro-batch losses.

Each replaces TRL's ``_compute_loss`` for one micro-batch: the policy forward is TRL's own
(``_get_per_token_logps_and_entropies``); the token covariance and the token choice are computed on this
micro-step's rows pooled over *every* process (one gather, no grad), so all ranks choose the same global token
set; each rank then trains its own rows. Aggregation is TRL's normaliser for ``loss_type`` (dapo = token mean
over the generation batch, grpo = per-sequence mean, bnpo, dr_grpo), TRL's reference KL (``beta``), vLLM
importance-sampling correction and static entropy bonus are kept, and batch compaction's row scale is honoured.
The formulas live in trainer/algorithms/losses.py.

Random choices (Clip-Cov) come from a generator seeded by (``seed``, optimizer step, micro-step), identical on
every rank and across resume.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..algorithms.losses import (
    clip_cov_selection,
    clip_cov_token_loss,
    kl_cov_selection,
    kl_cov_token_loss,
    ppo_clipped,
    token_covariance,
)
from ..rollout_batch import gather_padded
from ..stages import register_stage

# TRL loss types whose normaliser this module reproduces (the others change the surrogate itself).
SUPPORTED_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
ROW_NORMALISED = frozenset({"grpo", "dr_grpo"})  # compaction's winnow_loss_scale applies to these
# TRL features whose interaction with a replaced surrogate is undefined; rejected at config time.
UNSUPPORTED_WITH_COV = {
    "top_entropy_quantile": (1.0, "Beyond-80/20 token masking is a separate baseline"),
    "off_policy_mask_threshold": (None, "off-policy sequence masking"),
    "importance_sampling_level": ("token", "sequence-level importance ratios"),
    "use_adaptive_entropy": (False, "the adaptive entropy controller"),
    "delta": (None, "two-sided (dual) clipping; Clip-Cov clips as PPO does and KL-Cov does not clip"),
}
SelectionHook = Callable[[dict[str, torch.Tensor]], None]
_hooks: list[SelectionHook] = []


def add_selection_hook(hook: SelectionHook) -> None:
    """Call ``hook`` with every global token choice (``selected``, ``cov``, ``mask`` over the pooled micro-step)
    -- for tests and debugging; hooks see what every rank computed."""
    _hooks.append(hook)


def micro_step_generator(trainer: Any) -> torch.Generator:
    """Seeded by (seed, optimizer step, micro-step in the accumulation window): the same on every rank, and on
    resume (both counters are restored)."""
    micro = trainer._step % max(trainer.args.gradient_accumulation_steps, 1)
    seed = (int(trainer.args.seed) * 1_000_003 + int(trainer.state.global_step) * 1_009 + micro) % (2**63)
    return torch.Generator().manual_seed(seed)


def _pool(trainer: Any, t: torch.Tensor) -> torch.Tensor:
    """This micro-step's (B, T) rows from every process, right-padded to the longest T (collective)."""
    return gather_padded(trainer.accelerator, t.contiguous(), 0)


def _local(trainer: Any, t: torch.Tensor, B: int, T: int) -> torch.Tensor:
    rank = trainer.accelerator.process_index
    return t[rank * B : (rank + 1) * B, :T]


def normalise(trainer: Any, per_token_loss: torch.Tensor, mask: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
    """TRL's aggregation of a per-token loss for ``loss_type`` (train mode), including gradient accumulation."""
    args, loss_type = trainer.args, trainer.loss_type
    accum = trainer.current_gradient_accumulation_steps
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accum
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / accum
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * trainer.max_completion_length) / accum
    if loss_type == "dapo":
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
        normalizer = normalizer * accum / args.steps_per_generation
        return (per_token_loss * mask).sum() / normalizer
    raise ValueError(f"loss_variant {args.loss_variant!r} supports loss_type {SUPPORTED_LOSS_TYPES}, not {loss_type!r}")


def cov_loss(trainer: Any, model: Any, inputs: dict[str, Any], variant: str) -> torch.Tensor:
    """One micro-batch of Clip-Cov (``variant='clip_cov'``) or KL-Cov (``'kl_cov'``); see the module docstring."""
    if not trainer.model.training:
        return trainer.trl_compute_loss(model, inputs)  # evaluation loss: the plain surrogate, no token choice
    args = trainer.args
    prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
    mask = inputs["completion_mask"] * inputs.get("tool_mask", torch.ones_like(inputs["completion_mask"]))
    logp, entropies, _ = trainer._get_per_token_logps_and_entropies(
        model,
        torch.cat([prompt_ids, completion_ids], dim=1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
        completion_ids.size(1),
        compute_entropy=True,
    )
    A = inputs["advantages"]
    A_tok = (A.unsqueeze(1) if A.dim() == 1 else A).expand_as(logp)
    old = inputs.get("old_per_token_logps")
    old = logp.detach() if old is None else old
    ratio = torch.exp(logp.detach() - old)
    eps_low, eps_high = trainer.epsilon_low, trainer.epsilon_high

    # Global choice over this micro-step's rows of every process (gathered, no grad).
    B, T = logp.shape
    g_mask, g_A, g_logp = _pool(trainer, mask.float()), _pool(trainer, A_tok.float()), _pool(trainer, logp.detach())
    cov = token_covariance(g_A, g_logp, g_mask)
    if variant == "clip_cov":
        g_clipped = _pool(trainer, ppo_clipped(ratio, A_tok, eps_low, eps_high).to(torch.uint8)).bool()
        g_selected = clip_cov_selection(
            cov, g_mask, g_clipped, args.clip_cov_ratio, args.clip_cov_lb, args.clip_cov_ub, micro_step_generator(trainer)
        )
        candidates = (g_mask.bool() & ~g_clipped & (cov > args.clip_cov_lb) & (cov < args.clip_cov_ub)).sum()
    else:
        g_selected = kl_cov_selection(cov, g_mask, args.kl_cov_ratio)
        candidates = g_mask.sum()
    for hook in _hooks:
        hook({"selected": g_selected.clone(), "cov": cov.clone(), "mask": g_mask.clone()})
    selected = _local(trainer, g_selected, B, T)

    if variant == "clip_cov":
        per_token_loss = clip_cov_token_loss(logp, old, A_tok, selected, eps_low, eps_high)
    else:
        per_token_loss = kl_cov_token_loss(logp, old, A_tok, selected, args.kl_cov_coef)
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction:
        per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
    if trainer.beta != 0.0:
        ref = inputs["ref_per_token_logps"]
        per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1  # TRL's k3 estimator
        per_token_loss = per_token_loss + trainer.beta * per_token_kl
        trainer._metrics["train"]["kl"].append(_global_mean(trainer, per_token_kl, mask))
    scale = inputs.get("winnow_loss_scale")
    if scale is not None and trainer.loss_type in ROW_NORMALISED:
        per_token_loss = per_token_loss * scale  # dropped rollouts out of the row count (see compaction.py)
    loss = normalise(trainer, per_token_loss, mask, inputs)
    entropy_coef = getattr(trainer, "entropy_coef", args.entropy_coef)
    if entropy_coef:
        loss = loss - entropy_coef * (entropies * mask).sum() / mask.sum().clamp(min=1.0) / (
            trainer.current_gradient_accumulation_steps
        )

    metrics = trainer._metrics["train"]
    metrics["entropy"].append(_global_mean(trainer, entropies, mask))
    n_valid = max(float(g_mask.sum()), 1.0)
    metrics[f"{variant}/selected_frac"].append(float(g_selected.sum()) / n_valid)
    metrics[f"{variant}/candidate_frac"].append(float(candidates) / n_valid)
    metrics[f"{variant}/cov_mean"].append(float((cov * g_mask).sum()) / n_valid)
    if variant == "kl_cov":
        metrics["kl_cov/abs_log_ratio_mean"].append(_global_mean(trainer, (logp.detach() - old).abs(), mask))
    else:
        metrics["clip_cov/ppo_clip_frac"].append(float((g_clipped & g_mask.bool()).sum()) / n_valid)
    return loss


def _global_mean(trainer: Any, x: torch.Tensor, mask: torch.Tensor) -> float:
    totals = trainer.accelerator.reduce(torch.stack([(x.detach() * mask).sum(), mask.sum().float()]), reduction="sum")
    return float(totals[0] / totals[1].clamp(min=1.0))


@register_stage("loss_variant", "clip_cov", metric_prefix="clip_cov")
def clip_cov_loss(trainer: Any, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """Clip-Cov (Cui et al. 2025 §4.2): cut the gradient of a random ``clip_cov_ratio`` share of the tokens whose
    covariance lies in (``clip_cov_lb``, ``clip_cov_ub``) and that PPO did not clip."""
    return cov_loss(trainer, model, inputs, "clip_cov")


@register_stage("loss_variant", "kl_cov", metric_prefix="kl_cov")
def kl_cov_loss(trainer: Any, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """KL-Cov (Cui et al. 2025 §4.2): unclipped policy gradient plus ``kl_cov_coef * |log pi - log pi_old|`` on
    the top ``kl_cov_ratio`` share of tokens by covariance."""
    return cov_loss(trainer, model, inputs, "kl_cov")
