"""Per-phase wall time (``timing_s/*``) and padded vs real tokens per pass (``tokens/*``), logged every step; and a
whole training step with ``micro_batch_tokens`` logging what TRL's own trainer logs for the same batch.

No timed assertions: the phases must be there, non-negative, and together fit inside the wall time of the run.
"""

from __future__ import annotations

import time

import pytest
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity
from trl import GRPOConfig, GRPOTrainer

from trainer import WinnowConfig, WinnowGRPOTrainer

ARGS = {**BASE_ARGS, "max_steps": 2, "steps_per_generation": 2, "beta": 0.04, "temperature": 0.7}


def _train(cls, config_cls, out, **extra):
    trainer = cls(model=out["model"], reward_funcs=[reward_token_parity],
                  args=config_cls(output_dir=str(out["dir"] / cls.__name__), **ARGS, **extra),
                  train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
    start = time.perf_counter()
    trainer.train()
    return trainer, time.perf_counter() - start


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    out = {"model": tiny_model, "dir": tmp_path_factory.mktemp("timing")}
    trl, _ = _train(GRPOTrainer, GRPOConfig, out)
    win, wall = _train(WinnowGRPOTrainer, WinnowConfig, out, micro_batch_tokens=24)
    return trl.state.log_history, win.state.log_history, wall


def test_phase_times_are_logged_and_fit_in_the_run(runs):
    _, logs, wall = runs
    steps = [log for log in logs if "loss" in log]
    assert len(steps) == 2
    first = steps[0]  # the step that generated
    for phase in ("generation", "reward", "old_logps", "ref_logps", "stage_pipeline", "loss_fwd_bwd", "optimizer"):
        assert first[f"timing_s/{phase}"] >= 0, phase
    assert "timing_s/generation" not in steps[1]  # the second step reuses the buffered batch
    assert steps[1]["timing_s/loss_fwd_bwd"] > 0
    total = sum(v for log in steps for k, v in log.items() if k.startswith("timing_s/"))
    assert 0 < total <= wall
    for name in ("loss", "old_logps", "ref_logps"):
        assert first[f"tokens/padded_{name}"] >= first[f"tokens/real_{name}"] > 0, name


def test_budgeted_training_step_logs_trls_loss_and_metrics(runs):
    """The chunked loss through the real training loop (Trainer's backward of the returned loss) logs the loss and
    metrics TRL's unchunked trainer logs for the same generated batch."""
    trl_logs, logs, _ = runs
    assert logs[0]["tokens/loss_chunks"] > 1
    for key in ("loss", "kl", "entropy", "clip_ratio/region_mean"):
        a, b = logs[0][key], trl_logs[0][key]
        assert abs(a - b) <= 1e-5 * abs(b) + 1e-9, (key, a, b)
