"""``WinnowConfig``: TRL's ``GRPOConfig`` plus every winnow-rl knob, each documented by its help text.

Validation runs in ``__post_init__`` -- before any model is loaded -- and raises :class:`ConfigError`
naming the field and the fix.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import cache
from typing import Any, Literal, get_args, get_origin, get_type_hints

from trl import GRPOConfig
from trl.trainer.utils import get_config_model_id

from trainer.algorithms.deal_plan import VERL_MINIBATCH, WHOLE_STEPS, FilteredUpdates
from trainer.algorithms.grpo import StdKind
from trainer.algorithms.normalisers import ROW_NORMALISED
from trainer.config import redaction
from trainer.config.errors import ConfigError
from trainer.config.server import ServerFields, validate_server_fields
from trainer.methods import catalog
from trainer.pipeline import stages

THINK_PREFILL = "<think>"  # RAGEN's generation-prompt suffix with enable_think (ctx_manager.py:1260-1261)
# id(args) -> the redacted copy to pickle in its place, set only inside pickled_redacted (see there)
_PICKLE_AS: ContextVar[dict[int, Any] | None] = ContextVar("winnow_pickle_as", default=None)


@dataclass
class WinnowConfig(ServerFields, *catalog.field_mixins(), GRPOConfig):  # each method's knobs beside it
    """GRPOConfig + the stage pipeline (filter -> dropout -> advantage) and loss variants.

    With ``rollout_filter="none"``, ``rollout_dropout="none"``, ``advantage="grpo"`` and
    ``loss_variant="none"`` (the defaults) training is numerically TRL's ``GRPOTrainer``.
    """

    rollout_filter: str = field(
        default="none",
        metadata={
            "help": "Group-level filter run on the global batch before the loss: rollouts of unselected prompt "
            "groups leave the loss and its normaliser. 'none' keeps every group. Registered names: "
            "trainer.pipeline.stages.available('rollout_filter')."
        },
    )
    rollout_dropout: str = field(
        default="none",
        metadata={
            "help": "Rollout-level dropout run after the filter: removes single rollouts from the loss and may "
            "re-center the advantages of the rest. 'none' keeps every rollout."
        },
    )
    advantage: str = field(
        default="grpo",
        metadata={
            "help": "Advantage estimator, scalar per rollout or per token. 'grpo' is TRL's group-relative "
            "advantage exactly (scale_rewards and multi_objective_aggregation honoured)."
        },
    )
    loss_variant: str = field(
        default="none",
        metadata={
            "help": "Replacement for TRL's per-micro-batch loss. 'none' uses TRL's clipped surrogate for "
            "loss_type unchanged."
        },
    )
    advantage_std: StdKind = field(
        default="unbiased",
        metadata={
            "help": "Std estimator of the 'grpo' advantage: 'unbiased' (Bessel-corrected, TRL's) or "
            "'population' (ddof=0, for methods whose paper specifies it)."
        },
    )
    advantage_eps: float = field(
        default=1e-4,
        metadata={"help": "Epsilon added to the std before dividing in the 'grpo' advantage (TRL: 1e-4)."},
    )
    old_logps_source: Literal["policy", "sampler"] = field(
        default="policy",
        metadata={
            "help": "Where stages that need old-policy per-token log-probs get them: 'policy' = one no-grad "
            "forward of the policy at the sampling temperature (reused when TRL already computed them); "
            "'sampler' = the log-probs the generator returned (vLLM or a rollout_func), skipping that pass."
        },
    )

    compact_batch: bool = field(
        default=True,
        metadata={
            "help": "Remove rollouts the stages dropped from the training batch (kept rows re-dealt evenly over "
            "processes and micro-steps, topped up with zero-weight rows) instead of masking them, so they cost no "
            "forward/backward; the loss is the masked one (trainer/pipeline/round.py). A generation batch with "
            "nothing kept runs no forward/backward at all outside DeepSpeed. False keeps them masked."
        },
    )

    log_entropy_before_selection: bool = field(
        default=True,
        metadata={
            "help": "When stages can remove rollouts, log stages/entropy_before_selection: the old policy's token "
            "entropy (sampling temperature) over every rollout of the generation batch, before any is removed "
            "(GRPODropout Fig. 2a; TRL's 'entropy' covers the trained tokens only). Costs one no-grad forward per "
            "generation batch where no stage needs one anyway (e.g. old_logps_source: sampler, or the SNR reward "
            "filter); False skips it."
        },
    )

    # --- stages that remove rollouts (the SNR filter, GRPODropout, ...) -----------------------------------
    empty_batch_stop_steps: int = field(
        default=5,
        metadata={
            "help": "Stop training after this many consecutive generation batches (rollout-update iterations, as "
            "RAGEN counts) with nothing to train on (every rollout removed by any stage that removes rollouts: "
            "rollout_filter, rollout_dropout, dynamic_sampling); the stop and its save land at the end of the batch. "
            "Empty optimizer steps are skipped (weights, optimizer moments and the LR schedule do not move) but only "
            "whole empty batches count. 0 never stops."
        },
    )
    snr_empty_stop_steps: int | None = field(
        default=None,
        metadata={
            "help": "Deprecated alias of empty_batch_stop_steps (the stop applies to every stage that removes "
            "rollouts, not only the SNR filter): its value is moved there, with a warning."
        },
    )
    filtered_updates: FilteredUpdates = field(
        default="fixed",
        metadata={
            "help": "Optimizer steps a generation batch takes after stages removed rollouts. 'fixed': always "
            "steps_per_generation x num_iterations / gradient_accumulation_steps, the kept rollouts dealt evenly "
            "over them (a step is empty only if fewer rollouts than steps were kept). 'proportional' (RAGEN's "
            "agent_trainer.py adjust_batch): the kept rollouts fill whole steps of per_device_train_batch_size x "
            "gradient_accumulation_steps x processes rollouts, ceil(kept / that) updates, each the mean over its "
            "own rollouts (no duplicated rows); the remaining steps are skipped and do not count as empty. "
            "'verl_minibatch' (verl's dp_actor update_policy, as the GRPODropout authors ran it): the same "
            "ceil(kept / that) updates, but each divided by the full mini-batch's rollouts, so a partial last "
            "update takes a proportionally smaller step (row-normalised loss types grpo / sapo / dr_grpo / luspo "
            "only). Logged as stages/optimizer_steps (trainer/algorithms/deal_plan.py)."
        },
    )

    # --- run-wide guards and RAGEN's loss options ------------------------------------------------------------
    vllm_request_timeout: float = field(
        default=600.0,
        metadata={
            "help": "vLLM server mode: seconds one HTTP request to the server may take (read timeout; connect timeout "
            "min(10, this)). A POST that gets no answer in time is not re-sent: one GenerationServerError names the "
            "request, the seconds waited and this field; connection errors and 5xx answers go through TRL's retries "
            "(6 attempts, 60 s of backoff; trainer/server/client.py). Must exceed the slowest generation call: TRL "
            "sends a whole generation batch as one request, and launch/train.py --dry-run estimates its time (keep "
            "ddp_timeout above this). The start-up wait for the server is TRL's vllm_server_timeout."
        },
    )
    skip_nonfinite_steps: bool = field(
        default=True,
        metadata={
            "help": "Skip (and log) an optimizer step whose loss or gradient is NaN/inf instead of applying it: "
            "weights, optimizer state and LR schedule stay unchanged (trainer/guards/step_skip.py). Costs one scalar "
            "all-reduce per micro-batch; False = TRL's behaviour."
        },
    )
    entropy_aggregation: Literal["token_mean", "loss_type"] = field(
        default="token_mean",
        metadata={
            "help": "How the entropy bonus (entropy_coef) is aggregated: 'token_mean' (TRL's: the micro-batch's mean "
            "token entropy, whatever loss_type does) or 'loss_type' (verl's / RAGEN's: the same normaliser as the "
            "policy term -- per-sequence token-mean for grpo, token sums for dr_grpo; "
            "trainer/loss/trl_loss.py). Used only by loss_variant none with a static entropy_coef."
        },
    )
    dr_grpo_token_sum: bool = field(
        default=False,
        metadata={
            "help": "loss_type dr_grpo only: aggregate as verl's 'seq-mean-token-sum' (RAGEN's Dr. GRPO): the mean "
            "over sequences of each sequence's summed token losses. TRL's dr_grpo divides that by "
            "max_completion_length, a constant that still changes the update through max_grad_norm and Adam's eps; "
            "true multiplies the policy and KL terms (and, with entropy_aggregation 'loss_type', the entropy bonus) "
            "by max_completion_length. Needs loss_variant none."
        },
    )
    think_prefill: bool = field(
        default=False,
        metadata={
            "help": "End the generation prompt with '<think>' (after the chat template's assistant header) and score "
            "each reply with '<think>' prepended, as RAGEN does (mll-lab-nu/RAGEN@20daedc "
            "ragen/llm_agent/ctx_manager.py:1259-1263, 1406): a reply 'reasoning</think><answer>Up</answer>' is then "
            "well-formed. The prefill tokens are context, never trained on. Single-turn tasks and the multi-turn "
            "rollout; for models whose template opens the think block itself (Qwen3 thinking mode) leave it off."
        },
    )

    micro_batch_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Token budget per forward, per process (DDP and DeepSpeed ZeRO-3 too): each training micro-batch "
            "-- and the no-grad passes: old-policy and reference log-probs, teacher (and T=1 student) scoring, the "
            "collapse check's cross-scoring, which then ignore teacher_micro_batch_size / collapse_micro_batch_size "
            "-- runs as length-sorted chunks whose padded size, "
            "rows x (longest prompt + longest completion), stays within this many tokens (a single longer row runs "
            "alone); each chunk is trimmed to its own longest row and the chunk losses are weighted to equal TRL's "
            "micro-batch loss for every loss_type (trainer/pipeline/token_budget.py, docs/token-budget.md). Memory is "
            "then bounded by tokens, not rows, so per_device_train_batch_size can be large. None = TRL's fixed row "
            "micro-batches."
        },
    )

    balance_rank_tokens: bool = field(
        default=True,
        metadata={
            "help": "With micro_batch_tokens on several processes (and compact_batch): deal each generation batch's "
            "rows so every process holds about as many tokens (same row counts; verl's balance_batch), so no process "
            "waits at the gradient all-reduce for the one holding the longest rows "
            "(trainer/algorithms/rank_balance.py). The update is unchanged for every loss_type except bnpo and TRL's "
            "entropy-bonus mean, which normalise by each process's own tokens. Logged as tokens/rank_max and "
            "tokens/rank_min. False = round-robin deal."
        },
    )

    def __post_init__(self) -> None:
        self._validate_winnow()
        super().__post_init__()
        self._drop_redacted_placeholders()
        self._validate_filtered_updates()
        self._validate_checkpoint_alignment()

    def validate_converted(self) -> None:
        """The winnow checks of ``__post_init__`` that apply to a plain GRPOConfig's already-validated values
        converted by :func:`as_winnow_config` (TRL's own ``__post_init__`` is not re-run on them)."""
        self._validate_winnow()
        self._validate_checkpoint_alignment()

    def _drop_redacted_placeholders(self) -> None:
        """A recipe.resolved.yaml writes ``<redacted>`` for a secret (trainer/config/redaction.py); re-run, that
        placeholder is dropped from the mapping fields, so the library reads the secret from the environment
        (``model_init_kwargs.token``: HF_TOKEN or ``hf auth login``) instead of sending the placeholder."""
        for f in fields(self):
            value = getattr(self, f.name, None)
            if isinstance(value, dict):
                cleaned, dropped = redaction.without_placeholders(value)
                if dropped:
                    setattr(self, f.name, cleaned)
                    where = ", ".join(f"{f.name}.{path}" for path in dropped)
                    warnings.warn(f"{where}: {redaction.REDACTED!r} is the placeholder of a redacted secret "
                                  "(recipe.resolved.yaml): left unset, so it is read from the environment "
                                  "(the Hugging Face token from HF_TOKEN or `hf auth login`)", UserWarning,
                                  stacklevel=3)

    def to_dict(self) -> dict[str, Any]:
        """TrainingArguments' dict -- what W&B, TensorBoard, MLflow and ``str(args)`` show -- with every secret
        redacted (trainer/config/redaction.py): transformers masks only the top-level ``*_token`` fields, not a
        ``model_init_kwargs.token`` or the user-info of ``vllm_server_base_url``."""
        return redaction.redact(super().to_dict())

    def __str__(self) -> str:
        """TrainingArguments' listing (every field, from a deep copy: ``to_dict`` would convert a quantization config
        inside the running ``model_init_kwargs``), redacted; the dataclass repr would show the secrets."""
        shown = redaction.redact(asdict(self))
        return f"{type(self).__name__}(\n" + "".join(f"{k}={v},\n" for k, v in sorted(shown.items())) + ")"

    __repr__ = __str__

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled as any dataclass, except inside :func:`pickled_redacted` (transformers' ``torch.save`` of
        ``training_args.bin``), where the redacted copy made on entry is pickled in its place."""
        stand_ins = _PICKLE_AS.get()
        clone = stand_ins.get(id(self)) if stand_ins else None
        if clone is not None:
            return clone.__reduce_ex__(protocol)  # the same class, so every protocol's reduce form holds
        return super().__reduce_ex__(protocol)

    def _validate_filtered_updates(self) -> None:
        """'proportional' and 'verl_minibatch' fill whole optimizer steps, so no step may span two generation
        batches (TRL has resolved steps_per_generation by now). 'verl_minibatch' divides each update by a fixed
        row count, which is defined for the losses TRL normalises by rows."""
        mode = self.filtered_updates
        if mode in WHOLE_STEPS and self.steps_per_generation % self.gradient_accumulation_steps:
            raise ConfigError(
                "filtered_updates",
                f"{mode!r} fills whole optimizer steps of a generation batch, but steps_per_generation "
                f"{self.steps_per_generation} is not a multiple of gradient_accumulation_steps "
                f"{self.gradient_accumulation_steps} (a step would span two batches)",
                "make steps_per_generation a multiple of gradient_accumulation_steps, or use filtered_updates: fixed",
            )
        if mode == VERL_MINIBATCH and self.loss_type not in ROW_NORMALISED:
            raise ConfigError(
                "filtered_updates",
                f"'verl_minibatch' divides each update by the mini-batch's row count, but loss_type "
                f"{self.loss_type!r} normalises by tokens",
                "use loss_type grpo (verl's token-mean on one-sequence micro-batches, as the GRPODropout authors ran "
                "it), or filtered_updates: proportional",
            )

    def _validate_checkpoint_alignment(self) -> None:
        """Warn when a checkpoint can fall inside a generation batch: TRL keeps the batch's remaining micro-batches
        only in memory, so such a checkpoint also stores them, one generation batch per process, for an exact resume
        (trainer/guards/generation_resume.py). A warning, not an error: TRL accepts the configuration (its default
        save_steps 500 is one), and training and resume are unaffected; only the checkpoints grow.

        TRL generates when its micro-step counter is a multiple of steps_per_generation x num_iterations, and
        optimizer step s ends at micro-step s x gradient_accumulation_steps (integer arithmetic, no float modulo)."""
        strategy = str(getattr(self.save_strategy, "value", self.save_strategy))
        if strategy != "steps" or self.save_steps < 1:  # a save_steps < 1 is a ratio, resolved at train time
            return
        per_batch = self.steps_per_generation * self.num_iterations  # micro-steps of one generation batch
        accum = self.gradient_accumulation_steps
        if int(self.save_steps) == self.save_steps and (int(self.save_steps) * accum) % per_batch == 0:
            return
        aligned = per_batch // math.gcd(per_batch, accum)  # the smallest save_steps on a batch boundary
        warnings.warn(
            f"WinnowConfig.save_steps: {self.save_steps:g} optimizer steps puts checkpoints inside a generation batch "
            f"({per_batch} micro-steps = steps_per_generation x num_iterations, {accum} per optimizer step), so each "
            "such checkpoint also stores every process's rollouts of that batch (winnow_generation_batch_*.pt) for an "
            f"exact resume. Fix, for checkpoints without them: use a multiple of {aligned} for save_steps",
            stacklevel=2,
        )

    def _map_deprecated_names(self) -> None:
        """Move a deprecated field's value to its new name, with a warning (the old one is then None)."""
        old = self.snr_empty_stop_steps
        if old is None:
            return
        if old < 0:
            raise ConfigError("snr_empty_stop_steps", f"must be >= 0 (got {old})", "use a non-negative value")
        default = next(f.default for f in fields(WinnowConfig) if f.name == "empty_batch_stop_steps")
        if self.empty_batch_stop_steps not in (default, old):
            raise ConfigError("snr_empty_stop_steps",
                              f"is the deprecated name of empty_batch_stop_steps, and both are "
                              f"set ({old} and {self.empty_batch_stop_steps})", "set empty_batch_stop_steps alone")
        warnings.warn("WinnowConfig.snr_empty_stop_steps is deprecated (the stop applies to every stage that removes "
                      "rollouts): use empty_batch_stop_steps", FutureWarning, stacklevel=5)
        self.empty_batch_stop_steps, self.snr_empty_stop_steps = old, None

    def _validate_winnow(self) -> None:
        """Fail fast on winnow fields (TRL validates its own in super().__post_init__)."""
        self._map_deprecated_names()
        for kind in stages.STAGE_KINDS:
            name = getattr(self, kind)
            if name not in stages.available(kind):
                raise ConfigError(
                    kind, f"{name!r} is not a registered {kind} stage", f"use one of {stages.available(kind)}"
                )
        if not self.advantage_eps > 0:
            raise ConfigError("advantage_eps", f"must be > 0 (got {self.advantage_eps})",
                              "use e.g. 1e-4 (TRL) or 1e-6")
        for name, allowed in option_fields(type(self)).items():  # the Literal-typed fields (argparse's choices)
            if getattr(self, name) not in allowed:
                raise ConfigError(name, f"{getattr(self, name)!r} is not an option", f"use one of {list(allowed)}")
        for check in stages.config_checks():  # each method's own fields (stages.register_config_check)
            check(self)
        self._validate_dr_grpo_token_sum()
        self._validate_micro_batch_tokens()
        if self.entropy_aggregation == "loss_type" and (self.use_adaptive_entropy or self.top_entropy_quantile < 1.0):
            raise ConfigError("entropy_aggregation", "'loss_type' is defined for a static entropy_coef on every token "
                              "(not with use_adaptive_entropy or top_entropy_quantile < 1)", "use 'token_mean'")
        if self.use_adaptive_entropy and self.loss_type in ROW_NORMALISED and self.loss_variant == "none" and (
                stages.can_remove_rollouts(self) or self.dr_grpo_token_sum):
            raise ConfigError("use_adaptive_entropy", f"TRL's adaptive entropy controller runs inside TRL's own loss, "
                              f"and a row-normalised loss_type ({self.loss_type!r}) whose rows stages remove (or "
                              "dr_grpo_token_sum) is computed by winnow's copy of it (trainer/loss/trl_loss.py), "
                              "which has no controller", "use a static entropy_coef, or a token-normalised loss_type "
                              "(dapo, bnpo)")
        if self.vllm_request_timeout <= 0:
            raise ConfigError("vllm_request_timeout", f"must be > 0 (got {self.vllm_request_timeout})",
                              "use e.g. 600 (seconds; longer than the slowest generation call)")
        validate_server_fields(self)
        self._validate_empty_batch_stop()
        for stage in stages.configured_stages(self):  # the selected stages' own checks (register_stage validate=)
            self._check_method_fields(stage)
            if not stage.chunkable and self.micro_batch_tokens is not None:
                raise ConfigError("micro_batch_tokens", f"{stage.kind} {stage.name!r} decides over the whole "
                                  "micro-step, so token-budget chunks would change it",
                                  f"use micro_batch_tokens: null with this {stage.kind}")
            if stage.validate is not None:
                stage.validate(self)
        if self.num_generations is not None and self.num_generations < 2:
            group_stages = [s for s in stages.configured_stages(self) if s.group_level]
            if group_stages:
                names = ", ".join(f"{s.kind}={s.name!r}" for s in group_stages)
                raise ConfigError(
                    "num_generations",
                    f"{names} compare rollouts within a prompt group, which needs at least 2 per prompt "
                    f"(got {self.num_generations})",
                    "set num_generations >= 2",
                )

    def _check_method_fields(self, stage: stages.Stage) -> None:
        """A selected stage of a user's method needs that method's fields on this config (catalog.add)."""
        for method in catalog.missing_fields(self):
            if stage.fn.__module__ in {module.__name__ for module in method.registers}:
                raise ConfigError(stage.kind, f"{stage.name!r} is a stage of the method {method.name!r}, whose "
                                  f"fields ({method.fields.__name__}) this config class ({type(self).__name__}) "
                                  "does not have",
                                  f"use a config class that mixes them in: class MyConfig({method.fields.__name__}, "
                                  "WinnowConfig)")

    def _validate_dr_grpo_token_sum(self) -> None:
        """``dr_grpo_token_sum`` rescales TRL's own dr_grpo loss (a surrogate-replacing loss_variant normalises on its
        own)."""
        if self.dr_grpo_token_sum and (self.loss_type != "dr_grpo" or self.loss_variant != "none"):
            raise ConfigError("dr_grpo_token_sum", f"rescales TRL's dr_grpo loss; got loss_type {self.loss_type!r}, "
                              f"loss_variant {self.loss_variant!r}", "use it with loss_type: dr_grpo and "
                              "loss_variant: none, or set dr_grpo_token_sum: false")

    def _validate_micro_batch_tokens(self) -> None:
        """The chunked loss is exact only where TRL's loss is a sum over rows and tokens with micro-batch
        normalisers; these settings choose tokens or update state over the whole micro-batch."""
        budget = self.micro_batch_tokens
        if budget is None:
            return
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ConfigError("micro_batch_tokens", f"must be a positive number of tokens or null (got {budget!r})",
                              "use e.g. 16384 (a few times max_prompt_length + max_completion_length), or null")
        for name, off, what in (
            ("top_entropy_quantile", 1.0, "its entropy quantile is taken over the whole micro-batch"),
            ("use_adaptive_entropy", False, "its controller updates inside each loss call"),
        ):
            if getattr(self, name) != off:
                raise ConfigError("micro_batch_tokens", f"cannot be combined with {name}={getattr(self, name)!r} "
                                  f"({what})", f"set {name}: {off}, or micro_batch_tokens: null")

    def _validate_empty_batch_stop(self) -> None:
        if self.empty_batch_stop_steps < 0:
            raise ConfigError("empty_batch_stop_steps", f"must be >= 0 (got {self.empty_batch_stop_steps})",
                              "use a non-negative value")


@contextmanager
def pickled_redacted(args: WinnowConfig) -> Iterator[None]:
    """While inside, pickling ``args`` -- transformers' ``torch.save(self.args, training_args.bin)``, which has no
    hook -- writes :func:`redaction.redacted_copy` of it (``torch.load`` gives back a plain ``WinnowConfig`` with
    placeholders for the secrets), while every attribute read of ``args`` still sees the real values. The copy is
    made on entry; the context is this thread's (transformers pickles the args in the thread that saves)."""
    clone = redaction.redacted_copy(args)
    token = _PICKLE_AS.set({**(_PICKLE_AS.get() or {}), id(args): clone})
    try:
        yield
    finally:
        _PICKLE_AS.reset(token)


@cache
def option_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    """Each winnow field of ``cls`` (not TRL's) whose type is ``Literal[...]``, with its options: the type is the one
    list of them -- HfArgumentParser makes it the flag's argparse ``choices``, trainer/config/yaml_types.py checks a
    recipe's value against it and ``__post_init__`` a Python caller's."""
    hints = get_type_hints(cls)
    trl_fields = {f.name for f in fields(GRPOConfig)}
    return {f.name: get_args(hints[f.name]) for f in fields(cls)
            if f.name not in trl_fields and get_origin(hints[f.name]) is Literal}


def as_winnow_config(args: Any, model: Any) -> WinnowConfig:
    """The trainer's ``args`` as a :class:`WinnowConfig`, so the subclass is a drop-in for TRL's ``GRPOTrainer``:

    - ``None``: TRL's default, ``GRPOConfig(f"{model_name}-GRPO")``, as a WinnowConfig (every stage off);
    - a plain ``GRPOConfig``: the same, already validated values (derived ones such as steps_per_generation
      included; __post_init__ is not re-run on them) with every winnow field at its default, i.e. every stage off;
    - a ``WinnowConfig``: unchanged."""
    if isinstance(args, WinnowConfig):
        return args
    if args is None:
        model_name = model if isinstance(model, str) else get_config_model_id(model.config)
        return WinnowConfig(f"{model_name.split('/')[-1]}-GRPO")
    if not isinstance(args, GRPOConfig):
        raise TypeError(f"WinnowGRPOTrainer needs args=WinnowConfig(...) or a GRPOConfig, got {type(args).__name__}")
    converted = WinnowConfig.__new__(WinnowConfig)
    converted.__dict__.update(vars(args))
    for f in fields(WinnowConfig):
        if f.name not in converted.__dict__:
            setattr(converted, f.name, f.default_factory() if f.default_factory is not MISSING else f.default)
    converted.validate_converted()
    return converted
