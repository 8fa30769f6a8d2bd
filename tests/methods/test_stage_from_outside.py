"""A stage added from outside the package, through the hooks only (docs/design.md, "Adding a stage"): its own config
field and validation, its own per-row input and its own checkpointed state -- no file of trainer/ edited. One
training step with it is checked against a hand computation of what the stage must do (which groups stay, their
GRPO advantages times the state-dependent scale) and against TRL's own loss and gradients on the kept rows."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pytest
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    kept_rows_only,
    loss_and_grads,
    max_abs_diff,
    one_step_loss_and_grads,
    prompt_dataset,
    reward_length,
    reward_token_parity,
    spy_batches,
    trl_trainer,
)

from trainer import ConfigError, StageResult, WinnowConfig, WinnowGRPOTrainer
from trainer.pipeline import stages

NAME = "test_outside_odd_first"
KEY = f"rollout_filter/{NAME}"  # Stage.state_key
INPUT = "test_outside_first_token"
ROWS = 32  # 8 prompt groups of 4


@dataclass
class OutsideConfig(WinnowConfig):
    """A user's config: WinnowConfig plus the outside stage's own knob."""

    outside_modulus: int = field(default=2, metadata={"help": "Keep groups whose first rollout's first token id is "
                                                          "not divisible by this."})


def validate_outside(args) -> None:
    """The stage's own validation (``validate=``): runs only when the stage is configured."""
    if args.outside_modulus < 2:
        raise ConfigError("outside_modulus", f"must be >= 2 (got {args.outside_modulus})", "use e.g. 2")


class CallCounter:
    """The stage's checkpointed state: how many generation batches it has filtered."""

    def __init__(self, args):
        self.calls = 0

    def state_dict(self) -> dict:
        """JSON-serialisable state."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.calls = int(state["calls"])


def first_token_rows(trainer, output, needs, computed):
    """The per-row input: this rank's first completion token id of every row."""
    return {INPUT: output["completion_ids"][:, 0].float()}


stages.register_input(INPUT, first_token_rows)


@stages.register_stage("rollout_filter", NAME, needs={INPUT}, group_level=True, metric_prefix="outside",
                       validate=validate_outside, state=CallCounter)
def odd_first_filter(batch, args) -> StageResult:
    """Keep a group when its first rollout starts with a token id not divisible by ``outside_modulus``; scale
    the final advantages by 1 / (1 + batches seen before this one)."""
    state = batch.stage_state[KEY]
    odd = torch.remainder(batch.extras[INPUT].long(), args.outside_modulus) != 0
    keep = batch.groups(odd)[:, 0].repeat_interleave(batch.G)
    scale = 1.0 / (1 + state.calls)
    state.calls += 1
    return StageResult(keep=keep, advantage_scale=scale, metrics={"calls": float(state.calls)})


def build(tiny_model, tmp_path, **overrides):
    args = OutsideConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "per_device_train_batch_size": ROWS,
                                                       "rollout_filter": NAME, "compact_batch": False,
                                                       "loss_type": "grpo", "beta": 0.05, **overrides})
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, reward_length], args=args,
                             train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


def hand_advantages(R: torch.Tensor, G: int) -> torch.Tensor:
    """TRL's GRPO advantage written out: (r - group mean) / (unbiased group std + 1e-4)."""
    out = torch.empty_like(R, dtype=torch.float64)
    for start in range(0, len(R), G):
        r = [float(x) for x in R[start:start + G]]
        mean = sum(r) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (G - 1))
        for j, x in enumerate(r):
            out[start + j] = (x - mean) / (std + 1e-4)
    return out


def row_of(inputs: dict, i: int, output: dict) -> int:
    """Index in the generated batch ``output`` of micro-batch row ``i`` (same prompt and completion tokens)."""
    same = [j for j in range(output["completion_ids"].shape[0])
            if torch.equal(output["completion_ids"][j], inputs["completion_ids"][i])
            and torch.equal(output["prompt_ids"][j], inputs["prompt_ids"][i])]
    assert len(same) == 1
    return same[0]


def test_outside_stage_validates_its_own_field_only_when_configured(tmp_path):
    def cfg(**kw):
        return OutsideConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=4, **kw)

    with pytest.raises(ConfigError, match=r"WinnowConfig.outside_modulus: must be >= 2 \(got 1\). Fix: use e.g. 2"):
        cfg(rollout_filter=NAME, outside_modulus=1)
    cfg(outside_modulus=1)  # not selected: not checked
    assert INPUT in stages.required_inputs(cfg(rollout_filter=NAME))
    assert INPUT not in stages.required_inputs(cfg())


def test_outside_input_needs_a_registered_name():
    from trainer.methods import catalog
    from trainer.methods.method import Method

    name = "test_outside_unknown_input"
    stages.register_stage("rollout_filter", name, needs={"no_such_input"})(lambda batch, args: StageResult())
    try:
        with pytest.raises(ValueError, match=f"stage '{name}' needs unknown inputs \\['no_such_input'\\]"):
            catalog.add(Method(name, fields=None, registers=()))
        assert name not in [m.name for m in catalog.methods()]
    finally:  # the registry is process-wide: leave no stage that every later check would refuse
        del stages._REGISTRY["rollout_filter"][name]
    with pytest.raises(ValueError, match=f"row input '{INPUT}' is already registered"):
        stages.register_input(INPUT, first_token_rows)


@pytest.mark.parametrize("calls_before", [3])  # a resumed state: the scale is 1/4
def test_outside_stage_trains_one_step_as_computed_by_hand(tiny_model, tmp_path, calls_before):
    tr = build(tiny_model, tmp_path / "winnow")
    tr._checkpointed[KEY].load_state_dict({"calls": calls_before})  # as a resume from a checkpoint would
    outputs: list = []
    seen = spy_batches(tr, outputs)
    inputs, loss, grads = one_step_loss_and_grads(tr)
    batch, output = seen[-1], outputs[-1]

    # The per-row input reached the batch, gathered: the first token of every row of TRL's batch.
    first = output["completion_ids"][:, 0]
    assert torch.equal(batch.extras[INPUT].long(), first)
    # Hand decision: groups whose first rollout starts with an odd token id.
    odd_group = [int(first[i]) % 2 == 1 for i in range(0, ROWS, 4)]
    keep = torch.tensor([g for g in odd_group for _ in range(4)])
    assert 0 < sum(odd_group) < len(odd_group), "this batch must exercise the filter"
    R = tr.global_rewards_per_func.double().sum(dim=1)  # both reward weights are 1
    expected = torch.where(keep, hand_advantages(R, 4) / (1 + calls_before), 0.0)
    # TRL shuffles the generation batch before the micro-batch: find each micro-batch row in the generated batch.
    rows = [row_of(inputs, i, output) for i in range(ROWS)]
    assert sorted(rows) == list(range(ROWS))
    expected, keep = expected[rows], keep[rows]
    assert torch.allclose(inputs["advantages"].double(), expected, rtol=1e-5, atol=1e-6 * float(R.abs().max()))
    assert tr._metrics["train"]["outside/calls"][-1] == calls_before + 1
    # The state is checkpointed under the stage's key, JSON round trip included.
    assert json.loads(json.dumps(tr._stage_state()))[KEY] == {"calls": calls_before + 1}

    # TRL's own loss and gradients on the kept rows, with the hand advantages, equal the step's.
    sliced, kept = kept_rows_only(inputs)
    assert torch.equal(kept, keep)
    sliced["advantages"] = expected[keep].float()
    ref = trl_trainer(tiny_model, str(tmp_path / "ref"), per_device_train_batch_size=ROWS, loss_type="grpo",
                      beta=0.05)
    ref_loss, ref_grads = loss_and_grads(ref, sliced)
    assert abs(float(ref_loss - loss)) <= 1e-6 * max(1.0, abs(float(ref_loss)))
    assert max_abs_diff(ref_grads, grads) <= 1e-6
