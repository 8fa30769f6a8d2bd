"""Loss variants keep TRL's MoE router load-balancing loss: on a tiny random Qwen3-MoE (TRL enables the aux loss for
any config with ``output_router_logits`` and a non-zero ``router_aux_loss_coef``), Clip-Cov with an empty covariance
band is TRL's loss exactly -- aux term included -- and the aux term is not negligible there."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from harness import BASE_ARGS, deterministic_rollout_func, loss_and_grads, prompt_dataset, reward_token_parity
from trl import GRPOConfig, GRPOTrainer

from trainer import WinnowConfig, WinnowGRPOTrainer


def _tiny_moe(tiny_model: str, out: Path) -> str:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=151936, hidden_size=16, intermediate_size=32, moe_intermediate_size=16,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.5, tie_word_embeddings=False)
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).save_pretrained(str(out))
    for f in Path(tiny_model).iterdir():
        if f.name not in ("config.json", "model.safetensors"):  # tokenizer, chat template, generation config
            shutil.copyfile(f, out / f.name)
    return str(out)


def test_loss_variants_keep_the_router_aux_loss(tiny_model, tmp_path):
    model = _tiny_moe(tiny_model, tmp_path / "moe")
    common = {**BASE_ARGS, "beta": 0.0}

    def build(cls, cfg_cls, **extra):
        return cls(model=model, reward_funcs=reward_token_parity, train_dataset=prompt_dataset(),
                   args=cfg_cls(output_dir=str(tmp_path / cls.__name__), **common, **extra),
                   rollout_func=deterministic_rollout_func)

    trl = build(GRPOTrainer, GRPOConfig)
    win = build(WinnowGRPOTrainer, WinnowConfig, loss_variant="clip_cov", clip_cov_lb=1e8, clip_cov_ub=1e9)
    assert trl.aux_loss_enabled and win.aux_loss_enabled
    trl.model.train()
    torch.manual_seed(1234)
    inputs = trl._prepare_inputs(next(iter(trl.get_train_dataloader())))
    trl_loss, trl_grads = loss_and_grads(trl, inputs)
    aux = trl._metrics["train"]["aux_loss"][-1]
    win_loss, win_grads = loss_and_grads(win, inputs)
    assert abs(float(win_loss - trl_loss)) <= 1e-6 * abs(float(trl_loss))
    assert abs(0.5 * aux) > 1e-3 * abs(float(trl_loss))  # the aux term is a visible part of the loss
    scale = max(float(g.abs().max()) for g in trl_grads.values())
    assert max(float((win_grads[k] - trl_grads[k]).abs().max()) for k in trl_grads) <= 1e-5 * scale
    assert win._metrics["train"]["aux_loss"][-1] == aux
