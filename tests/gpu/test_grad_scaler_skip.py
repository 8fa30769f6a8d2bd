"""Skipped optimizer steps under an fp16 GradScaler (a real ``torch.amp.GradScaler`` in a real accelerate
``AcceleratedOptimizer``, driven in HF Trainer's order: scaled backward, gradient clipping's ``unscale_``,
``optimizer.step()``, ``zero_grad``).

The reference is the scaler's own behaviour: a non-finite skip must leave the scaler exactly as a normal overflow
step does (scale x backoff_factor, growth tracker reset, no update), and the following step must run (its
``unscale_`` does not raise) and update exactly as after that overflow. An empty-step skip leaves the scale and
growth tracker as they were. fp16 autocast needs an accelerator device, but the scaler's bookkeeping is
device-independent, so CPU's GradScaler exercises the same code path as CUDA's.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer

from trainer.guards.empty_steps import arm_skip
from trainer.guards.numerics import NonFiniteGuard

STEPS = ("overflow", "finite", "finite")


def _run(skip: str) -> list[dict]:
    """Three optimizer steps; the first has overflowing gradients (``skip='native'``: left to the scaler as
    accelerate does; ``'loss'`` / ``'grad'``: the non-finite guard skips it from the loss / the gradients) or is
    an empty window (``'empty'``: the empty-step skip, armed before the window's forward; the trainer then runs
    no forward and no backward, so on the first step nothing has been scaled before clipping's ``unscale_``).
    Returns the state after each step."""
    Accelerator(cpu=True)  # initialises the shared state AcceleratedOptimizer reads
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    inner = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    optimizer = AcceleratedOptimizer(inner, scaler=scaler)
    trainer = SimpleNamespace(optimizer=optimizer, model=model, is_deepspeed_enabled=False,
                              accelerator=SimpleNamespace(deepspeed_engine_wrapped=None, num_processes=1,
                                                          device=torch.device("cpu")),
                              state=SimpleNamespace(global_step=0), _metrics={"train": defaultdict(list)})
    guard = NonFiniteGuard()
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    states = []
    for i, kind in enumerate(STEPS):
        loss = model(x).pow(2).mean()
        if kind == "overflow" and skip != "empty":
            loss = loss * float("inf")
        if i == 0 and skip == "loss":
            guard.observe_loss(trainer, loss)
        if i == 0 and skip == "empty":
            arm_skip(trainer)  # EmptyStepGuard.observe, at the window's last micro-batch, before its forward
        else:
            scaler.scale(loss).backward()
        scaler.unscale_(inner)  # HF Trainer's clip_grad_norm_ (max_grad_norm > 0) through accelerate
        if i == 0 and skip == "grad":
            guard.check_gradients(trainer)  # on_pre_optimizer_step
        optimizer.step()
        skipped = optimizer.step_was_skipped
        inner.zero_grad(set_to_none=True)
        guard.end_step(trainer)  # on_step_end
        states.append({"scale": scaler.get_scale(), "growth": int(scaler._get_growth_tracker()), "skipped": skipped,
                       "params": [p.detach().clone() for p in model.parameters()]})
    return states


def _same(a: dict, b: dict) -> bool:
    return (a["scale"], a["growth"], a["skipped"]) == (b["scale"], b["growth"], b["skipped"]) and all(
        torch.equal(p, q) for p, q in zip(a["params"], b["params"]))


@pytest.mark.parametrize("skip", ["loss", "grad"])
def test_nonfinite_skip_is_the_scalers_overflow_step(skip):
    native = _run("native")
    assert native[0]["skipped"] and native[0]["scale"] == 2.0**9  # the scaler backed off and skipped the update
    guarded = _run(skip)
    for step, (ours, ref) in enumerate(zip(guarded, native)):
        assert _same(ours, ref), f"step {step}: {ours} vs the scaler's own overflow handling {ref}"
    assert not guarded[1]["skipped"] and not torch.equal(guarded[1]["params"][0], guarded[0]["params"][0])


def test_empty_skip_keeps_the_scale_and_the_next_step_runs():
    states = _run("empty")
    assert states[0]["skipped"] and states[0]["scale"] == 2.0**10 and states[0]["growth"] == 0
    assert not states[1]["skipped"] and not torch.equal(states[1]["params"][0], states[0]["params"][0])
    assert states[2]["growth"] == 0 and states[2]["scale"] == 2.0**11  # two real steps: growth_interval reached
