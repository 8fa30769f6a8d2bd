"""Validation as RAGEN runs it (issue 20 item 7): ``val_before_train`` (mll-lab-nu/RAGEN@20daedc
agent_trainer.py:972-973; the main-table script sets trainer.val_before_train=True) and pass@G per batch. The pass@G
oracle is upstream's loop (es_manager.py:349-360): each environment gets pass@G = any(success) over its group; the
logged value is their mean over environments."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity, tiny_model_path
from line_env import Line

from envs.episode import Episode, EpisodeSettings
from trainer.config.core import ConfigError, WinnowConfig
from trainer.rollout.multi_turn import MultiTurnRollout, _Row


def upstream_pass_at(successes: list[float], group_ids: list[int]) -> float:
    group_success: dict[int, list[float]] = {}
    for gid, s in zip(group_ids, successes):
        group_success.setdefault(gid, []).append(s)
    per_env = [float(any(group_success[gid])) for gid in group_ids]
    return sum(per_env) / len(per_env)


@pytest.mark.parametrize("pattern", [[1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0], [0] * 12, [1] * 12, [0, 0, 0, 1] * 3])
def test_pass_at_group_size_matches_upstream(pattern):
    episodes, rows = [], []
    for solved in pattern:
        ep = Episode(Line(), 0, EpisodeSettings())
        ep.play("<think>r</think><answer>Right || Right</answer>")
        ep.play("<think>r</think><answer>Right</answer>" if solved else "<think>r</think><answer>Left</answer>")
        assert ep.success == bool(solved)
        episodes.append(ep)
        rows.append(_Row([1], [2], [1]))
    trainer = SimpleNamespace(accelerator=SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t),
                              num_generations=4, num_generations_eval=1, _metrics={"train": defaultdict(list)})
    MultiTurnRollout._log(trainer, MultiTurnRollout._stats(episodes, rows), "train")
    expected = upstream_pass_at([float(p) for p in pattern], [i // 4 for i in range(len(pattern))])
    assert trainer._metrics["train"]["env/pass@4"] == [pytest.approx(expected)]
    assert trainer._metrics["train"]["env/success_rate"] == [pytest.approx(sum(pattern) / len(pattern))]


def test_val_before_train_evaluates_at_step_zero(tmp_path):
    from trainer.grpo_trainer import WinnowGRPOTrainer

    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "max_steps": 1}, eval_strategy="steps",
                        eval_steps=100, per_device_eval_batch_size=8, val_before_train=True)
    trainer = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity], args=args,
                                train_dataset=prompt_dataset(), eval_dataset=prompt_dataset(8),
                                rollout_func=deterministic_rollout_func)
    trainer.train()
    evals = [e for e in trainer.state.log_history if any(k.startswith("eval_") for k in e)]
    assert evals and evals[0]["step"] == 0


def test_val_before_train_needs_an_evaluation(tmp_path):
    with pytest.raises(ConfigError, match="val_before_train"):
        WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, val_before_train=True)
