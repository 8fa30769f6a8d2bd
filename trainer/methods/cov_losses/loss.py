"""``loss_variant: clip_cov | kl_cov`` -- Cui et al. 2025's covariance-based losses as TRL micro-batch losses.

Each replaces TRL's ``_compute_loss`` for one micro-batch: the policy forward and everything after the per-token
surrogate are TRL's conventions (trainer/methods/surrogate.py); the token covariance and the token choice are
computed on this micro-step's rows pooled over *every* process (one gather, no grad), so all ranks choose the same
global token set; each rank then trains its own rows. Aggregation is TRL's normaliser for ``loss_type`` (dapo =
token mean over the generation batch, grpo = per-sequence mean, bnpo, dr_grpo), TRL's reference KL (``beta``), vLLM
importance-sampling correction and static entropy bonus are kept, and batch compaction's row scale is honoured.
The formulas live in trainer/algorithms/losses.py.

Random choices (Clip-Cov) come from a generator seeded by (``seed``, optimizer step, micro-step), identical on
every rank and across resume.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from trainer import trl_contact
from trainer.algorithms.losses import (
    clip_cov_selection,
    clip_cov_token_loss,
    kl_cov_selection,
    kl_cov_token_loss,
    ppo_clipped,
    token_covariance,
)
from trainer.config.errors import ConfigError
from trainer.loss.call import LossCall
from trainer.loss.forward import policy_forward
from trainer.methods.surrogate import finish, validate_surrogate_variant
from trainer.pipeline.batch import gather_padded
from trainer.pipeline.stages import register_config_check, register_stage

SelectionHook = Callable[[dict[str, torch.Tensor]], None]
_hooks: list[SelectionHook] = []


def add_selection_hook(hook: SelectionHook) -> None:
    """Call ``hook`` with every global token choice (``selected``, ``cov``, ``mask`` over the pooled micro-step)
    -- for tests and debugging; hooks see what every rank computed."""
    _hooks.append(hook)


def micro_step_generator(trainer: Any) -> torch.Generator:
    """Seeded by (seed, optimizer step, micro-step in the accumulation window): the same on every rank, and on
    resume (both counters are restored)."""
    micro = trainer.generation_buffer.micro_step % max(trainer.args.gradient_accumulation_steps, 1)
    seed = (int(trainer.args.seed) * 1_000_003 + int(trainer.state.global_step) * 1_009 + micro) % (2**63)
    return torch.Generator().manual_seed(seed)


def _pool(trainer: Any, t: torch.Tensor) -> torch.Tensor:
    """This micro-step's (B, T) rows from every process, right-padded to the longest T (collective)."""
    return gather_padded(trainer.accelerator, t.contiguous(), 0)


def _local(trainer: Any, t: torch.Tensor, B: int, T: int) -> torch.Tensor:
    rank = trainer.accelerator.process_index
    return t[rank * B : (rank + 1) * B, :T]


def cov_loss(trainer: Any, model: Any, inputs: dict[str, Any], call: LossCall, variant: str) -> torch.Tensor:
    """One micro-batch of Clip-Cov (``variant='clip_cov'``) or KL-Cov (``'kl_cov'``); see the module docstring."""
    if not trainer.model.training:
        return trl_contact.trl_loss(trainer, model, inputs)  # evaluation loss: the plain surrogate, no token choice
    args = trainer.args
    p = policy_forward(trainer, model, inputs, call.recorder)
    logp, mask, A_tok, old = p.logp, p.mask, p.A, p.old
    ratio = torch.exp(logp.detach() - old)
    eps_low, eps_high = trainer.epsilon_low, trainer.epsilon_high

    # Global choice over this micro-step's rows of every process (gathered, no grad).
    B, T = logp.shape
    g_mask, g_A, g_logp = _pool(trainer, mask.float()), _pool(trainer, A_tok.float()), _pool(trainer, logp.detach())
    cov = token_covariance(g_A, g_logp, g_mask)
    if variant == "clip_cov":
        g_clipped = _pool(trainer, ppo_clipped(ratio, A_tok, eps_low, eps_high).to(torch.uint8)).bool()
        g_selected = clip_cov_selection(
            cov,
            g_mask,
            g_clipped,
            args.clip_cov_ratio,
            args.clip_cov_lb,
            args.clip_cov_ub,
            micro_step_generator(trainer),
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
    loss = finish(trainer, p, per_token_loss, inputs, call)

    metrics = trl_contact.metrics(trainer)
    n_valid = max(float(g_mask.sum()), 1.0)
    metrics[f"{variant}/selected_frac"].append(float(g_selected.sum()) / n_valid)
    metrics[f"{variant}/candidate_frac"].append(float(candidates) / n_valid)
    metrics[f"{variant}/cov_mean"].append(float((cov * g_mask).sum()) / n_valid)
    if variant == "kl_cov":
        call.recorder.mean("kl_cov/abs_log_ratio_mean", ((logp.detach() - old).abs() * mask).sum(), mask.sum())
    else:
        metrics["clip_cov/ppo_clip_frac"].append(float((g_clipped & g_mask.bool()).sum()) / n_valid)
    return loss


@register_config_check
def validate_cov_fields(args: Any) -> None:
    """The ``clip_cov_*`` / ``kl_cov_*`` fields, checked whether or not a covariance loss is selected."""
    for name in ("clip_cov_ratio", "kl_cov_ratio"):
        if not 0 < getattr(args, name) <= 1:
            raise ConfigError(name, f"must be in (0, 1] (got {getattr(args, name)})", "use a fraction, e.g. 2e-4")
    if not args.clip_cov_lb < args.clip_cov_ub:
        raise ConfigError(
            "clip_cov_ub",
            f"must exceed clip_cov_lb (got lb={args.clip_cov_lb}, ub={args.clip_cov_ub})",
            "e.g. 1 and 5",
        )
    if args.kl_cov_coef < 0:
        raise ConfigError("kl_cov_coef", f"must be >= 0 (got {args.kl_cov_coef})", "use e.g. 1.0")


# Not chunkable: the token choice is taken over the whole micro-step, so token-budget chunks would change it.
@register_stage("loss_variant", "clip_cov", metric_prefix="clip_cov", validate=validate_surrogate_variant,
                chunkable=False)
def clip_cov_loss(trainer: Any, model: Any, inputs: dict[str, Any], call: LossCall) -> torch.Tensor:
    """Clip-Cov (Cui et al. 2025 §4.2): cut the gradient of a random ``clip_cov_ratio`` share of the tokens whose
    covariance lies in (``clip_cov_lb``, ``clip_cov_ub``) and that PPO did not clip."""
    return cov_loss(trainer, model, inputs, call, "clip_cov")


@register_stage("loss_variant", "kl_cov", metric_prefix="kl_cov", validate=validate_surrogate_variant,
                chunkable=False)
def kl_cov_loss(trainer: Any, model: Any, inputs: dict[str, Any], call: LossCall) -> torch.Tensor:
    """KL-Cov (Cui et al. 2025 §4.2): unclipped policy gradient plus ``kl_cov_coef * |log pi - log pi_old|`` on
    the top ``kl_cov_ratio`` share of tokens by covariance."""
    return cov_loss(trainer, model, inputs, call, "kl_cov")
