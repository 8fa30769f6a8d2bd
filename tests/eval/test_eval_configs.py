"""Every evaluation config builds (no model is loaded) and names registered benchmarks; the paper presets
carry the papers' decoding and sample counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainer.eval.benchmarks import BENCHMARKS
from trainer.eval.runner import EvalConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "eval").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_eval_config_builds(path):
    cfg = EvalConfig.from_dict(yaml.safe_load(path.read_text()))
    assert cfg.systems and cfg.benchmarks
    assert all(b.name in BENCHMARKS for b in cfg.benchmarks)


def load(name: str) -> EvalConfig:
    return EvalConfig.from_dict(yaml.safe_load((CONFIGS[0].parent / name).read_text()))


def test_grpodropout_preset_is_the_papers():
    """Appendix B.1: 8,192 tokens, T 0.6, top-p 0.95, top-k 20; Mean@32 on AMC23/AIME24/AIME25/HMMT25, Mean@1
    on the other six of the ten benchmarks."""
    cfg = load("grpodropout.yaml")
    d = cfg.decoding
    assert (d.max_tokens, d.temperature, d.top_p, d.top_k) == (8192, 0.6, 0.95, 20)
    ks = {b.name: b.k for b in cfg.benchmarks}
    assert ks == {"gsm8k": 1, "math500": 1, "amc23": 32, "olympiadbench": 1, "aime24": 32, "aime25": 32,
                  "hmmt25_feb": 32, "arc_c": 1, "mmlu_pro": 1, "supergpqa": 1}


def test_uecr_preset_is_avg_at_12_on_its_five_benchmarks():
    cfg = load("uecr.yaml")
    assert {b.name: b.k for b in cfg.benchmarks} == {
        n: 12 for n in ("aime24", "aime25", "amc23", "hmmt25_feb", "hmmt25_nov")
    }
    # "Both models use non-thinking mode in training and evaluation" (UECR-GRPO §5.1, F.6)
    assert cfg.chat_template_kwargs == {"enable_thinking": False}


def test_ragen_preset_validates_at_temperature_half():
    assert load("ragen.yaml").decoding.temperature == 0.5


def test_unknown_keys_and_backends_fail():
    with pytest.raises(ValueError, match="unknown eval config keys"):
        EvalConfig.from_dict({"output_dir": "x", "systems": [], "benchmarks": [], "temprature": 1})
    with pytest.raises(ValueError, match="backend"):
        EvalConfig.from_dict({"output_dir": "x", "systems": [{"name": "a", "model": "m", "backend": "tgi"}],
                              "benchmarks": ["gsm8k"]})
    with pytest.raises(ValueError, match="base_url"):
        EvalConfig.from_dict({"output_dir": "x", "systems": [{"name": "a", "model": "m", "backend": "server"}],
                              "benchmarks": ["gsm8k"]})
