"""A fourth method added from a folder outside the package (tests/methods/rloo_method/: fields, stage, METHOD) with
one line, ``catalog.add(METHOD)``, and no file of trainer/ edited: its config checks run, a config class without its
fields is refused before any weight loads, and one training step trains on RLOO's leave-one-out advantages --
checked against a hand computation of them and TRL's own loss and gradients with those advantages."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import rloo_method
import torch
from harness import (
    BASE_ARGS,
    deterministic_rollout_func,
    loss_and_grads,
    max_abs_diff,
    one_step_loss_and_grads,
    prompt_dataset,
    reward_length,
    reward_token_parity,
    trl_trainer,
)
from rloo_method.fields import RLOOFields

from trainer import ConfigError, WinnowConfig, WinnowGRPOTrainer
from trainer.methods import catalog
from trainer.pipeline import stages

catalog.add(rloo_method.METHOD)  # the one line

G = 4
ROWS = 8


@dataclass
class RLOOConfig(RLOOFields, WinnowConfig):
    """The user's config: WinnowConfig with the method's fields mixed in, as WinnowConfig mixes in the built-in
    ones."""


def _args(tmp_path, cls=RLOOConfig, **overrides):
    return cls(output_dir=str(tmp_path), **{**BASE_ARGS, "per_device_train_batch_size": ROWS, "beta": 0.04,
                                            "advantage": "test_outside_rloo", **overrides})


def hand_rloo(R: torch.Tensor, scale: float) -> torch.Tensor:
    """RLOO written out: each reward minus the mean of the other G - 1 rewards of its group, times the scale."""
    out = torch.empty(len(R), dtype=torch.float64)
    for i in range(len(R)):
        start = i - i % G
        others = [float(R[j]) for j in range(start, start + G) if j != i]
        out[i] = scale * (float(R[i]) - sum(others) / (G - 1))
    return out


def test_the_method_is_in_the_catalog_and_registered():
    assert rloo_method.METHOD in catalog.methods()
    assert "test_outside_rloo" in stages.available("advantage")  # test_ names: the registry is process-wide
    with pytest.raises(ValueError, match="a method named 'test_outside_rloo' is already in the catalog"):
        catalog.add(rloo_method.METHOD)


def test_its_checks_run_and_a_config_without_its_fields_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"rloo_scale: must be > 0 \(got 0.0\)"):
        _args(tmp_path, rloo_scale=0.0)
    with pytest.raises(ConfigError, match=r"WinnowConfig.advantage: 'test_outside_rloo' is a stage of the method "
                                          r"'test_outside_rloo', whose fields \(RLOOFields\) this config class "
                                          r"\(WinnowConfig\) does not have"):
        _args(tmp_path, cls=WinnowConfig)
    WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS)  # not selected: nothing of the method is needed


def test_one_step_trains_on_rloo_advantages_as_trl_would(tiny_model, tmp_path):
    scale = 0.5
    tr = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity, reward_length],
                           args=_args(tmp_path / "winnow", rloo_scale=scale), train_dataset=prompt_dataset(),
                           rollout_func=deterministic_rollout_func)
    inputs, loss, grads = one_step_loss_and_grads(tr)
    R = tr.global_rewards_per_func.double().sum(dim=1)  # both reward weights are 1
    assert R.std() > 0, "the batch must have reward differences for the advantage to be tested"
    expected = hand_rloo(R, scale)
    # TRL shuffles the generation batch into micro-batches: find each micro-batch row among the generated rows
    generated = tr.generation_buffer.round.output
    rows = [next(j for j in range(ROWS) if torch.equal(generated["completion_ids"][j], inputs["completion_ids"][i])
                 and torch.equal(generated["prompt_ids"][j], inputs["prompt_ids"][i])) for i in range(ROWS)]
    assert sorted(rows) == list(range(ROWS))
    assert torch.allclose(inputs["advantages"].double(), expected[rows], rtol=1e-6, atol=1e-7)
    assert tr._metrics["train"]["rloo/mean_abs"][-1] == pytest.approx(float(expected.abs().mean()), rel=1e-6)

    ref = trl_trainer(tiny_model, str(tmp_path / "ref"), per_device_train_batch_size=ROWS, beta=0.04)
    ref_inputs = {k: v for k, v in inputs.items()}
    ref_inputs["advantages"] = expected[rows].float()
    ref_loss, ref_grads = loss_and_grads(ref, ref_inputs)
    assert abs(float(ref_loss - loss)) <= 1e-6 * max(1.0, abs(float(ref_loss)))
    assert max_abs_diff(ref_grads, grads) <= 1e-6
