"""Skipped optimizer steps under an fp16 GradScaler (a real ``torch.amp.GradScaler`` in a real accelerate
``AcceleratedOptimizer``, a real LambdaLR schedule and AdamW), driven in HF Trainer's order: scaled backward, the
gradient norm's ``unscale_`` (HF reads the norm through accelerate's ``clip_grad_norm_`` whatever ``max_grad_norm``
is: ``Trainer._get_grad_norm``, transformers 5.10 to 5.25), ``on_pre_optimizer_step`` (the non-finite gradient check,
then trainer/guards/step_skip.py), ``optimizer.step()``, the scheduler's step unless accelerate reports the step
skipped, ``zero_grad``, ``on_step_end``.

The reference is the scaler's own behaviour, outside winnow: a non-finite skip must leave everything exactly as
accelerate's overflow step does (scale x backoff_factor, growth tracker reset, weights, Adam's state and the LR as
they were), and the following steps must run and update exactly as after that overflow. An empty-step skip leaves
the scale and growth tracker as they were. fp16 autocast needs an accelerator device, but the scaler's bookkeeping
is device-independent, so CPU's GradScaler exercises the same code path as CUDA's.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer

from trainer.guards.step_skip import NonFiniteGuard, OptimizerStepSkip

STEPS = ("overflow", "finite", "finite")


class _Accelerator:
    """What of accelerate's Accelerator the skip reads (accelerate builds no GradScaler on CPU)."""

    def __init__(self, optimizer: AcceleratedOptimizer):
        self.optimizer, self.scaler = optimizer, optimizer.scaler
        self.deepspeed_engine_wrapped, self.num_processes, self.device = None, 1, torch.device("cpu")

    @property
    def optimizer_step_was_skipped(self) -> bool:  # Accelerator.optimizer_step_was_skipped
        return self.optimizer.step_was_skipped


def _run(skip: str) -> list[dict]:
    """Three optimizer steps; the first has overflowing gradients (``skip='native'``: left to the scaler as
    accelerate does; ``'loss'`` / ``'grad'``: the non-finite guard skips it from the loss / the gradients) or is
    an empty window (``'empty'``: the empty-step skip, armed before the window's forward; under a scaler the
    trainer then runs the window's zero-weight rows, so the scaler has gradients to check). Returns the state
    after each step."""
    Accelerator(cpu=True)  # initialises the shared state AcceleratedOptimizer reads
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    inner = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(inner, lambda step: 1.0 - step / 10)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    optimizer = AcceleratedOptimizer(inner, scaler=scaler)
    skipper = OptimizerStepSkip()
    trainer = SimpleNamespace(optimizer=optimizer, model=model, accelerator=_Accelerator(optimizer),
                              lr_scheduler=scheduler, step_skip=skipper, state=SimpleNamespace(global_step=0),
                              _metrics={"train": defaultdict(list)})
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
            skipper.arm(trainer)  # EmptyStepGuard.observe, at the window's last micro-batch, before its forward
            loss = loss * 0.0  # the zero-weight rows (loss mask and advantage 0)
        scaler.scale(loss).backward()
        scaler.unscale_(inner)  # HF Trainer's gradient norm (and clipping): accelerate's clip_grad_norm_
        if i == 0 and skip == "grad":
            guard.check_gradients(trainer)  # on_pre_optimizer_step: NonFiniteStepCallback ...
        skipper.before_step(trainer)  # ... then StepSkipCallback
        optimizer.step()
        skipped = skipper.step_was_skipped(trainer)
        if not trainer.accelerator.optimizer_step_was_skipped:  # HF Trainer's rule for the scheduler
            scheduler.step()
        inner.zero_grad(set_to_none=True)
        guard.end_step(trainer)  # on_step_end
        skipper.after_step(trainer)
        states.append({"scale": scaler.get_scale(), "growth": int(scaler.state_dict()["_growth_tracker"]),
                       "skipped": skipped, "lr": inner.param_groups[0]["lr"],
                       "schedule": scheduler.state_dict()["last_epoch"], "adam": copy.deepcopy(inner.state_dict()),
                       "params": [p.detach().clone() for p in model.parameters()]})
    return states


def _same(a: dict, b: dict) -> bool:
    keys = ("scale", "growth", "skipped", "lr", "schedule")
    return all(a[k] == b[k] for k in keys) and all(torch.equal(p, q) for p, q in zip(a["params"], b["params"])) and (
        _adam(a) == _adam(b))


def _adam(state: dict) -> list:
    return [(k, [(n, v.tolist() if torch.is_tensor(v) else v) for n, v in sorted(s.items())])
            for k, s in sorted(state["adam"]["state"].items())]


@pytest.mark.parametrize("skip", ["loss", "grad"])
def test_nonfinite_skip_is_the_scalers_overflow_step(skip):
    native = _run("native")
    assert native[0]["skipped"] and native[0]["scale"] == 2.0**9  # the scaler backed off and skipped the update
    assert native[0]["lr"] == 0.1 and native[1]["lr"] < 0.1  # HF held the schedule for the overflow step only
    guarded = _run(skip)
    for step, (ours, ref) in enumerate(zip(guarded, native)):
        assert _same(ours, ref), f"step {step}: {ours} vs the scaler's own overflow handling {ref}"
    assert not guarded[1]["skipped"] and not torch.equal(guarded[1]["params"][0], guarded[0]["params"][0])


def test_empty_skip_keeps_the_scale_and_the_next_step_runs():
    states = _run("empty")
    torch.manual_seed(0)
    initial = [p.detach().clone() for p in torch.nn.Linear(4, 3).parameters()]
    assert states[0]["skipped"] and states[0]["scale"] == 2.0**10 and states[0]["growth"] == 0
    assert all(torch.equal(p, q) for p, q in zip(states[0]["params"], initial))  # weight decay did not apply
    assert states[0]["adam"]["state"] == {} and states[0]["lr"] == 0.1 and states[0]["schedule"] == 0
    assert not states[1]["skipped"] and not torch.equal(states[1]["params"][0], states[0]["params"][0])
    assert states[1]["schedule"] == 1 and states[1]["lr"] == pytest.approx(0.09)  # the schedule resumed from 0
    assert states[2]["growth"] == 0 and states[2]["scale"] == 2.0**11  # two real steps: growth_interval reached
