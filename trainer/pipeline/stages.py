"""What a method registers -- its stages, the row inputs they need, its hooks -- and the pipeline filter -> dropout ->
advantage.

A stage is one function plus one registration::

    @register_stage("rollout_filter", "my_filter", needs={"entropies"}, group_level=True)
    def my_filter(batch: RolloutBatch, args) -> StageResult:
        ...

Kinds:
- ``rollout_filter``: group level, returns a keep mask over rollouts (whole groups).
- ``rollout_dropout``: rollout level, returns a keep mask and optionally transformed advantages
  (it may read ``batch.base_advantages()``, the configured estimator's output).
- ``advantage``: the estimator, returns advantages (N,) or per-token (N, T).
- ``loss_variant``: ``fn(trainer, model, inputs, call) -> loss`` replacing TRL's ``_compute_loss`` for one
  micro-batch (the default, ``none``, is TRL's loss); ``call`` (trainer/loss/call.py) carries the row scale, the
  entropy bonus's weighting and the recorder of the logged metrics.

``needs`` names per-row inputs the trainer must compute before the pipeline runs, each one registered with
:func:`register_input` (a function of the trainer and this rank's batch). Built in: ``old_logps`` (old-policy
per-token log-probs at the sampling temperature), ``entropies`` (old-policy token entropy) and ``teacher``
(the frozen teacher's per-token log-probs and full-vocabulary entropy, and the old policy's log-probs, all at
T = 1: ``batch.extras["teacher_logps" | "teacher_entropy" | "old_logps_t1"]``; the teacher is loaded only then).
It is a set, or a function of the config returning one when what a stage needs depends on its options (the SNR
filter needs entropies only for its entropy scores; an extra forward pass every step would be waste otherwise).

A method touches only its own files: besides ``needs``, a stage may declare ``validate(args)`` (checks of its
own config fields, raising ``ConfigError``; run when the stage is configured), ``loss_inputs(batch, args)`` (global
per-row tensors its loss variant reads from every micro-batch) and ``state(args)`` (an object with
``state_dict()`` / ``load_state_dict()`` saved in every checkpoint and handed to the stage as
``batch.stage_state[name]``). Checks of a method's config fields that hold whether or not it is selected are
registered with :func:`register_config_check`.
Stage functions are pure in the sense that every rank calls them on the same global batch and must get
the same answer: any randomness must come from a generator seeded from ``args`` and the step.

Method hooks (:func:`register_hook`) are the runtime methods that are not stages. A stage is a pure function of the
gathered batch; some methods need more of the run: DAPO's dynamic sampling generates again, RAGEN's collapse probe
scores the unfiltered batch with the policy, the reward-variance and low-success stops end training, the frozen teacher
is a second model. Each registers one hook, naming the points it takes part at::

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

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import torch

from trainer.pipeline.batch import RolloutBatch

STAGE_KINDS = ("rollout_filter", "rollout_dropout", "advantage", "loss_variant")


@runtime_checkable
class Checkpointed(Protocol):
    """Run state saved in every checkpoint (``winnow_stage_state.json``, one JSON object per name) and restored on
    resume: the empty-batch counter, the collapse detector's schedule, a stage's own state, ..."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


@dataclass
class StageResult:
    """What a stage returns. ``keep`` (N,) bool is AND-ed into the running keep mask; ``advantages``
    (N,) or (N, T) replaces the running advantages; ``metrics`` are logged under the stage's prefix."""

    keep: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # Multiplies the final advantages (after the estimator and every other stage), e.g. RAGEN-2's
    # filter_loss_scaling by the kept fraction of groups.
    advantage_scale: float | None = None


@dataclass(frozen=True)
class Stage:
    """A registered stage: its function and what it requires."""

    kind: str
    name: str
    fn: Callable[..., Any]
    needs: frozenset[str] | Callable[[Any], frozenset[str]] = frozenset()
    group_level: bool = False  # needs num_generations >= 2
    metric_prefix: str = ""
    validate: Callable[[Any], None] | None = None  # checks of its own config fields; raises ConfigError
    loss_inputs: Callable[[RolloutBatch, Any], dict[str, torch.Tensor]] | None = None  # global per-row loss inputs
    state: Callable[[Any], Checkpointed] | None = None  # factory of its checkpointed state
    chunkable: bool = True  # a loss variant whose result token-budget chunks leave unchanged (micro_batch_tokens)

    @property
    def state_key(self) -> str:
        """Name of the stage's state in the checkpoint's stage-state file and in ``batch.stage_state``."""
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class RowInput:
    """A per-row input a stage can name in ``needs``: ``compute(trainer, output, needs, computed)`` returns this
    rank's rows ``{key: (B, ...) tensor}``, gathered over processes into ``batch.old_logps`` / ``batch.entropies``
    (those two keys) or ``batch.extras[key]``. ``computed`` holds what inputs computed earlier returned (in
    registration order); keys starting with ``_`` are shared between inputs and never gathered. ``phase`` times
    it as ``timing_s/<phase>``."""

    name: str
    compute: Callable[[Any, dict[str, Any], frozenset[str], dict[str, Any]], dict[str, Any]]
    phase: str | None = None


_REGISTRY: dict[str, dict[str, Stage]] = {kind: {} for kind in STAGE_KINDS}
_INPUTS: dict[str, RowInput] = {}
_CONFIG_CHECKS: list[Callable[[Any], None]] = []


def register_input(name: str, compute: Callable[..., dict[str, Any]], *, phase: str | None = None) -> None:
    """Register a per-row input ``name`` that stages can list in ``needs`` (see :class:`RowInput`); a name already
    registered is an error. Register it before the stages that need it."""
    if name in _INPUTS:
        raise ValueError(f"row input {name!r} is already registered by {_INPUTS[name].compute.__module__}")
    _INPUTS[name] = RowInput(name, compute, phase)


def known_inputs() -> list[str]:
    """Names stages may list in ``needs``, sorted."""
    return sorted(_INPUTS)


def input_providers(needs: frozenset[str]) -> list[RowInput]:
    """The registered inputs that ``needs`` names, in registration order (an input may reuse an earlier one's
    work), each compute function once (one function may provide several names)."""
    out: list[RowInput] = []
    for spec in _INPUTS.values():
        if spec.name in needs and all(spec.compute is not other.compute for other in out):
            out.append(spec)
    return out


def register_config_check(check: Callable[[Any], None]) -> Callable[[Any], None]:
    """Register ``check(args)``, run by every config's validation whether or not a stage of the method is selected
    (its fields exist either way, and a wrong value is an error either way); it raises ``ConfigError``."""
    _CONFIG_CHECKS.append(check)
    return check


def config_checks() -> list[Callable[[Any], None]]:
    """The registered config checks, in registration order (trainer/methods/catalog.py registers the built-in
    methods' when the config is imported)."""
    return list(_CONFIG_CHECKS)


def register_stage(
    kind: str,
    name: str,
    *,
    needs: set[str] | frozenset[str] | Callable[[Any], set[str] | frozenset[str]] = frozenset(),
    group_level: bool = False,
    metric_prefix: str | None = None,
    validate: Callable[[Any], None] | None = None,
    loss_inputs: Callable[[RolloutBatch, Any], dict[str, torch.Tensor]] | None = None,
    state: Callable[[Any], Checkpointed] | None = None,
    chunkable: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering ``fn`` as stage ``name`` of ``kind``; a name already registered for ``kind`` is an
    error (as in the reward, environment and dataset registries: a silent replacement would change what a recipe
    runs depending on import order).

    ``needs`` is a set of registered input names (:func:`register_input`), or ``needs(args) -> set`` when it
    depends on the config. ``validate(args)`` checks the stage's own config fields when it is configured;
    ``loss_inputs(batch, args)`` returns global (N, ...) per-row tensors that the trainer slices to each rank's rows
    (and the batch's length T) into TRL's batch, so a loss variant finds them in every micro-batch; ``state(args)``
    builds the stage's :class:`Checkpointed` state. ``chunkable=False``: a loss variant that decides over the whole
    micro-step (which tokens to clip, say), so token-budget chunks would change it: ``micro_batch_tokens`` is then
    refused."""
    if kind not in STAGE_KINDS:
        raise ValueError(f"unknown stage kind {kind!r}; expected one of {STAGE_KINDS}")
    if not callable(needs):
        needs = frozenset(needs)  # names checked by check_needs, once every stage's module is imported

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY[kind]:
            other = _REGISTRY[kind][name].fn
            raise ValueError(f"{kind} stage {name!r} is already registered by {other.__module__}.{other.__qualname__}")
        _REGISTRY[kind][name] = Stage(
            kind, name, fn, needs, group_level, metric_prefix or name, validate, loss_inputs, state, chunkable
        )
        return fn

    return decorator


def available(kind: str) -> list[str]:
    """Names registered for ``kind``, sorted."""
    return sorted(_REGISTRY[kind])


def get_stage(kind: str, name: str) -> Stage:
    """Look up a registered stage; KeyError lists what exists."""
    try:
        return _REGISTRY[kind][name]
    except KeyError:
        raise KeyError(f"no {kind} stage named {name!r}; available: {available(kind)}") from None


def configured_stages(args: Any) -> list[Stage]:
    """The stages ``args`` selects, in pipeline order (filter, dropout, advantage, loss variant)."""
    return [get_stage(kind, getattr(args, kind)) for kind in STAGE_KINDS]


def check_needs() -> None:
    """Every registered stage's fixed ``needs`` name a registered input (else ValueError naming the stage). Run once
    the stages' modules are imported (the catalog runs it, and :func:`trainer.methods.catalog.add`): a stage's module
    may be imported on its own, before the module that registers the inputs it names, so registering cannot check."""
    for by_name in _REGISTRY.values():
        for stage in by_name.values():
            if not callable(stage.needs):
                _check_needs(stage.name, stage.needs)


def _check_needs(name: str, needs: Any) -> None:
    unknown = set(needs) - set(_INPUTS)
    if unknown:
        raise ValueError(f"stage {name!r} needs unknown inputs {sorted(unknown)}; known: {known_inputs()}")


def required_inputs(args: Any) -> frozenset[str]:
    """Union of the ``needs`` of every configured stage (evaluated against ``args`` where it is a function)."""
    out: frozenset[str] = frozenset()
    for stage in configured_stages(args):
        needs = stage.needs(args) if callable(stage.needs) else stage.needs
        _check_needs(stage.name, needs)
        out |= frozenset(needs)
    if can_remove_rollouts(args) and getattr(args, "log_entropy_before_selection", False):
        out |= {"entropies"}  # stages/entropy_before_selection (run_pipeline)
    return out


def can_remove_rollouts(args: Any) -> bool:
    """Whether the configured stages can take rollouts out of the loss (then an optimizer step can end up
    with nothing to train on, and the trainer must skip it rather than let Adam move on stale moments)."""
    removing = args.rollout_filter != "none" or args.rollout_dropout != "none"
    return removing or bool(getattr(args, "dynamic_sampling", False))


@dataclass
class Decision:
    """The stage pipeline's one decision on a global batch: which rows are kept (``keep``, (N,)), their
    advantages ((N,) or (N, T), zero where dropped) and the stages' telemetry. dealing.deal places it on
    micro-batches and optimizer steps; nothing else reads the stages' results."""

    keep: torch.Tensor
    advantages: torch.Tensor
    metrics: dict[str, float]


def run_pipeline(batch: RolloutBatch, args: Any) -> Decision:
    """Run filter -> dropout -> advantage on ``batch`` and return the combined decision.

    Removal first, then statistics over what is kept (RAGEN's order: the filter runs at
    mll-lab-nu/RAGEN@20daedc:ragen/trainer/agent_trainer.py L1080, ``compute_advantage`` at L1359; DAPO's dynamic
    sampling in verl likewise keeps groups before computing advantages). Each stage and the estimator see only the
    groups still kept (:meth:`RolloutBatch.subset`): a group an earlier stage removed -- or one dynamic sampling
    topped up and marked dropped -- is never ranked again and never enters a batch-level statistic (``scale_rewards:
    batch``, ``normalize_then_sum``) nor a stage's telemetry. Whole groups only are removed before the
    estimator; GRPODropout's per-rollout deletion uses the estimator's output (paper eqs. 2-9), so the group
    statistics stay TRL's over the whole group.
    """
    metrics: dict[str, float] = {}
    scale = 1.0
    estimator = get_stage("advantage", args.advantage)

    def estimate(b: RolloutBatch) -> torch.Tensor:
        result = estimator.fn(b, args)
        _merge_metrics(metrics, estimator, result.metrics)
        return result.advantages

    batch.estimate_advantages = estimate
    for kind in ("rollout_filter", "rollout_dropout"):
        stage = get_stage(kind, getattr(args, kind))
        rows = _live_rows(batch)
        if not bool(rows.any()):
            continue  # nothing left to rank: a statistic over no group is not taken
        view = batch if bool(rows.all()) else batch.subset(rows)
        result = stage.fn(view, args)
        if result.keep is not None:
            _check_shape(stage, "keep", result.keep, (view.N,))
            batch.keep = batch.keep & _scatter_rows(result.keep.to(torch.bool), rows, batch.N)
        if result.advantages is not None:
            _check_advantages(stage, result.advantages, view)
            batch.advantages = _scatter_rows(result.advantages, rows, batch.N)
        if result.advantage_scale is not None:
            scale *= float(result.advantage_scale)
        _merge_metrics(metrics, stage, result.metrics)
    keep = batch.keep
    if not bool(keep.any()):
        # Nothing left to train on: no estimator call (a group statistic over nothing), zero advantages.
        advantages = torch.zeros_like(batch.R)
    elif batch.advantages is not None:
        advantages = batch.advantages
    else:
        rows = _live_rows(batch)
        view = batch if bool(rows.all()) else batch.subset(rows)
        advantages = view.base_advantages()
        _check_advantages(estimator, advantages, view)
        advantages = _scatter_rows(advantages, rows, batch.N)
    if scale != 1.0:
        advantages = advantages * scale
    mask = keep if advantages.dim() == 1 else keep.unsqueeze(1)
    advantages = torch.where(mask, advantages, torch.zeros_like(advantages))
    kept = int(keep.sum())
    kept_groups = int(batch.groups(keep).any(dim=1).sum())
    metrics["stages/kept_rollouts"] = float(kept)
    metrics["stages/kept_ratio"] = kept / batch.N
    metrics["stages/kept_groups_ratio"] = kept_groups / batch.P
    if batch.entropies is not None:  # every sampled rollout, before selection (GRPODropout Fig. 2a)
        tokens = batch.mask.sum()
        if float(tokens) > 0:
            live = torch.where(batch.mask > 0, batch.entropies.double(), 0.0)
            metrics["stages/entropy_before_selection"] = float(live.sum() / tokens)
    R = batch.R
    trained = keep & ~torch.isnan(R)
    if bool(trained.any()):  # TRL's `reward` is over the generated batch; this one over the rows trained on
        metrics["stages/kept_reward_mean"] = float(R[trained].mean())
    # Rollouts with no loss token (mask_truncated_completions, an episode with no model token) and groups made
    # only of them: kept in TRL's reward statistics, never trained, left out of every stage's group statistic.
    untrainable = ~batch.trainable
    metrics["stages/untrainable_rollouts"] = float(untrainable.sum())
    metrics["stages/untrainable_groups"] = float(batch.groups(untrainable).all(dim=1).sum())
    return Decision(keep=keep, advantages=advantages, metrics=metrics)


def _live_rows(batch: RolloutBatch) -> torch.Tensor:
    """(N,) bool: the rows of every group with at least one kept rollout."""
    return batch.groups(batch.keep).any(dim=1).repeat_interleave(batch.G)


def _scatter_rows(values: torch.Tensor, rows: torch.Tensor, N: int) -> torch.Tensor:
    """``values`` of the selected ``rows`` placed into an (N, ...) tensor, zero (False) elsewhere."""
    if values.shape[0] == N:
        return values
    out = torch.zeros((N, *values.shape[1:]), dtype=values.dtype, device=values.device)
    out[rows] = values
    return out


def _merge_metrics(out: dict[str, float], stage: Stage, metrics: dict[str, float]) -> None:
    for key, value in metrics.items():
        out[f"{stage.metric_prefix}/{key}"] = float(value)


def _check_shape(stage: Stage, what: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(
            f"{stage.kind} stage {stage.name!r} returned {what} of shape {tuple(t.shape)}, expected {shape}"
        )


def _check_advantages(stage: Stage, A: torch.Tensor, batch: RolloutBatch) -> None:
    if A.dim() == 1:
        _check_shape(stage, "advantages", A, (batch.N,))
    else:
        _check_shape(stage, "advantages", A, tuple(batch.mask.shape))


# -- method hooks -----------------------------------------------------------------------------------------------------

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
