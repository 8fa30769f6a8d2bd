"""A method hook added from outside the package (docs/design.md, "Adding a stage": hooks): its own config field,
built only when the field turns it on, called at the trainer's three points of every training generation batch in
order, with what the trainer computed there, and checkpointed under its key -- no file of trainer/ edited."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity

from trainer import WinnowConfig, WinnowGRPOTrainer
from trainer.pipeline import stages

KEY = "test_outside_batch_log"


@dataclass
class HookConfig(WinnowConfig):
    """A user's config: WinnowConfig plus the hook's own switch."""

    log_batches: bool = field(default=False, metadata={"help": "Record every generation batch's decision."})


class BatchLog:
    """Records the points it is called at and what it saw; checkpointed."""

    def __init__(self, trainer):
        self.calls: list[tuple[str, int]] = []
        self.kept: list[int] = []

    def after_generation(self, trainer, output, marks):
        self.calls.append(("after_generation", trainer.state.global_step))
        return output, None  # the batch unchanged, every row kept

    def before_pipeline(self, trainer, output, step):
        assert step == trainer.state.global_step + 1
        self.calls.append(("before_pipeline", step))

    def after_decision(self, trainer, decision):
        self.calls.append(("after_decision", trainer.state.global_step))
        self.kept.append(int(decision.keep.sum()))

    def state_dict(self) -> dict:
        return {"kept": list(self.kept)}

    def load_state_dict(self, state: dict) -> None:
        self.kept = list(state["kept"])


@stages.register_hook(KEY, enabled=lambda args: getattr(args, "log_batches", False),
                     points=("after_generation", "before_pipeline", "after_decision"))
def build_batch_log(trainer) -> BatchLog:
    return BatchLog(trainer)


def _trainer(tiny_model, tmp_path, **overrides):
    args = HookConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "max_steps": 2, "save_steps": 2,
                                                   "save_strategy": "steps", **overrides})
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity], args=args,
                             train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


def test_an_outside_hook_runs_at_its_points_and_is_checkpointed(tiny_model, tmp_path):
    off = _trainer(tiny_model, tmp_path / "off")
    assert off.hook(KEY) is None  # off means off: not built
    tr = _trainer(tiny_model, tmp_path / "on", log_batches=True)
    log = tr.hook(KEY)
    assert isinstance(log, BatchLog)
    tr.train()
    per_batch = tr.args.steps_per_generation * tr.num_iterations // tr.args.gradient_accumulation_steps
    batches = -(-tr.state.global_step // max(per_batch, 1))
    points = [name for name, _ in log.calls]
    assert points == ["after_generation", "before_pipeline", "after_decision"] * batches and batches >= 1
    rows = tr.args.per_device_train_batch_size * tr.args.steps_per_generation
    assert log.kept == [rows] * batches  # no stage configured: every rollout kept
    [checkpoint] = (tmp_path / "on").glob("checkpoint-*")
    state = json.loads((checkpoint / "winnow_stage_state.json").read_text())
    assert state[KEY] == {"kept": log.kept}


def test_a_hook_key_is_registered_once():
    with pytest.raises(ValueError, match=f"hook '{KEY}' is already registered"):
        stages.register_hook(KEY, enabled=lambda args: False)(build_batch_log)


class Misspelt(BatchLog):
    """A hook object whose point method is spelt wrong (``after_decison``): never called by name matching alone."""

    def after_decison(self, trainer, decision):
        raise AssertionError("a misspelt point must not run")


MISSPELT = "test_outside_misspelt_point"
UNNAMED = "test_outside_unnamed_point"
stages.register_hook(MISSPELT, enabled=lambda args: getattr(args, "log_batches", False) == "misspelt",
                    points=("after_generation", "before_pipeline", "after_decison"))(Misspelt)
stages.register_hook(UNNAMED, enabled=lambda args: getattr(args, "log_batches", False) == "unnamed",
                    points=("after_generation", "before_pipeline"))(BatchLog)


def test_a_misspelt_hook_point_fails_when_the_trainer_is_built(tiny_model, tmp_path):
    """A point the trainer does not have, or a point-named method the hook does not name (``after_decision`` of
    BatchLog, left out of its points), is an error at build time, naming the hook and the trainer's points."""
    with pytest.raises(ValueError, match=rf"hook '{MISSPELT}' .* names unknown point\(s\) \['after_decison'\]; "
                                         r"the trainer's points are \('after_generation'"):
        _trainer(tiny_model, tmp_path / "misspelt", log_batches="misspelt")
    with pytest.raises(ValueError, match=rf"hook '{UNNAMED}' \(BatchLog\): has method\(s\) \['after_decision'\] of "
                                         "points it does not name"):
        _trainer(tiny_model, tmp_path / "unnamed", log_batches="unnamed")
