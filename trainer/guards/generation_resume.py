"""Resuming a run where the uninterrupted run would be, also inside a generation batch.

The trainer generates a new batch when its micro-step counter is a multiple of steps_per_generation x
num_iterations (S x mu), and keeps the batch, shuffled and split into S micro-batches, only in memory
(trainer/pipeline/round.py, as TRL 1.16 does with its ``_step`` and ``_buffered_inputs``:
trl==1.16.0:trl/trainer/grpo_trainer.py:948-951, 1513, 1538-1546). On resume HF Trainer skips global_step x A
micro-batches of the dataloader (transformers==5.24.0:trainer.py:1706-1709, 1851-1854); a counter started at 0 again
with an empty buffer would, from a checkpoint inside a generation batch (global_step x A not a multiple of S x mu),
generate at once, from the updated policy, and count its batches from there: every later generation boundary
would sit at another global step than in the uninterrupted run, part of a batch would be trained twice, later
saves would fall inside batches too, and checks on ``global_step`` (the reward-variance stop) would drift.

What is exact, and so what this module does:

- the counter is checkpointed (``winnow_stage_state.json``, key ``generation``: the buffer's own state) and set
  back on resume, so generation boundaries stay at the global steps of the uninterrupted run;
- a checkpoint inside a generation batch also stores every process's buffered micro-batches, as generated,
  shuffled and dealt over the optimizer steps (:func:`save_batch`, ``winnow_generation_batch_<rank>_of_<world>.pt``),
  and a resume from it trains the rest of the batch on exactly those micro-batches (:func:`restore`). Without them
  the rest of the batch could only be regenerated -- sampled from the policy after the checkpoint's updates, where
  the uninterrupted run trains on the rollouts of the policy from before them: another run, not a continuation;
- so a resume from a checkpoint inside a batch that lacks them (written before they were saved, or by another
  process count) is refused before any weight is loaded (:func:`check_resumable`), in one line that names the
  checkpoints of the run that do resume exactly. Checkpoints on a batch boundary need nothing extra.

The saved batch costs one generation batch of tensors per process in each such checkpoint; save_steps on batch
boundaries avoids it (WinnowConfig warns about other values).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Callable

import torch
from transformers import TrainerCallback

from trainer.config.errors import ConfigError

STAGE_STATE_FILE = "winnow_stage_state.json"  # in each checkpoint folder, next to TRL's own state files
STATE_KEY = "generation"  # key in STAGE_STATE_FILE
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def batch_file(rank: int, world: int) -> str:
    """Name of process ``rank``'s buffered generation batch in a checkpoint written by ``world`` processes."""
    return f"winnow_generation_batch_{rank}_of_{world}.pt"


def micro_steps_per_batch(args: Any) -> int:
    """Micro-steps of one generation batch (steps_per_generation x num_iterations; TRL's generate_every)."""
    return args.steps_per_generation * args.num_iterations


def checkpoint_micro_step(checkpoint: str, accumulation: int, state_file: str = STAGE_STATE_FILE) -> int:
    """The micro-step counter when ``checkpoint`` was saved: recorded under :data:`STATE_KEY`, or, in a
    checkpoint written before it was, global_step x gradient_accumulation_steps (HF Trainer's own skip count)."""
    path = os.path.join(checkpoint, state_file)
    if os.path.exists(path):
        with open(path) as fh:
            saved = json.load(fh).get(STATE_KEY)
        if saved is not None:
            return int(saved["micro_step"])
    with open(os.path.join(checkpoint, "trainer_state.json")) as fh:
        return int(json.load(fh)["global_step"]) * accumulation


def inside_batch(micro_step: int, args: Any) -> bool:
    """Whether a checkpoint at this micro-step lies inside a generation batch (the next micro-step generates none)."""
    return micro_step % micro_steps_per_batch(args) != 0


def save_batch(trainer: Any, folder: str) -> None:
    """Write this process's buffered micro-batches into checkpoint ``folder`` when the checkpoint lies inside a
    generation batch (every process writes its own file, as HF Trainer writes its RNG states)."""
    buffer = trainer.generation_buffer
    buffered = buffer.micro_batches
    if buffered is None or not inside_batch(buffer.micro_step, trainer.args):
        return
    acc = trainer.accelerator
    os.makedirs(folder, exist_ok=True)
    saved = [micro.saved() for micro in buffered]  # plain dicts, as weights_only loading reads them
    torch.save(saved, os.path.join(folder, batch_file(acc.process_index, acc.num_processes)))


def _resumable(checkpoint: str, args: Any, world: int, state_file: str = STAGE_STATE_FILE) -> bool:
    micro = checkpoint_micro_step(checkpoint, args.gradient_accumulation_steps, state_file)
    if not inside_batch(micro, args):
        return True
    return all(os.path.exists(os.path.join(checkpoint, batch_file(r, world))) for r in range(world))


def resumable_checkpoints(run_dir: str, args: Any, world: int, state_file: str = STAGE_STATE_FILE) -> list[str]:
    """Names of the complete checkpoints in ``run_dir`` that resume exactly, by step."""
    found = []
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
        match = _CHECKPOINT.match(name)
        path = os.path.join(run_dir, name)
        if match and os.path.isfile(os.path.join(path, "trainer_state.json")):
            if _resumable(path, args, world, state_file):
                found.append((int(match.group(1)), name))
    return [name for _, name in sorted(found)]


def check_resumable(args: Any, world: int, checkpoint: str, state_file: str = STAGE_STATE_FILE) -> None:
    """Refuse, before anything is loaded, a resume from a checkpoint inside a generation batch that does not hold
    the buffered batch of each of ``world`` processes. The same decision on every process (the files are checked for
    all ranks). Needs only the config, so ``launch/train.py`` asks it before the weights load."""
    if _resumable(checkpoint, args, world, state_file):
        return
    micro = checkpoint_micro_step(checkpoint, args.gradient_accumulation_steps, state_file)
    per_batch = micro_steps_per_batch(args)
    run_dir = os.path.dirname(os.path.abspath(checkpoint))
    good = resumable_checkpoints(run_dir, args, world, state_file)
    named = ", ".join(good) if good else f"none in {run_dir}"
    raise ConfigError(
        "resume_from_checkpoint",
        f"{os.path.basename(os.path.normpath(checkpoint))} lies inside a generation batch (micro-step {micro}, "
        f"{micro % per_batch} of the batch's {per_batch} = steps_per_generation {args.steps_per_generation} x "
        f"num_iterations {args.num_iterations}) and does not hold the batch's rollouts for {world} process(es) "
        f"({batch_file(0, world)}, ...), so the rest of the batch cannot be replayed and TRL would regenerate it from "
        "the updated policy -- not a continuation of the run",
        f"resume from a checkpoint that continues exactly: {named} (on a generation-batch boundary, or holding its "
        f"batch); start over; or keep checkpoints on batch boundaries (save_steps x gradient_accumulation_steps a "
        f"multiple of {per_batch})",
    )


def restore(trainer: Any, checkpoint: str, state_file: str = STAGE_STATE_FILE) -> None:
    """After HF Trainer loaded ``checkpoint``: the micro-step counter at the checkpoint's value, and, inside a
    generation batch, this process's buffered micro-batches, so the trainer continues the batch instead of generating
    a new one."""
    acc = trainer.accelerator
    buffer = trainer.generation_buffer
    buffer.load_state_dict({"micro_step": checkpoint_micro_step(checkpoint, trainer.args.gradient_accumulation_steps,
                                                                state_file)})
    if inside_batch(buffer.micro_step, trainer.args):
        path = os.path.join(checkpoint, batch_file(acc.process_index, acc.num_processes))
        saved = torch.load(path, map_location=acc.device, weights_only=True)
        buffer.fill(trainer.round_type.restored(trainer, saved, buffer.micro_step))


class OnTrainBegin(TrainerCallback):
    """Runs ``restore`` once at ``on_train_begin``: HF Trainer calls it after loading a resumed run's weights,
    optimizer, scheduler and trainer state and before the first step -- where the run's own state (the stages', the
    hooks', the generation buffer's) is restored, with no override of HF's private loading."""

    def __init__(self, restore: Callable[[], None]):
        self._restore: Callable[[], None] | None = restore

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._restore is not None:
            restore, self._restore = self._restore, None
            restore()
