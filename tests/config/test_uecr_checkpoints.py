"""The UECR recipe whose checkpoints the paper's α audit reads keeps every one of them.

UECR-GRPO App. F.4 audits 17 checkpoints of the Qwen3-1.7B ATOD run: steps 30, 60, 90, ..., 480 and 515. The
test replays the recipe's checkpointing with transformers' own code: ``DefaultFlowCallback.on_step_end`` decides at
which steps a checkpoint is written (every ``save_steps``, and the last step), and ``rotate_checkpoints`` --
what ``WinnowGRPOTrainer._save_checkpoint`` calls after each save (trainer/grpo_trainer.py) -- deletes what
``save_total_limit`` does not keep. A needed step that is never saved, or saved and then deleted, fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from transformers import TrainingArguments
from transformers.trainer_callback import DefaultFlowCallback, TrainerControl, TrainerState
from transformers.trainer_utils import rotate_checkpoints

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
F4_STEPS = [*range(30, 481, 30), 515]  # App. F.4: "steps 30, 60, 90, through 480, and 515"
NEEDED = {"uecr/baselines/qwen3-1.7b-base-atod.yaml": F4_STEPS}  # F.4: "checkpoints from ATOD training"


def kept_checkpoints(recipe: dict, out: Path) -> list[int]:
    """Steps whose checkpoint folder exists after a run of ``recipe`` (no training, only the save decisions)."""
    out.mkdir(parents=True, exist_ok=True)
    strategy = recipe.get("save_strategy", TrainingArguments.__dataclass_fields__["save_strategy"].default)
    args = TrainingArguments(output_dir=str(out), save_strategy=strategy, save_steps=recipe.get("save_steps", 500),
                             report_to="none")
    limit = recipe.get("save_total_limit", TrainingArguments.__dataclass_fields__["save_total_limit"].default)
    state = TrainerState(max_steps=recipe["max_steps"], save_steps=args.save_steps)
    flow = DefaultFlowCallback()
    for step in range(1, recipe["max_steps"] + 1):
        state.global_step = step
        control = flow.on_step_end(args, state, TrainerControl())
        if control.should_save:
            folder = out / f"checkpoint-{step}"
            folder.mkdir()
            os.utime(folder, (step, step))  # the trainer rotates by modification time (use_mtime=True)
            rotate_checkpoints(output_dir=str(out), save_total_limit=limit, use_mtime=True)
    return sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))


def test_f4_names_seventeen_checkpoints():
    assert len(F4_STEPS) == 17 and F4_STEPS[0] == 30 and F4_STEPS[-2:] == [480, 515]


@pytest.mark.parametrize("name", sorted(NEEDED))
def test_the_audited_run_keeps_every_checkpoint_the_audit_reads(name, tmp_path):
    recipe = yaml.safe_load((CONFIGS / name).read_text())
    assert recipe["max_steps"] == NEEDED[name][-1]
    kept = kept_checkpoints(recipe, tmp_path)
    missing = sorted(set(NEEDED[name]) - set(kept))
    assert not missing, (
        f"{name}: checkpoints {missing} are never saved or get deleted (save_steps {recipe.get('save_steps')}, "
        f"save_total_limit {recipe.get('save_total_limit')}); use a save_steps that divides every audited step and no "
        "save_total_limit"
    )


def test_the_replay_sees_deletion_and_the_last_step(tmp_path):
    """The replay itself: a limit of 2 keeps only the newest two; the last step is saved off the save_steps grid."""
    assert kept_checkpoints({"max_steps": 515, "save_steps": 30, "save_total_limit": 2}, tmp_path / "a") == [510, 515]
    assert kept_checkpoints({"max_steps": 95, "save_steps": 30}, tmp_path / "b") == [30, 60, 90, 95]
