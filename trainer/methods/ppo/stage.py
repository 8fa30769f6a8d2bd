"""``advantage: gae``: PPO's advantage from a learned critic (trainer/algorithms/gae.py), its row input and checks.

The critic's values of every new generation batch are a row input (``old_values``, computed on each process's rows
before the pipeline and gathered). The stage places each rollout's total reward on its last loss token (RAGEN-2 and
verl's outcome reward), runs verl's masked GAE over the kept rollouts' loss tokens (observation tokens of a
multi-turn episode are skipped) and hands the loss two per-token inputs: the old values and the returns the critic
regresses on. Logged under ``critic/``: the values, returns and advantages, and verl's explained variance.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.algorithms.gae import explained_variance, gae_advantages, last_token_rewards, masked_mean
from trainer.config.errors import ConfigError
from trainer.methods.ppo.critic import HOOK_KEY
from trainer.pipeline.batch import RolloutBatch
from trainer.pipeline.stages import StageResult, register_config_check, register_input, register_stage


def old_values_input(trainer: Any, output: dict[str, Any], needs: frozenset[str], computed: dict[str, Any]):
    """This rank's rows of the critic's values before the update (``old_values``, rows x completion tokens)."""
    critic = trainer.hook(HOOK_KEY)
    values = critic.old_values(output, rows_per_forward=trainer.args.per_device_train_batch_size)
    mask = output["completion_mask"]
    return {"old_values": values * mask.to(values.dtype)}


register_input("old_values", old_values_input, phase="critic_values")


def _gae(batch: RolloutBatch, args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages, returns, values, mask) over ``batch``'s loss tokens, float32, zero outside the mask: each
    rollout's total reward on its last loss token (an unscored one earns nothing), verl's GAE from the old values."""
    mask = batch.mask.float()
    values = batch.extras["old_values"][:, : mask.shape[1]].float() * mask
    rewards = last_token_rewards(torch.nan_to_num(batch.R.float(), nan=0.0), mask)
    advantages, returns = gae_advantages(rewards, values, mask, args.gae_gamma, args.gae_lambda)
    return advantages * mask, returns * mask, values, mask


def _loss_inputs(batch: RolloutBatch, args: Any) -> dict[str, torch.Tensor]:
    """The critic's per-token targets for every micro-batch: the old values and the returns. Returns are computed
    on the whole batch: GAE's recursion runs within a row, so a row's returns do not depend on which rows are kept
    (only the advantages' whitening does)."""
    _, returns, values, _ = _gae(batch, args)
    return {"old_values": values, "returns": returns}


@register_stage("advantage", "gae", needs=frozenset({"old_values"}), metric_prefix="critic",
                loss_inputs=_loss_inputs)
def gae_stage(batch: RolloutBatch, args: Any) -> StageResult:
    """Per-token GAE advantages (whitened over the kept loss tokens) from the critic's old values."""
    advantages, returns, values, mask = _gae(batch, args)  # the estimator sees the kept groups only
    metrics = {}
    if mask.sum() > 1:
        metrics = {"values_mean": float(masked_mean(values, mask)), "returns_mean": float(masked_mean(returns, mask)),
                   "advantages_mean": float(masked_mean(advantages, mask)),
                   "vf_explained_var": float(explained_variance(values, returns, mask))}
    return StageResult(advantages=advantages, metrics=metrics)


@register_config_check
def check_ppo(args: Any) -> None:
    """PPO's recipe checks: what a learned critic does not compose with, refused before weights load."""
    if getattr(args, "advantage", None) != "gae":
        return
    if args.rollout_dropout != "none":
        raise ConfigError("rollout_dropout", f"{args.rollout_dropout!r} recenters group-relative advantages; the "
                          "critic's GAE advantages have no group baseline", "use rollout_dropout: none with "
                          "advantage: gae")
    if args.fp16:
        raise ConfigError("fp16", "the critic keeps float32 weights with no loss scaler of its own",
                          "train PPO with bf16 (or float32)")
    if args.cliprange_value <= 0:
        raise ConfigError("cliprange_value", f"must be > 0, got {args.cliprange_value}", "verl's default is 0.5")
    if not 0 <= args.gae_gamma <= 1 or not 0 <= args.gae_lambda <= 1:
        raise ConfigError("gae_gamma", f"gamma and lambda must lie in [0, 1], got {args.gae_gamma}, "
                          f"{args.gae_lambda}", "RAGEN-2 runs gamma = lambda = 1")
