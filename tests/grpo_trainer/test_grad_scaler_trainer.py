"""Skipped optimizer steps under an fp16 GradScaler, through the whole trainer (HF Trainer's own loop).

accelerate builds a GradScaler only for fp16 on a GPU, so on this CPU the trainer gets the one accelerate would build
(``torch.amp.GradScaler``, the CPU device's) and accelerate's fp16 flags before ``train()`` prepares the model and
optimizer: the loss is scaled in ``accelerator.backward``, HF's gradient norm unscales through the scaler, the
AcceleratedOptimizer steps through ``scaler.step`` / ``update``, and the model runs under CPU fp16 autocast. What only
a GPU shows (CUDA fp16 kernels) is not here; tests/gpu/test_grad_scaler_skip.py holds the callbacks to accelerate's
own overflow step with the objects alone.

Checked against what the scaler itself does: an empty step (every group filtered) leaves weights, Adam's state, the LR
schedule and the scaler's scale and growth tracker exactly as the step before left them, while scaler.step would
otherwise assert that no inf check was recorded (no gradients) or grow the scale; a non-finite gradient backs the scale
off once, as the scaler's own overflow step does, not twice.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from harness import (
    BASE_ARGS,
    StepSnapshots,
    deterministic_rollout_func,
    prompt_dataset,
    reward_parity_flat_at,
    reward_token_parity,
    same_state,
    tiny_model_path,
)

from trainer import WinnowConfig, WinnowGRPOTrainer

INIT_SCALE = 2.0**10


@contextmanager
def fp16_scaler(trainer):
    """The trainer's accelerator as accelerate configures fp16 on a GPU (accelerator.py: ``native_amp``, a
    GradScaler, ``mixed_precision == "fp16"`` in the shared state), with the CPU's GradScaler; growth every step, so
    a step the scaler counts as taken shows in its scale. The shared state is put back afterwards."""
    acc = trainer.accelerator
    state = acc.state
    saved = state._mixed_precision
    acc.scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=1)
    acc.native_amp = True
    state._mixed_precision = "fp16"
    try:
        yield acc.scaler
    finally:
        state._mixed_precision = saved


def _trainer(tmp_path, reward_funcs, **overrides):
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "max_steps": 4, "lr_scheduler_type": "linear",
                                                      "weight_decay": 0.1, **overrides})
    return WinnowGRPOTrainer(model=str(tiny_model_path()), reward_funcs=reward_funcs, args=args,
                             train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_empty_steps_under_a_scaler_change_nothing(tmp_path, max_grad_norm):
    """Steps 2 and 3 filter every group: they run only zero-weight rows (so the scaler has gradients to check) and
    are skipped; step 4 trains. At ``max_grad_norm`` 0 HF still unscales, to read the gradient norm (a second
    unscale in the skip raised there)."""
    tr = _trainer(tmp_path, [reward_parity_flat_at(2, 3)], rollout_filter="snr", snr_value=0.9,
                  max_grad_norm=max_grad_norm, empty_batch_stop_steps=0)
    snaps = StepSnapshots(tr)
    tr.add_callback(snaps)
    with fp16_scaler(tr) as scaler:
        tr.train()
        assert tr.optimizer.scaler is scaler, "the optimizer must step through the scaler (else the test is void)"
        assert hasattr(tr.model, "_original_forward"), "accelerate wraps the forward in fp16 autocast under native_amp"
    step1, step2, step3, step4 = snaps.after
    assert step1["scaler"]["scale"] == INIT_SCALE * 2, "step 1 is a scaler step: growth_interval 1 doubles the scale"
    assert step1["optimizer"]["state"], "Adam state exists after step 1"
    for empty in (step2, step3):
        assert same_state(step1["params"], empty["params"]), "weights moved on an empty step"
        assert same_state(step1["optimizer"], empty["optimizer"]), "the optimizer's state moved on an empty step"
        assert empty["lr"] == step1["lr"] and same_state(step1["scheduler"], empty["scheduler"])
        assert empty["scaler"] == step1["scaler"], "an empty step is no scaler step: scale and tracker unchanged"
    assert not same_state(step3["params"], step4["params"]), "training did not resume"
    assert step4["lr"] < step3["lr"] and step4["scaler"]["scale"] == INIT_SCALE * 4
    assert all(bool(torch.isfinite(p).all()) for p in tr.model.parameters())
    logged = [h["stages/empty_step"] for h in tr.state.log_history if "stages/empty_step" in h]
    assert logged == [0.0, 1.0, 1.0, 0.0]


def test_an_empty_first_step_under_a_scaler_changes_nothing(tmp_path):
    """The first two steps filter every group: the scaler's first ``scale()`` call is a zero-weight row's, the scale
    stays at ``init_scale``, no weight or optimizer state exists or moves until step 3 trains."""
    tr = _trainer(tmp_path, [reward_parity_flat_at(1, 2)], rollout_filter="snr", snr_value=0.9, max_steps=3,
                  empty_batch_stop_steps=0)
    snaps = StepSnapshots(tr)
    tr.add_callback(snaps)
    initial = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    with fp16_scaler(tr):
        tr.train()
    step1, step2, step3 = snaps.after
    for empty in (step1, step2):
        assert same_state(initial, empty["params"]) and not empty["optimizer"]["state"]
        assert empty["scaler"]["scale"] == INIT_SCALE and empty["scaler"]["_growth_tracker"] == 0
    assert step1["lr"] == step2["lr"] > step3["lr"]
    assert not same_state(step2["params"], step3["params"]) and step3["scaler"]["scale"] == INIT_SCALE * 2


def test_a_nonfinite_gradient_backs_the_scale_off_once(tmp_path):
    """A NaN gradient at step 2: the non-finite guard skips the step and the scaler, whose own inf check finds the
    NaN, backs off; the scale after is the scale before times backoff_factor, as after any overflow step."""
    tr = _trainer(tmp_path, [reward_token_parity], max_steps=3)
    snaps = StepSnapshots(tr)
    tr.add_callback(snaps)
    param = tr.model.model.embed_tokens.weight
    backwards = []

    def poison(grad):
        backwards.append(1)
        return grad * float("nan") if len(backwards) == 2 else grad

    param.register_hook(poison)
    with fp16_scaler(tr) as scaler:
        tr.train()
        backoff = scaler.get_backoff_factor()
    step1, step2, step3 = snaps.after
    assert same_state(step1["params"], step2["params"]) and same_state(step1["optimizer"], step2["optimizer"])
    assert step2["lr"] == step1["lr"]
    assert step2["scaler"]["scale"] == step1["scaler"]["scale"] * backoff == INIT_SCALE * 2 * backoff
    assert step2["scaler"]["_growth_tracker"] == 0
    assert step3["scaler"]["scale"] == step2["scaler"]["scale"] * 2 and step3["lr"] < step2["lr"]
    assert all(bool(torch.isfinite(p).all()) for p in tr.model.parameters())
