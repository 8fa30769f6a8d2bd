"""Resume from a checkpoint inside a generation batch (trainer/guards/generation_resume.py), in-process on the tiny
Qwen3 with local sampling: 4 optimizer steps per generation batch (steps_per_generation 4, A 1), checkpoints every
2 steps, so checkpoints 2 and 6 lie in the middle of a batch.

- resumed from checkpoint-2, the run generates at the same global steps as the uninterrupted run (TRL's counter
  restarted at 0 before: it generated again at once and every 4 steps from there) and ends with its parameters;
- a checkpoint inside a batch without the batch's rollouts is refused before any weight is loaded, naming the
  checkpoints that resume exactly.
"""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
from harness import BASE_ARGS, prompt_dataset, reward_token_parity

from trainer import ConfigError, WinnowConfig, WinnowGRPOTrainer
from trainer.guards.generation_resume import batch_file

GEOMETRY = dict(per_device_train_batch_size=2, steps_per_generation=4, gradient_accumulation_steps=1, max_steps=6,
                save_strategy="steps", save_steps=2)


def _trainer(tiny_model, out) -> WinnowGRPOTrainer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # save_steps inside a generation batch, on purpose
        args = WinnowConfig(output_dir=str(out), **{**BASE_ARGS, **GEOMETRY})
    tr = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity], args=args,
                           train_dataset=prompt_dataset())  # local sampling: a regenerated batch would differ
    tr.generated_at = []  # global_step when TRL generated (0-based: step s+1 trains on it)
    generate = tr._generate_and_score_completions

    def counted(inputs):
        tr.generated_at.append(tr.state.global_step)
        return generate(inputs)

    tr._generate_and_score_completions = counted
    return tr


def _params(tr) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in tr.model.named_parameters()}


@pytest.fixture(scope="module")
def uninterrupted(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("resume-generation") / "a"
    tr = _trainer(tiny_model, out)
    tr.train()
    losses = {h["step"]: h["loss"] for h in tr.state.log_history if "loss" in h}
    return out, tr.generated_at, _params(tr), losses


def test_resume_inside_a_generation_batch_continues_the_uninterrupted_run(tiny_model, tmp_path, uninterrupted):
    out, generated_at, params, losses = uninterrupted
    assert generated_at == [0, 4]  # steps 1 and 5
    tr = _trainer(tiny_model, tmp_path / "b")
    tr.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert tr.generated_at == [4]  # the old code generated at once (step 3) and never at step 5: [2]
    resumed = {h["step"]: h["loss"] for h in tr.state.log_history if "loss" in h and h["step"] > 2}
    assert sorted(resumed) == list(range(3, 7))
    for step, loss in resumed.items():
        assert loss == pytest.approx(losses[step], rel=1e-5, abs=1e-7), f"step {step}"
    moved = max(float((params[n] - p).abs().max()) for n, p in _params(tr).items())
    scale = max(float(p.abs().max()) for p in params.values())
    assert moved <= 1e-5 * scale, f"final parameters differ by {moved}"
    assert (out / "checkpoint-2" / batch_file(0, 1)).is_file()
    assert not (out / "checkpoint-4" / batch_file(0, 1)).exists()  # a batch boundary needs none


def test_resume_inside_a_batch_without_its_rollouts_is_refused_before_loading(tiny_model, tmp_path, uninterrupted):
    out, *_ = uninterrupted
    run = tmp_path / "old"
    for name in ("checkpoint-2", "checkpoint-4", "checkpoint-6"):
        shutil.copytree(out / name, run / name)
    for name in ("checkpoint-2", "checkpoint-6"):  # as written before the batch was saved
        (run / name / batch_file(0, 1)).unlink(missing_ok=True)
    tr = _trainer(tiny_model, run)
    loaded = []
    tr._load_from_checkpoint = lambda *a, **k: loaded.append(a)
    with pytest.raises(ConfigError) as err:
        tr.train(resume_from_checkpoint=True)  # the latest: checkpoint-6
    message = str(err.value)
    assert err.value.field_name == "resume_from_checkpoint" and "\n" not in message
    assert "checkpoint-6 lies inside a generation batch" in message
    assert "continues exactly: checkpoint-4 (" in message and "multiple of 4" in message
    assert not loaded and tr.state.global_step == 0
