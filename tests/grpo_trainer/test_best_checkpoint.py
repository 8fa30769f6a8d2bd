"""``load_best_model_at_end`` with winnow's staged checkpoints behaves as with TRL's in-place ones.

winnow writes each checkpoint into ``<output_dir>/.staging/`` and publishes it by a rename
(trainer/guards/atomic_checkpoint.py); transformers records ``state.best_model_checkpoint`` under the folder it
saved into. TRL's GRPOTrainer and winnow's run side by side with the same tiny model, data and arguments (3 steps,
evaluated and saved every step, the best by eval reward, ``save_total_limit`` 1 to 3): the same checkpoints
survive, the best is recorded by its published path (in the state and in each checkpoint's trainer_state.json),
and the final weights are the best step's, loaded back, as TRL's are.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from trainer import WinnowConfig, WinnowGRPOTrainer

STEPS = 3


def reward_peak_at(step: int):
    """1.0 for every rollout scored after optimizer step ``step`` (0 elsewhere): the eval reward is highest there,
    so that step's checkpoint is the best (the rollouts, and with them the parity reward, are the same at every
    step: :func:`harness.deterministic_rollout_func`)."""

    def reward_peak(completions, completion_ids, trainer_state=None, **kwargs):
        return [float(trainer_state is not None and trainer_state.global_step == step)] * len(completion_ids)

    return reward_peak


class Snapshots(TrainerCallback):
    """The weights after every optimizer step (what that step's checkpoint holds)."""

    def __init__(self):
        self.by_step: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.by_step[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    """One tokenizer for every trainer here (loading the 151k-token tokenizer is a good part of a run's time)."""
    return AutoTokenizer.from_pretrained(tiny_model)


def _train(cls, cfg_cls, model, tokenizer, out, limit: int, best: int):
    args = cfg_cls(output_dir=str(out), **{
        **BASE_ARGS, "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, "max_steps": STEPS,
        "save_strategy": "steps", "save_steps": 1, "eval_strategy": "steps", "eval_steps": 1,
        "load_best_model_at_end": True, "metric_for_best_model": "reward", "save_total_limit": limit})
    snapshots = Snapshots()
    trainer = cls(model=model, reward_funcs=[reward_token_parity, reward_peak_at(best)], args=args,
                  train_dataset=prompt_dataset(), eval_dataset=prompt_dataset(2), processing_class=tokenizer,
                  rollout_func=deterministic_rollout_func, callbacks=[snapshots])
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer.train()
    return trainer, initial, snapshots.by_step


def _checkpoints(out) -> list[str]:
    return sorted(name for name in os.listdir(out) if name.startswith("checkpoint-"))


def _recorded_best(out, checkpoint: str) -> tuple[str | None, int | None]:
    """The best checkpoint's name and step as the trainer_state.json inside ``checkpoint`` records them."""
    with open(os.path.join(out, checkpoint, "trainer_state.json")) as fh:
        state = json.load(fh)
    path = state["best_model_checkpoint"]
    assert path is None or os.path.dirname(path) == str(out), path  # a published path of this run, not .staging/
    return (os.path.basename(path) if path else None), state["best_global_step"]


@pytest.mark.parametrize(("limit", "best"), [(1, 1), (2, 1), (3, 2)])
def test_best_checkpoint_kept_and_loaded_as_trl_does(tiny_model, tokenizer, tmp_path, limit, best):
    """Limit 1 keeps only the best (TRL deletes the last at the end), 2 the best and the last, 3 all; the best is
    recorded by its published path everywhere; the final weights are the best step's, equal to TRL's."""
    trl, trl_initial, trl_steps = _train(GRPOTrainer, GRPOConfig, tiny_model, tokenizer, tmp_path / "trl", limit, best)
    win, win_initial, win_steps = _train(WinnowGRPOTrainer, WinnowConfig, tiny_model, tokenizer, tmp_path / "win",
                                         limit, best)
    assert trl.state.global_step == win.state.global_step == STEPS
    rewards = {h["step"]: h["eval_reward"] for h in trl.state.log_history if "eval_reward" in h}
    assert max(rewards, key=rewards.get) == best and len(rewards) == STEPS  # the peak reward picks the best step

    # TRL's own outcome (the reference), then winnow's against it
    assert trl.state.best_model_checkpoint == str(tmp_path / "trl" / f"checkpoint-{best}")
    survivors = _checkpoints(tmp_path / "trl")
    assert _checkpoints(tmp_path / "win") == survivors
    assert not (tmp_path / "win" / ".staging").exists()
    assert win.state.best_model_checkpoint == str(tmp_path / "win" / f"checkpoint-{best}")
    assert os.path.isdir(win.state.best_model_checkpoint)
    for checkpoint in survivors:
        assert _recorded_best(tmp_path / "win", checkpoint) == _recorded_best(tmp_path / "trl", checkpoint)

    # the final weights: the best step's, loaded back (not the last step's), and TRL's
    for trainer, steps in ((trl, trl_steps), (win, win_steps)):
        final = {n: p.detach() for n, p in trainer.model.named_parameters()}
        assert all(torch.equal(final[n], steps[best][n]) for n in final)
        assert not all(torch.equal(final[n], steps[STEPS][n]) for n in final)
    trl_delta = {n: p.detach() - trl_initial[n] for n, p in trl.model.named_parameters()}
    win_delta = {n: p.detach() - win_initial[n] for n, p in win.model.named_parameters()}
    scale = max(float(d.abs().max()) for d in trl_delta.values())
    assert scale > 0
    assert max(float((win_delta[n] - trl_delta[n]).abs().max()) for n in trl_delta) <= 1e-5 * scale
