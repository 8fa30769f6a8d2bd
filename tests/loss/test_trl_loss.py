"""winnow's copy of TRL 1.16's loss (trainer/loss/trl_loss.py) equals TRL's own ``GRPOTrainer._compute_loss``.

The reference is TRL's trainer itself, on the same micro-batch and weights: loss, parameter gradient and every
metric TRL logs, relative 1e-5. The batch makes each term visible: long-tailed completion lengths with a truncated
row and an env span, off-policy old log-probs (ratios != 1, some clipped), a drifted reference (KL != 0),
temperature 0.7, an entropy bonus, and the TRL features that only the unchunked path combines with (two-sided
clipping, off-policy sequence masking, the high-entropy token mask, sequence-level ratios with the KL's bias
correction, VESPO with vLLM ratios). The row scale is checked against TRL's loss on the batch it stands for.
"""

from __future__ import annotations

import math

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, grads_of, prompt_dataset, reward_token_parity
from trl import GRPOConfig, GRPOTrainer

from trainer import ConfigError, WinnowConfig, WinnowGRPOTrainer
from trainer.loss.call import LossCall
from trainer.loss.trl_loss import trl_policy_loss

LENGTHS = [1, 2, 3, 5, 8, 13, 21, 2]
TRUNCATED = 4  # a row with no loss tokens
T = max(LENGTHS)
ARGS = {**BASE_ARGS, "per_device_train_batch_size": len(LENGTHS), "max_completion_length": T, "beta": 0.04,
        "entropy_coef": 0.3, "epsilon_high": 0.28, "temperature": 0.7}


def _batch(trainer) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    B, P = len(LENGTHS), 6
    pad = trainer.processing_class.pad_token_id
    prompt_ids = torch.randint(100, 20000, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :3] = 0  # left padding
    completion_ids = torch.full((B, T), pad)
    completion_mask = torch.zeros(B, T, dtype=torch.long)
    for r, c in enumerate(LENGTHS):
        completion_ids[r, :c] = torch.randint(100, 20000, (c,), generator=g)
        completion_mask[r, :c] = 0 if r == TRUNCATED else 1
    tool_mask = torch.ones_like(completion_mask)
    tool_mask[6, 3:7] = 0
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, T)[0]
    return {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "tool_mask": tool_mask,
        "advantages": torch.randn(B, generator=g),
        "old_per_token_logps": logp + 0.3 * torch.randn(logp.shape, generator=g),
        "sampling_per_token_logps": logp + 0.4 * torch.randn(logp.shape, generator=g),
        "ref_per_token_logps": logp + 0.5 * torch.randn(logp.shape, generator=g),
        "importance_sampling_ratio": 0.5 + torch.rand(logp.shape, generator=g),
        "num_items_in_batch": (completion_mask * tool_mask).sum() * 2,
    }


@pytest.fixture(scope="module")
def pair(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("trl_loss")
    kw = dict(reward_funcs=[reward_token_parity], train_dataset=prompt_dataset(),
              rollout_func=deterministic_rollout_func)
    trl = GRPOTrainer(model=tiny_model, args=GRPOConfig(output_dir=str(out / "trl"), **ARGS), **kw)
    win = WinnowGRPOTrainer(model=tiny_model, args=WinnowConfig(output_dir=str(out / "win"), **ARGS), **kw)
    win.model.load_state_dict(trl.model.state_dict())
    return trl, win, _batch(trl)


def _run(trainer, loss_fn, inputs):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # a micro-step of an accumulation window: the normalisers see it
    trainer.model.zero_grad(set_to_none=True)
    for values in trainer._metrics["train"].values():
        values.clear()
    loss = loss_fn(inputs)
    trainer.accelerator.backward(loss)
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if v}
    return float(loss.detach()), grads_of(trainer.model), metrics


def _ours(win, call=None):
    def fn(inputs):
        c = LossCall() if call is None else call
        loss = trl_policy_loss(win, win.model, inputs, c)
        c.recorder.flush(win.accelerator, win._metrics["train"])
        return loss
    return fn


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= rel * abs(b) + 1e-9


def _assert_equal(ref, got):
    (ref_loss, ref_grads, ref_m), (loss, grads, m) = ref, got
    assert _close(loss, ref_loss), (loss, ref_loss)
    scale = max(float(v.abs().max()) for v in ref_grads.values())
    assert max(float((ref_grads[k] - grads[k]).abs().max()) for k in ref_grads) <= 1e-5 * scale
    m = {k: v for k, v in m.items() if not k.startswith("async/")}  # winnow's own: test_sampler_ratio_by_hand
    assert set(m) == set(ref_m), (set(m) ^ set(ref_m))
    for key in ref_m:
        assert _close(m[key], ref_m[key]), (key, m[key], ref_m[key])


# (loss_type, TRL attributes set on both trainers, GRPOConfig fields set on both configs)
CASES = {
    "grpo": ("grpo", {}, {}),
    "dapo-delta": ("dapo", {}, {"delta": 1.2}),
    "bnpo-off-policy-mask": ("bnpo", {"off_policy_mask_threshold": 0.05}, {}),
    "dr_grpo-top-entropy": ("dr_grpo", {"top_entropy_quantile": 0.4}, {}),
    "grpo-sequence-level": ("grpo", {"importance_sampling_level": "sequence"}, {}),
    "luspo-vllm-ratio": ("luspo", {"use_vllm": True, "vllm_importance_sampling_correction": True}, {}),
    "sapo": ("sapo", {}, {}),
    "cispo-sequence-level": ("cispo", {"importance_sampling_level": "sequence"}, {}),
    "vespo-vllm-ratio": ("vespo", {"use_vllm": True, "vllm_importance_sampling_correction": True}, {}),
    "grpo-no-bias-correction": ("grpo", {}, {"use_bias_correction_kl": False}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_copy_equals_trl_loss_gradient_and_metrics(pair, case):
    trl, win, inputs = pair
    loss_type, attrs, fields = CASES[case]
    saved = [(t, k, getattr(t, k)) for t in (trl, win) for k in ("loss_type", *attrs)]
    saved += [(t.args, k, getattr(t.args, k)) for t in (trl, win) for k in fields]
    try:
        for t in (trl, win):
            t.loss_type = loss_type
            for k, v in attrs.items():
                setattr(t, k, v)
            for k, v in fields.items():
                setattr(t.args, k, v)
        ref = _run(trl, lambda x: trl._compute_loss(trl.model, x), inputs)
        got = _run(win, _ours(win), inputs)
    finally:
        for obj, k, v in saved:
            setattr(obj, k, v)
    assert ref[2]["kl"] > 1e-3 and ref[2]["entropy"] > 0  # the KL and entropy terms are really there
    _assert_equal(ref, got)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "sapo", "luspo"])
def test_row_scale_is_trl_loss_with_scaled_advantages_and_kl(pair, loss_type):
    """A row scale s on a row-normalised loss is TRL's loss with advantages x s and beta x s (both terms linear),
    its entropy bonus and logged means unscaled -- what training on the kept rows of a thinned batch needs."""
    trl, win, inputs = pair
    s = 2.5
    trl.loss_type = win.loss_type = loss_type
    beta = trl.beta
    try:
        trl.beta = beta * s  # the reference: TRL's own loss on the batch the scale stands for
        ref = _run(trl, lambda x: trl._compute_loss(trl.model, {**x, "advantages": x["advantages"] * s}), inputs)
    finally:
        trl.beta = beta
        trl.loss_type = win.loss_type = "grpo"
    win.loss_type = loss_type
    try:
        got = _run(win, _ours(win, LossCall(row_scale=torch.tensor(s))), inputs)
        unscaled = _run(win, _ours(win), inputs)
    finally:
        win.loss_type = "grpo"
    assert abs(unscaled[0] - ref[0]) > 1e-3 * abs(ref[0])  # the scale really changes the loss
    _assert_equal(ref, got)  # the KL estimate, entropy and clip ratios are unscaled in both; the policy loss scaled


def test_sampler_ratio_by_hand(pair):
    """``async/is_ratio/{mean,min,max}`` and ``async/abs_log_ratio/mean`` (trainer/loss/forward.py) are the
    statistics of exp(log pi_theta - log pi_sampler) over the loss tokens (completion mask x tool mask), tokens the
    sampler gave no log-prob (NaN) left out -- by hand from the model's log-probs at the sampling temperature."""
    _, win, inputs = pair
    inputs = dict(inputs)
    sampling = inputs["sampling_per_token_logps"].clone()
    sampling[5, 2] = float("nan")  # a loss token without a sampler log-prob
    inputs["sampling_per_token_logps"] = sampling
    _, _, metrics = _run(win, _ours(win), inputs)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logp = win._get_per_token_logps_and_entropies(win.model, ids, attn, T)[0]
    tokens = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    tokens[5, 2] = False
    log_ratio = (logp - inputs["sampling_per_token_logps"])[tokens].double()
    assert 20 < log_ratio.numel() < int((inputs["completion_mask"] * inputs["tool_mask"]).sum())
    ratio = log_ratio.exp()
    assert _close(metrics["async/is_ratio/mean"], float(ratio.mean()))
    assert _close(metrics["async/abs_log_ratio/mean"], float(log_ratio.abs().mean()))
    assert _close(metrics["async/is_ratio/min"], float(ratio.min()))
    assert _close(metrics["async/is_ratio/max"], float(ratio.max()))
    assert float(ratio.max()) > 1.2 and float(ratio.min()) < 0.8  # the sampler really differs


def test_adaptive_entropy_is_refused_where_winnow_computes_the_loss(tmp_path):
    """TRL's adaptive entropy controller lives in TRL's loss; a thinned row-normalised loss is winnow's copy."""
    with pytest.raises(ConfigError, match="use_adaptive_entropy"):
        WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, use_adaptive_entropy=True, rollout_filter="snr",
                     loss_type="grpo")
    WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, use_adaptive_entropy=True, rollout_filter="snr",
                 loss_type="dapo")  # token-normalised: TRL's own loss, controller included

