"""The subclass is a drop-in for TRL's ``GRPOTrainer``: the same calls work (no ``args``; a plain ``GRPOConfig``),
every configuration TRL accepts trains with the stages off, and training equals TRL's over whole optimizer steps
with the default guards on -- several steps per generation batch (old log-probs computed, ratio != 1 after the
first update) and a reference model the policy moves away from (KL and its gradient non-zero)."""

from __future__ import annotations

import warnings

import pytest
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_length, reward_token_parity
from trl import GRPOConfig, GRPOTrainer

from trainer import WinnowConfig, WinnowGRPOTrainer

# TRL accepts this; 8 micro-steps per generation batch over 3 per optimizer step = 2.67 optimizer steps per batch.
UNALIGNED = dict(gradient_accumulation_steps=3, steps_per_generation=8, save_strategy="steps")


def _grpo_fields(cfg) -> dict:
    """GRPOConfig's fields (logging_dir holds a timestamp)."""
    return {k: v for k, v in cfg.to_dict().items() if k in GRPOConfig.__dataclass_fields__ and k != "logging_dir"}


def _stages_off(cfg) -> bool:
    selectors = (cfg.rollout_filter, cfg.rollout_dropout, cfg.advantage, cfg.loss_variant)
    return selectors == ("none", "none", "grpo", "none") and not (cfg.dynamic_sampling or cfg.collapse_detection)


def test_no_args_builds_trls_default_config(tiny_model, tmp_path, monkeypatch):
    """TRL's default config says bf16, which TrainingArguments refuses on a machine without a GPU -- for TRL and
    for the subclass alike (same error, not a TypeError); with bf16 allowed both build the same config."""
    monkeypatch.chdir(tmp_path)
    for cls in (GRPOTrainer, WinnowGRPOTrainer):
        with pytest.raises(ValueError, match="bf16"):
            cls(tiny_model, reward_token_parity, train_dataset=prompt_dataset())
    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda *a, **k: True)
    trl = GRPOTrainer(tiny_model, reward_token_parity, train_dataset=prompt_dataset())
    win = WinnowGRPOTrainer(tiny_model, reward_token_parity, train_dataset=prompt_dataset())
    assert isinstance(win.args, WinnowConfig) and _stages_off(win.args)
    assert _grpo_fields(win.args) == _grpo_fields(trl.args) and win.args.output_dir.endswith("-GRPO")


def test_a_plain_grpo_config_is_converted_with_every_stage_off(tiny_model, tmp_path):
    cfg = GRPOConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "per_device_train_batch_size": 4, **UNALIGNED})
    win = WinnowGRPOTrainer(tiny_model, reward_token_parity, args=cfg, train_dataset=prompt_dataset())
    assert isinstance(win.args, WinnowConfig) and _stages_off(win.args)
    assert _grpo_fields(win.args) == _grpo_fields(cfg)
    assert win.args.skip_nonfinite_steps and win._numerics is not None  # the default guards are on
    with pytest.raises(TypeError, match="WinnowConfig"):
        WinnowGRPOTrainer(tiny_model, reward_token_parity, args=object())


def test_unaligned_save_steps_warn_naming_the_fix(tmp_path):
    """TRL's default save_steps 500 with 2.67 optimizer steps per generation batch is accepted with a warning that
    names the fix; save_steps on a batch boundary (8, 24, 48: integer arithmetic, no float modulo) pass silently."""
    base = dict(output_dir=str(tmp_path), **{**BASE_ARGS, **UNALIGNED})
    with pytest.warns(UserWarning, match=r"save_steps: 500 .*multiple of 8"):
        WinnowConfig(**base, save_steps=500)
    for steps in (8, 24, 48):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            WinnowConfig(**base, save_steps=steps)
        assert not [w for w in seen if "save_steps" in str(w.message)]
    with pytest.warns(UserWarning, match="multiple of 4"):  # 4 micro-steps per batch, 1 per optimizer step
        WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "steps_per_generation": 4, "save_strategy": "steps",
                                                  "save_steps": 6})


def _train(cls, cfg_cls, model, out, **overrides):
    args = cfg_cls(output_dir=str(out), **{**BASE_ARGS, "per_device_train_batch_size": 4, "max_steps": 2,
                                           "beta": 0.04, "save_steps": 500, **UNALIGNED, **overrides})
    trainer = cls(model=model, reward_funcs=[reward_token_parity, reward_length], args=args,
                  train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer.train()
    return trainer, {n: p.detach() - before[n] for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize("config", ["grpo_config", "winnow_config"])
def test_off_means_off_over_whole_optimizer_steps(tiny_model, tmp_path, config):
    """Two optimizer steps of 3 micro-batches each (the second off-policy, against a drifted reference), default
    guards on, a save_steps TRL accepts: the weight updates equal TRL's."""
    trl, trl_delta = _train(GRPOTrainer, GRPOConfig, tiny_model, tmp_path / "trl")
    cfg_cls = GRPOConfig if config == "grpo_config" else WinnowConfig
    win, win_delta = _train(WinnowGRPOTrainer, cfg_cls, tiny_model, tmp_path / "win")
    assert win.state.global_step == trl.state.global_step == 2
    kl = [h["kl"] for h in trl.state.log_history if "kl" in h]
    assert kl[-1] > 0  # the reference has drifted by the second step
    scale = max(float(d.abs().max()) for d in trl_delta.values())
    assert scale > 0
    assert max(float((win_delta[n] - trl_delta[n]).abs().max()) for n in trl_delta) <= 1e-5 * scale
