"""The entropy bonus aggregated with the policy loss's mode (issue 20 item 7): RAGEN's actor computes
``agg_loss(entropy, response_mask, loss_agg_mode)`` (mll-lab-nu/RAGEN@20daedc ragen/workers/actor/dp_actor.py:
442-446), verl's agg_loss being: token-mean = Σ H·m / Σ m; seq-mean-token-mean = mean over rows of (Σ_t H·m / Σ_t m);
seq-mean-token-sum = mean over rows of Σ_t H·m. The expected bonus is written from those formulas on entropies
recomputed here from the model's logits (softmax entropy, at the sampling temperature)."""

from __future__ import annotations

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity, tiny_model_path

from trainer.config.core import ConfigError, WinnowConfig


def verl_agg(h: torch.Tensor, m: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "token-mean":
        return (h * m).sum() / m.sum()
    if mode == "seq-mean-token-mean":
        return ((h * m).sum(-1) / m.sum(-1)).mean()
    return (h * m).sum(-1).mean()  # seq-mean-token-sum


def test_verl_agg_hand_case():
    h = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert [float(verl_agg(h, m, k))
            for k in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")] == [2.5, 3.0, 5.0]


def entropies_from_logits(trainer, inputs) -> torch.Tensor:
    """Per-token entropy of the policy's next-token distribution over the completion, from raw logits."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attn).logits[:, :-1] / trainer.temperature
    logits = logits[:, -inputs["completion_ids"].size(1):]
    logp = torch.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("loss_type, mode, scale", [("dr_grpo", "seq-mean-token-sum", "max_len"),
                                                    ("grpo", "seq-mean-token-mean", 1)])
def test_bonus_is_aggregated_like_the_policy_term(tmp_path, loss_type, mode, scale):
    """Advantages zeroed: the loss is the entropy term alone, -c x verl's aggregate (dr_grpo: over
    max_completion_length, the constant TRL's dr_grpo policy term carries too). With 'token_mean' it is TRL's."""
    from trainer.grpo_trainer import WinnowGRPOTrainer

    coef = 0.5
    losses = {}
    for aggregation in ("loss_type", "token_mean"):
        args = WinnowConfig(output_dir=str(tmp_path / aggregation), **{**BASE_ARGS, "max_completion_length": 12},
                            loss_type=loss_type, entropy_coef=coef, entropy_aggregation=aggregation,
                            scale_rewards="none" if loss_type == "dr_grpo" else "group")
        trainer = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity], args=args,
                                    train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
        trainer.model.train()
        inputs = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        inputs["advantages"] = torch.zeros_like(inputs["advantages"])
        trainer.current_gradient_accumulation_steps = 1
        losses[aggregation] = float(trainer.compute_loss(trainer.model, inputs))
        h = entropies_from_logits(trainer, inputs)
        m = inputs["completion_mask"] * inputs["tool_mask"]
    lengths = m.sum(-1)
    assert lengths.min() != lengths.max()  # unequal lengths, so the three modes differ
    divisor = 12 if scale == "max_len" else 1
    assert losses["loss_type"] == pytest.approx(-coef * float(verl_agg(h, m, mode)) / divisor, rel=1e-4)
    assert losses["token_mean"] == pytest.approx(-coef * float(verl_agg(h, m, "token-mean")), rel=1e-4)


def test_loss_type_aggregation_refuses_the_adaptive_controller(tmp_path):
    with pytest.raises(ConfigError, match="entropy_aggregation"):
        WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, entropy_aggregation="loss_type", use_adaptive_entropy=True)
