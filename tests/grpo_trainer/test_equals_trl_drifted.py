"""Every "equals TRL" equivalence on the batch where it can fail: a drifted reference (ref != policy, so the k3
KL and its gradient are non-zero) and off-policy old log-probs (ratio != 1, some tokens outside the clip range),
for every loss type and every loss variant, with TRL 1.16's ``use_bias_correction_kl`` on (TRL's default: k3 x
ratio) and off (verl's low_var_kl). The reference is TRL's own ``GRPOTrainer._compute_loss`` on the same
micro-batch; each variant is put in the setting where it reduces to TRL's surrogate exactly:

- ``none``: TRL's loss through the subclass (off means off);
- ``clip_cov`` with an empty covariance band: no token is cut, so it is TRL's clipped surrogate;
- ``kl_cov`` with ``kl_cov_coef: 0``: the unclipped ``-A r``, i.e. TRL's surrogate with a clip range nothing reaches;
- ``naive_hybrid`` with ``opd_coef: 0``: the OPD surrogate vanishes, leaving TRL's surrogate.

The KL, the normaliser for ``loss_type``, the entropy bonus and the logged ``kl`` come from the variant's own code
(trainer/methods/surrogate.py), so a KL that differs from TRL's shows here. Removed-means-removed (a compacted batch
equals TRL on the kept rows alone) is checked on the same kind of drifted, off-policy micro-batch.
"""

from __future__ import annotations

import pytest
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    kept_rows_only,
    loss_and_grads,
    prompt_dataset,
    reward_length,
    reward_token_parity,
)
from trl import GRPOConfig, GRPOTrainer

from trainer import StageResult, WinnowConfig, WinnowGRPOTrainer, register_stage
from trainer.methods.uecr.baselines import TEACHER_DELTA_KEY

LOSS_TYPES = ["grpo", "dapo", "dr_grpo", "bnpo"]
VARIANTS = {  # variant -> (winnow args, TRL's clip range override)
    "none": ({}, None),
    "clip_cov": ({"clip_cov_lb": 1e8, "clip_cov_ub": 1e9, "clip_cov_ratio": 0.5}, None),
    "kl_cov": ({"kl_cov_coef": 0.0}, 1e6),
    "naive_hybrid": ({"opd_coef": 0.0}, None),
}
ROWS = 8


@pytest.fixture(scope="module")
def pair(tiny_model, tmp_path_factory):
    """TRL's trainer and the subclass on the same model (beta != 0, entropy bonus on), and a micro-batch TRL
    generated, moved off-policy and away from the reference."""
    out = tmp_path_factory.mktemp("drifted")
    common = {**BASE_ARGS, "per_device_train_batch_size": ROWS, "beta": 0.04, "entropy_coef": 0.01,
              "epsilon_high": 0.28}
    trl = GRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, reward_length],
                      args=GRPOConfig(output_dir=str(out / "trl"), **common), train_dataset=prompt_dataset(),
                      rollout_func=deterministic_rollout_func)
    win = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, reward_length],
                            args=WinnowConfig(output_dir=str(out / "win"), **common), train_dataset=prompt_dataset(),
                            rollout_func=deterministic_rollout_func)
    trl.model.train()
    torch.manual_seed(1234)
    inputs = trl._prepare_inputs(next(iter(trl.get_train_dataloader())))
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logp = trl._get_per_token_logps_and_entropies(trl.model, ids, attn, inputs["completion_ids"].size(1))[0]
    g = torch.Generator().manual_seed(7)
    inputs = {
        **inputs,
        "old_per_token_logps": logp + 0.3 * torch.randn(logp.shape, generator=g),  # ratio != 1, some clipped
        "ref_per_token_logps": logp + 0.5 * torch.randn(logp.shape, generator=g),  # drifted reference
        TEACHER_DELTA_KEY: torch.randn(logp.shape, generator=g),
    }
    return trl, win, inputs


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest gradient difference relative to the largest gradient entry."""
    scale = max(float(v.abs().max()) for v in a.values())
    return max(float((a[k] - b[k]).abs().max()) for k in a) / scale


_TRL_CACHE: dict = {}


def _trl_loss(trl, inputs, loss_type, bias_correction, epsilon):
    """TRL's loss, gradients and logged kl for one setting (computed once per setting: CPU time is scarce)."""
    key = (loss_type, bias_correction, epsilon)
    if key not in _TRL_CACHE:
        _TRL_CACHE[key] = _run_trl(trl, inputs, loss_type, bias_correction, epsilon)
    return _TRL_CACHE[key]


def _run_trl(trl, inputs, loss_type, bias_correction, epsilon):
    saved = trl.loss_type, trl.epsilon_low, trl.epsilon_high
    trl.loss_type, trl.args.use_bias_correction_kl = loss_type, bias_correction
    if epsilon is not None:
        trl.epsilon_low = trl.epsilon_high = epsilon
    try:
        return (*loss_and_grads(trl, inputs), trl._metrics["train"]["kl"][-1])
    finally:
        trl.loss_type, trl.epsilon_low, trl.epsilon_high = saved


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_equals_trl_with_drifted_reference_and_off_policy_ratios(pair, loss_type, variant):
    trl, win, inputs = pair
    overrides, trl_epsilon = VARIANTS[variant]
    results = {}
    for bias_correction in (True, False):
        ref_loss, ref_grads, ref_kl = _trl_loss(trl, inputs, loss_type, bias_correction, trl_epsilon)
        saved = {k: getattr(win.args, k) for k in ("loss_variant", "use_bias_correction_kl", *overrides)}
        win.loss_type = loss_type
        for k, v in {"loss_variant": variant, "use_bias_correction_kl": bias_correction, **overrides}.items():
            setattr(win.args, k, v)
        try:
            win_loss, win_grads = loss_and_grads(win, inputs)
            win_kl = win._metrics["train"]["kl"][-1]
        finally:
            for k, v in saved.items():
                setattr(win.args, k, v)
        assert abs(float(win_loss - ref_loss)) <= 1e-6 * abs(float(ref_loss)) + 1e-9, (bias_correction, win_loss,
                                                                                      ref_loss)
        assert _rel(ref_grads, win_grads) <= 1e-5, bias_correction
        assert abs(win_kl - ref_kl) <= 1e-6 * abs(ref_kl) and ref_kl > 1e-3  # the logged kl is TRL's, and not zero
        results[bias_correction] = ref_grads
    # the two KL forms really differ here, so an implementation of the wrong one cannot pass
    assert _rel(results[True], results[False]) > 1e-3


DROPPED = [1, 2, 6, 8, 9, 10, 11, 15]  # global rows of a 16-row batch; rows 8-11 are a whole group


@register_stage("rollout_dropout", "test_drop_fixed_drifted")
def _drop_fixed(batch, args) -> StageResult:
    keep = torch.ones(batch.N, dtype=torch.bool)
    keep[DROPPED] = False
    return StageResult(keep=keep)


@pytest.mark.parametrize("compact_batch", [True, False])
def test_removed_means_removed_with_drifted_reference_and_off_policy_ratios(tiny_model, tmp_path, compact_batch):
    """Dropping rollouts == TRL's loss on the kept rollouts alone, for every loss type, on a micro-batch whose old
    log-probs and reference differ from the policy (the trainer's rows' values, sliced). Masked (compact_batch
    False), the row-normalised losses carry the MicroBatch's row_scale = N/K = 2, which must scale the KL term too."""
    common = {**BASE_ARGS, "per_device_train_batch_size": 16, "beta": 0.04}
    win = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, reward_length],
                            args=WinnowConfig(output_dir=str(tmp_path / "win"),
                                              rollout_dropout="test_drop_fixed_drifted",
                                              compact_batch=compact_batch, **common),
                            train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
    trl = GRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, reward_length],
                      args=GRPOConfig(output_dir=str(tmp_path / "trl"), **common), train_dataset=prompt_dataset(),
                      rollout_func=deterministic_rollout_func)
    win.model.train()
    torch.manual_seed(1234)
    inputs = win._prepare_inputs(next(iter(win.get_train_dataloader())))
    g = torch.Generator().manual_seed(3)
    shape = inputs["completion_ids"].shape
    inputs = inputs.with_values(  # a MicroBatch: its row scale travels with it
        old_per_token_logps=inputs["ref_per_token_logps"] + 0.3 * torch.randn(shape, generator=g),
        ref_per_token_logps=inputs["ref_per_token_logps"] + 0.5 * torch.randn(shape, generator=g))
    sliced, kept = kept_rows_only(inputs)
    assert int(kept.sum()) == 16 - len(DROPPED)
    for loss_type in LOSS_TYPES:
        win.loss_type = trl.loss_type = loss_type
        win_loss, win_grads = loss_and_grads(win, inputs)
        ref_loss, ref_grads = loss_and_grads(trl, sliced)
        assert abs(float(win_loss - ref_loss)) <= 1e-6 * abs(float(ref_loss)), loss_type
        assert _rel(ref_grads, win_grads) <= 1e-5, loss_type
        assert trl._metrics["train"]["kl"][-1] > 1e-3
