"""Exact resume after a hard kill, and atomic checkpoints (issue "Reliability").

Real training processes (`launch/train.py`, tiny Qwen3, local sampling, 2 optimizer steps per generation
batch), with the SNR filter, GRPODropout and the collapse detector on -- and, in a second variant, DAPO's dynamic
sampling (refill stream), ATOD (annealed by step, a frozen teacher) and the collapse detector:

- A trains N = 4 steps without interruption;
- B is SIGKILLed as soon as its checkpoint-2 is published (it dies somewhere in step 3), then the same
  command with ``--resume_from_checkpoint true`` finishes the run;
- C dies (``os._exit``, no clean-up) in the middle of writing checkpoint-4 -- model and optimizer written,
  RNG and trainer state not -- then resumes.

B and C must end bit-identical to A: every logged metric of every step (timings excluded) and every final
weight. C must not leave a ``checkpoint-4`` that looks complete: resume picks checkpoint-2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file
from test_train_entrypoint import RECIPE as TRAIN_RECIPE

ROOT = Path(__file__).resolve().parents[2]
N_STEPS = 4
RECIPE = {
    **TRAIN_RECIPE,  # tests/e2e/test_train_entrypoint.py's tiny-Qwen3 arithmetic recipe, with every resumable stage on
    "reward_funcs": ["test_token_parity"],  # registered by BOOT below
    "steps_per_generation": 2,  # 2 optimizer steps per generation batch: checkpoints fall on batch boundaries
    "rollout_filter": "snr",
    "snr_value": 0.9,
    "snr_include_zero": True,
    "rollout_dropout": "grpodropout",
    "collapse_detection": True,
    "collapse_every": 1,
    "collapse_num_samples": 4,
    "max_steps": N_STEPS,
    "save_steps": 2,
    "plot": False,
}
# The other resumable state: DAPO's dynamic-sampling refill stream and ATOD's annealed OPD weight (a frozen teacher).
RECIPE_REFILL_ATOD = {
    **{
        k: v
        for k, v in RECIPE.items()
        if k not in ("rollout_filter", "snr_value", "snr_include_zero", "rollout_dropout")
    },
    "dynamic_sampling": True,
    "dynamic_sampling_metric": "reward",
    "max_num_gen_batches": 3,
    "advantage": "atod",
    "teacher_model_name_or_path": "offline:tiny-qwen3",
    "atod_anneal_steps": N_STEPS,
}
TIMING = ("step_time", "timing_s/", "seconds", "runtime", "per_second", "peak_memory")  # wall-clock keys
# Every run starts through this bootstrap: it registers a reward that varies on a random model's output (the
# recipe's math rewards are 0 for every completion of a random model, so nothing would train), and with
# crash=True dies half-way through writing checkpoint-4 (after the model and optimizer, before RNG and trainer
# state), with no clean-up.
BOOT = """
import os, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, os.path.join({root!r}, "tests"))
import rewards
from harness import reward_token_parity
rewards.register_reward("test_token_parity")(reward_token_parity)
if {crash}:
    from trainer.grpo_trainer import WinnowGRPOTrainer
    original = WinnowGRPOTrainer._save_rng_state
    def dying(self, output_dir):
        if self.state.global_step == 4:
            os._exit(9)
        return original(self, output_dir)
    WinnowGRPOTrainer._save_rng_state = dying
sys.argv = ["train.py", *sys.argv[1:]]
from launch.train import main
main()
"""


def _boot(crash: bool = False) -> list[str]:
    return [sys.executable, "-c", BOOT.format(root=str(ROOT), crash=crash)]


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}


def _recipe(tmp: Path, name: str, base: dict = RECIPE) -> tuple[Path, Path]:
    out = tmp / name
    recipe = tmp / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump({**base, "output_dir": str(out)}))
    return recipe, out


def _train(recipe: Path, *extra: str, script: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = [*(script or _boot()), "--config", str(recipe), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def _steps(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = {}
    for row in rows:
        if "loss" in row:
            steps[row["step"]] = {k: v for k, v in row.items() if not any(t in k for t in TIMING)}
    return steps


def _assert_same_run(a: Path, b: Path) -> None:
    steps_a, steps_b = _steps(a), _steps(b)
    assert all(row["grad_norm"] > 0 for row in steps_a.values()), "a step did not train: the comparison proves little"
    assert sorted(steps_a) == sorted(steps_b) == list(range(1, N_STEPS + 1))
    for step in steps_a:
        assert steps_a[step] == steps_b[step], f"step {step} differs"
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model) -> Path:
    tmp = tmp_path_factory.mktemp("resume")
    recipe, out = _recipe(tmp, "a")
    _ok(_train(recipe))
    return out


@pytest.mark.parametrize("stages", ["snr_grpodropout_collapse", "refill_atod_collapse"])
def test_sigkill_mid_run_then_resume_equals_the_uninterrupted_run(uninterrupted, tmp_path, stages):
    base = RECIPE if stages == "snr_grpodropout_collapse" else RECIPE_REFILL_ATOD
    if stages == "snr_grpodropout_collapse":
        reference = uninterrupted
    else:
        recipe_a, reference = _recipe(tmp_path, "a", base)
        _ok(_train(recipe_a))
    recipe, out = _recipe(tmp_path, "b", base)
    proc = subprocess.Popen([*_boot(), "--config", str(recipe)], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not (out / "checkpoint-2").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (out / "model.safetensors").exists()
    _ok(_train(recipe, "--resume_from_checkpoint", "true"))
    _assert_same_run(reference, out)


def test_kill_during_a_save_leaves_no_checkpoint_that_looks_complete(uninterrupted, tmp_path):
    recipe, out = _recipe(tmp_path, "c")
    crash = _train(recipe, script=_boot(crash=True))
    assert crash.returncode == 9
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    assert not (out / "checkpoint-4").exists()  # the half-written one stays in staging, invisible to resume
    staged = out / ".staging" / "checkpoint-4"
    assert (staged / "model.safetensors").is_file() and not (staged / "trainer_state.json").exists()
    from transformers.trainer_utils import get_last_checkpoint

    assert get_last_checkpoint(str(out)) == str(out / "checkpoint-2")
    _ok(_train(recipe, "--resume_from_checkpoint", "true"))
    assert (out / "checkpoint-4" / "trainer_state.json").is_file() and not staged.exists()
    _assert_same_run(uninterrupted, out)


def test_checkpoints_inside_a_generation_batch_are_warned_about(tmp_path):
    """TRL keeps a generation batch's remaining micro-batches only in memory: a checkpoint between them could
    not resume exactly. TRL accepts such a save_steps, so it is a warning naming the field and the fix."""
    import warnings

    from trainer.config.core import WinnowConfig

    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=4, per_device_train_batch_size=8,
                steps_per_generation=4, gradient_accumulation_steps=1, save_strategy="steps")
    with pytest.warns(UserWarning, match="save_steps: 6 .*multiple of 4"):
        WinnowConfig(**base, save_steps=6)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        WinnowConfig(**base, save_steps=8)
    assert not [w for w in seen if "save_steps" in str(w.message)]
