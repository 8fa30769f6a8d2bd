"""Method hooks: the runtime methods that are not stages, registered by the methods themselves.

A stage (trainer/pipeline/stages.py) is a pure function of the gathered batch. Some methods need more of the run:
DAPO's dynamic sampling generates again, RAGEN's collapse probe scores the unfiltered batch with the policy, the
reward-variance and low-success stops end training, the frozen teacher is a second model. Each registers one hook,
naming the points it takes part at::

    @register_hook("dynamic_sampling", enabled=lambda args: args.dynamic_sampling, points=("after_generation",))
    def build(trainer) -> DynamicSampler: ...

``build(trainer)`` runs once, at the end of the trainer's ``__init__``, for each hook whose ``enabled(args)`` holds
(in registration order); it may add TrainerCallbacks. The object it returns takes part at the points the hook named,
each through the method of that name (a point not in :data:`POINTS`, a named point the object has no method for, or
a method named like a point that the hook did not name is an error when the trainer is built, so a misspelt point
cannot silently never run):

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

POINTS = ("after_generation", "before_pipeline", "after_decision", "train_micro_batch", "save_checkpoint",
          "load_checkpoint")


@dataclass(frozen=True)
class Hook:
    """One registered method hook: its key (name and checkpoint key), when the config turns it on, and its builder."""

    key: str
    enabled: Callable[[Any], bool]
    build: Callable[[Any], Any]
    points: tuple[str, ...] = ()  # the trainer's points its built object takes part at (a subset of POINTS)


_HOOKS: dict[str, Hook] = {}


def register_hook(key: str, *, enabled: Callable[[Any], bool],
                  points: tuple[str, ...] = ()) -> Callable[[Callable[[Any], Any]], Callable]:
    """Decorator registering ``build(trainer)`` as the hook ``key``, built when ``enabled(args)``, whose object takes
    part at ``points`` (names of :data:`POINTS`; checked when the trainer builds it, :func:`build_hooks`); a key
    already registered is an error (a silent replacement would depend on import order)."""

    def decorator(build: Callable[[Any], Any]) -> Callable[[Any], Any]:
        if key in _HOOKS:
            other = _HOOKS[key].build
            raise ValueError(f"hook {key!r} is already registered by {other.__module__}.{other.__qualname__}")
        _HOOKS[key] = Hook(key, enabled, build, tuple(points))
        return build

    return decorator


def configured_hooks(args: Any) -> list[Hook]:
    """The hooks ``args`` turns on, in registration order (trainer/methods/catalog.py registers the built-in ones)."""
    return [hook for hook in _HOOKS.values() if hook.enabled(args)]


@dataclass
class BuiltHooks:
    """The hooks a run built: each object by its key, and which of them take part at each point."""

    by_key: dict[str, Any]
    at_point: dict[str, list[Any]]

    def at(self, point: str) -> list[Any]:
        """The objects taking part at ``point``, in registration order."""
        if point not in POINTS:
            raise ValueError(f"unknown hook point {point!r}; the points are {POINTS}")
        return self.at_point[point]


def build_hooks(trainer: Any, args: Any) -> BuiltHooks:
    """Build every hook ``args`` turns on (``build(trainer)``, in registration order) and check its points: each
    named point must be one of :data:`POINTS` and a method of the built object, and the object may have no method
    named like a point that the hook did not name. Raises ``ValueError`` naming the hook and the fix."""
    by_key: dict[str, Any] = {}
    at_point: dict[str, list[Any]] = {point: [] for point in POINTS}
    for hook in configured_hooks(args):
        unknown = [p for p in hook.points if p not in POINTS]
        if unknown:
            raise ValueError(f"hook {hook.key!r} ({hook.build.__module__}) names unknown point(s) {unknown}; "
                             f"the trainer's points are {POINTS}")
        built = hook.build(trainer)
        if built is None:
            if hook.points:
                raise ValueError(f"hook {hook.key!r} names points {hook.points} but its build returned None")
            continue
        missing = [p for p in hook.points if not callable(getattr(built, p, None))]
        unnamed = [p for p in POINTS if p not in hook.points and callable(getattr(built, p, None))]
        if missing or unnamed:
            raise ValueError(f"hook {hook.key!r} ({type(built).__name__}): "
                             + (f"names point(s) {missing} it has no method for" if missing else
                                f"has method(s) {unnamed} of points it does not name")
                             + f"; name in points= exactly the methods it takes part with (of {POINTS})")
        by_key[hook.key] = built
        for point in hook.points:
            at_point[point].append(built)
    return BuiltHooks(by_key, at_point)
