"""Evaluation entropy at the sampling temperature, as the GRPODropout authors measure it.

Their eval entropy divides the logits by the sampling temperature before the softmax
(hexuandeng/GRPODropout@4ad3b3b:eval/utils/entropy.py:62-63; eval/scripts/run_sampling_eval.sh:30 samples at
T 0.6) and takes the token mean over all response tokens. The expected values here are computed by hand from
fixed logits: H = -sum_i p_i ln p_i with p = softmax(z / T).
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from trainer.eval import runner
from trainer.eval.benchmarks import EvalItem
from trainer.eval.generation import Completion, token_entropy
from trainer.eval.runner import EvalConfig

# Logits the stub model returns at every position (vocabulary of 4); row k predicts the token after position k.
ROWS = [[2.0, 0.0, -1.0, 0.5], [0.3, 0.3, -2.0, 1.0], [1.0, -1.0, 0.0, 0.0], [0.0, 4.0, 1.0, -3.0]]
PROMPT_IDS, COMPLETION_IDS = [5, 6], [1, 3]  # positions 1 and 2 predict the two completion tokens


def hand_entropy(z: list[float], t: float) -> float:
    """H of softmax(z / t), written out."""
    e = [math.exp(v / t) for v in z]
    p = [v / sum(e) for v in e]
    return -sum(q * math.log(q) for q in p)


class StubModel:
    """Returns ROWS as the logits of a 4-position input, whatever the ids."""

    device = torch.device("cpu")

    def __call__(self, input_ids):
        assert input_ids.shape == (1, len(PROMPT_IDS) + len(COMPLETION_IDS))
        return SimpleNamespace(logits=torch.tensor([ROWS]))


def test_token_entropy_divides_logits_by_the_temperature():
    total, n = token_entropy(StubModel(), PROMPT_IDS, COMPLETION_IDS, 0.6)
    assert n == 2
    assert total == pytest.approx(hand_entropy(ROWS[1], 0.6) + hand_entropy(ROWS[2], 0.6), rel=1e-6)
    raw, _ = token_entropy(StubModel(), PROMPT_IDS, COMPLETION_IDS)  # default: the raw distribution
    assert raw == pytest.approx(hand_entropy(ROWS[1], 1.0) + hand_entropy(ROWS[2], 1.0), rel=1e-6)
    assert total < raw  # T < 1 sharpens the distribution
    with pytest.raises(ValueError, match="temperature"):
        token_entropy(StubModel(), PROMPT_IDS, COMPLETION_IDS, 0.0)


def _config(**kw) -> EvalConfig:
    return EvalConfig.from_dict({"output_dir": "x", "systems": [{"name": "s", "backend": "oracle_gold"}],
                                 "benchmarks": ["gsm8k"], **kw})


def test_the_grpodropout_preset_measures_at_its_sampling_temperature():
    path = Path(__file__).resolve().parents[2] / "configs" / "eval" / "grpodropout.yaml"
    cfg = EvalConfig.from_dict(yaml.safe_load(path.read_text()))
    assert cfg.entropy_temperature == "decoding" and cfg.entropy_temp == 0.6


def test_entropy_temperature_values():
    assert _config().entropy_temp == 1.0  # default: unchanged for the other presets
    assert _config(entropy_temperature=0.7).entropy_temp == 0.7
    assert _config(entropy_temperature="decoding", decoding={"temperature": 0.6}).entropy_temp == 0.6
    assert _config(entropy_temperature="decoding", decoding={"temperature": 0.0}).entropy_temp == 1.0  # greedy
    for bad in (0, -1.0, "sampling", True):
        with pytest.raises(ValueError, match="entropy_temperature"):
            _config(entropy_temperature=bad)


def test_records_carry_the_entropy_at_the_configured_temperature(monkeypatch):
    """The results rows (what summary.json's entropy averages) are measured at entropy_temp."""
    monkeypatch.setattr(runner, "chat_prompt_ids", lambda tokenizer, messages, kwargs: list(PROMPT_IDS))
    cfg = _config(entropy_temperature="decoding", decoding={"temperature": 0.6})
    item = EvalItem("gsm8k", "0", "1 + 1?", "2", "math")
    q = runner._question(item, cfg)
    rows = runner._records(cfg, runner.SystemSpec("s", backend="oracle_gold"), item, q,
                           [Completion("\\boxed{2}", list(COMPLETION_IDS), False)], StubModel(), tokenizer=None)
    assert rows[0]["entropy_tokens"] == 2
    assert rows[0]["entropy_sum"] == pytest.approx(hand_entropy(ROWS[1], 0.6) + hand_entropy(ROWS[2], 0.6), rel=1e-6)


def test_config_record_names_a_non_default_entropy_temperature():
    """A results folder measured at T = 1 is not resumed under the preset that measures at 0.6."""
    system = runner.SystemSpec("s", backend="oracle_gold")
    assert "entropy_temperature" not in runner._config_record(_config(), system)
    assert runner._config_record(_config(entropy_temperature="decoding"), system)["entropy_temperature"] == "decoding"
