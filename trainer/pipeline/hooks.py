"""Method hooks: the runtime methods that are not stages, registered by the methods themselves.

A stage (trainer/pipeline/stages.py) is a pure function of the gathered batch. Some methods need more of the run:
DAPO's dynamic sampling generates again, RAGEN's collapse probe scores the unfiltered batch with the policy, the
reward-variance and low-success stops end training, the frozen teacher is a second model. Each registers one hook::

    @register_hook("dynamic_sampling", enabled=lambda args: args.dynamic_sampling)
    def build(trainer) -> DynamicSampler: ...

``build(trainer)`` runs once, at the end of the trainer's ``__init__``, for each hook whose ``enabled(args)`` holds
(in registration order); it may add TrainerCallbacks. The object it returns takes part at the trainer's points
through whichever of these methods it has:

- ``after_generation(trainer, output, marks) -> (output, initial_keep)``: right after TRL generated and scored a
  training batch, before anything reads it (``initial_keep``: a global keep mask, or None for all rows; ``marks``:
  the lengths of TRL's metric lists before this batch);
- ``before_pipeline(trainer, output, step)``: the unfiltered batch, before the stage pipeline;
- ``after_decision(trainer, decision)``: after the pipeline's decision;
- ``train_micro_batch(trainer, inputs, call)``: every training micro-batch, after the policy's loss (a second
  model's own loss and backward: PPO's critic);
- ``save_checkpoint(trainer, folder)`` / ``load_checkpoint(trainer, folder)``: tensors of its own in each checkpoint
  (the staged folder while it is written; the checkpoint resumed from);
- ``state_dict()`` / ``load_state_dict(state)``: checkpointed under the hook's key (``winnow_stage_state.json``).

The trainer names no method: it runs what is registered (``WinnowGRPOTrainer.hook(key)`` returns a built object).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from trainer.pipeline.stages import load_builtin_methods

POINTS = ("after_generation", "before_pipeline", "after_decision", "train_micro_batch", "save_checkpoint",
          "load_checkpoint")


@dataclass(frozen=True)
class Hook:
    """One registered method hook: its key (name and checkpoint key), when the config turns it on, and its builder."""

    key: str
    enabled: Callable[[Any], bool]
    build: Callable[[Any], Any]


_HOOKS: dict[str, Hook] = {}


def register_hook(key: str, *, enabled: Callable[[Any], bool]) -> Callable[[Callable[[Any], Any]], Callable]:
    """Decorator registering ``build(trainer)`` as the hook ``key``, built when ``enabled(args)``; a key already
    registered is an error (a silent replacement would depend on import order)."""

    def decorator(build: Callable[[Any], Any]) -> Callable[[Any], Any]:
        if key in _HOOKS:
            other = _HOOKS[key].build
            raise ValueError(f"hook {key!r} is already registered by {other.__module__}.{other.__qualname__}")
        _HOOKS[key] = Hook(key, enabled, build)
        return build

    return decorator


def configured_hooks(args: Any) -> list[Hook]:
    """The hooks ``args`` turns on, in registration order (the built-in methods' included)."""
    load_builtin_methods()
    return [hook for hook in _HOOKS.values() if hook.enabled(args)]
