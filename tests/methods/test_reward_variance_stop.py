"""RAGEN's reward-variance collapse early stop (issue 20 item 7). The oracle is upstream's loop body, copied from
mll-lab-nu/RAGEN@20daedc ragen/trainer/agent_trainer.py:251-258 (state) and 1209-1235 (update), with the metric
``rollout/in_group_reward_std`` = ``rm_scores.reshape(groups, size).std(dim=-1).mean()``
(rollout_filter.py:428,439)."""

from __future__ import annotations

import collections

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, tiny_model_path

from trainer.config.core import ConfigError, WinnowConfig
from trainer.methods.reward_variance_stop.hook import RewardVarianceStop, mean_group_reward_std


def upstream_stop_index(values: list[float]) -> int | None:
    """The index of the value at which upstream sets early_stopped (None if never)."""
    first, base, window = [], None, collections.deque(maxlen=10)
    for i, current in enumerate(values):
        if len(first) < 10:
            first.append(current)
            if len(first) == 10:
                base = sum(first) / 10
                window.clear()
        elif base is not None:
            window.append(current)
            if len(window) == 10 and all(v < 0.1 * base for v in window):
                return i
    return None


@pytest.mark.parametrize("seed", range(30))
def test_stop_index_matches_upstream(seed):
    g = torch.Generator().manual_seed(seed)
    start = torch.rand(10, generator=g) + 0.2
    # decay with noise, sometimes bouncing back above the threshold
    tail = torch.rand(60, generator=g) * (0.2 if seed % 3 else 0.05) * torch.exp(-torch.arange(60) / (5 + seed))
    values = (torch.cat([start, tail])).tolist()
    monitor = RewardVarianceStop(10, 0.1)
    ours = next((i for i, v in enumerate(values) if monitor.observe(v)), None)
    assert ours == upstream_stop_index(values)
    assert seed % 3 == 0 or ours is not None or upstream_stop_index(values) is None


def test_hand_case():
    values = [1.0] * 10 + [0.05] * 9 + [0.2] + [0.05] * 10  # one bounce restarts the window
    monitor = RewardVarianceStop(10, 0.1)
    stops = [monitor.observe(v) for v in values]
    assert stops.index(True) == len(values) - 1 == upstream_stop_index(values)


def test_mean_group_reward_std_is_upstreams_metric():
    rewards = torch.tensor([1.0, 0.0, 0.0, -0.1, 0.5, 0.5, 0.5, 0.5, 1.0, 0.1, 0.0, 0.0], dtype=torch.float64)
    upstream = rewards.reshape(3, 4).std(dim=-1).mean()  # torch.std: unbiased
    assert mean_group_reward_std(rewards, 4) == pytest.approx(float(upstream), rel=1e-12)


def test_training_stops_after_the_collapse(tmp_path):
    """A reward whose group variance is high for 3 generation batches and then ~0 stops training after 3 more
    (reward_variance_stop_steps 3 for speed; RAGEN's 10 is the same rule), with the reason logged."""
    from trainer.grpo_trainer import WinnowGRPOTrainer

    calls = {"n": 0}

    def collapsing(completions, completion_ids, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 3:
            return [float(i % 2) for i in range(len(completions))]
        return [0.5 + 1e-3 * (i % 2) for i in range(len(completions))]

    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "max_steps": 12}, reward_variance_stop_steps=3)
    trainer = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[collapsing], args=args,
                                train_dataset=prompt_dataset(64), rollout_func=deterministic_rollout_func)
    trainer.train()
    assert trainer.state.global_step == 6  # one generation per step here: 3 baseline + 3 collapsed
    assert any("reward variance collapsed" in str(e.get("winnow_stop_reason", "")) for e in trainer.state.log_history)


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(ConfigError, match="reward_variance_stop_steps"):
        WinnowConfig(
            output_dir=str(tmp_path), **BASE_ARGS, reward_variance_stop_steps=10, reward_variance_stop_ratio=1.5
        )
