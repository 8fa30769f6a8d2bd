"""Which project files one training step runs through, measured with a profiler (the issue "One round per generation
batch" measure): the tiny test model, GRPODropout (``rollout_dropout: grpodropout``) on the harness batch, and a
``sys.setprofile`` hook on during the second optimizer step (a generation batch of its own: generation, scoring, the
round, the loss, backward, the optimizer step and the callbacks), recording every Python function of the product
(trainer/, rewards/, envs/) entered.

It prints the files entered (``trainer/algorithms/`` counted apart: pure functions), the functions entered, and every
call into ``trainer/grpo_trainer.py`` from another project file (a climb back up into the trainer class); with
``--json`` the same as JSON.

    OMP_NUM_THREADS=1 .venv/bin/python bench/step_files.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # harness.py: the tiny model and the deterministic rollouts
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers import TrainerCallback  # noqa: E402

PRODUCT = tuple(str(REPO / d) + os.sep for d in ("trainer", "rewards", "envs"))
TRAINER_FILE = str(REPO / "trainer" / "grpo_trainer.py")
ALGORITHMS = str(REPO / "trainer" / "algorithms") + os.sep


class StepProfile(TrainerCallback):
    """Profiles the optimizer step ``step`` (1-based) from on_step_begin to on_step_end."""

    def __init__(self, step: int):
        self.step, self.files, self.functions, self.climbs = step, set(), set(), set()

    def _profile(self, frame, event, arg):
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(PRODUCT):
            return
        rel = os.path.relpath(path, REPO)
        self.files.add(rel)
        self.functions.add(f"{rel}:{frame.f_code.co_name}")
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if path == TRAINER_FILE and caller.startswith(PRODUCT) and caller != TRAINER_FILE:
            self.climbs.add(f"{os.path.relpath(caller, REPO)}:{frame.f_back.f_code.co_name} -> {frame.f_code.co_name}")

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            sys.setprofile(self._profile)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            sys.setprofile(None)


def measure(step: int = 2) -> dict:
    """Train ``step`` optimizer steps of GRPODropout on the tiny model and profile the last one."""
    # heavy: TRL and the tiny model's assets, after --help could have answered
    from harness import (
        BASE_ARGS,
        deterministic_rollout_func,
        prompt_dataset,
        reward_length,
        reward_token_parity,
        tiny_model_path,
    )

    from trainer import WinnowConfig, WinnowGRPOTrainer

    with tempfile.TemporaryDirectory() as out:
        args = WinnowConfig(output_dir=out, **{**BASE_ARGS, "max_steps": step, "rollout_dropout": "grpodropout"})
        trainer = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity, reward_length],
                                    args=args, train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
        profile = StepProfile(step)
        trainer.add_callback(profile)
        trainer.train()
    files = sorted(profile.files)
    return {
        "files": [f for f in files if not f.startswith("trainer/algorithms/")],
        "algorithm_files": [f for f in files if f.startswith("trainer/algorithms/")],
        "functions": len(profile.functions),
        "climbs_into_grpo_trainer": sorted(profile.climbs),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the measure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    result = measure()
    if parser.parse_args(argv).json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{len(result['files'])} project files (algorithms aside; {len(result['algorithm_files'])} algorithm "
          f"files), {result['functions']} functions")
    for f in result["files"]:
        print("  " + f)
    print(f"{len(result['climbs_into_grpo_trainer'])} calls into trainer/grpo_trainer.py from another project file:")
    for c in result["climbs_into_grpo_trainer"]:
        print("  " + c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
