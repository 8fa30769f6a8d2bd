"""``WinnowGRPOTrainer``: a thin adapter between TRL's ``GRPOTrainer`` and the stage pipeline.

Data flow of one generation batch (docs/design.md, "The two seams"): TRL generates and scores; this class gathers the
batch from every process into a :class:`RolloutBatch` and runs filter -> dropout -> advantage on it (every rank
computes the same decision). ``_prepare_inputs`` deals the decision once (trainer/pipeline/round.py): the kept
rollouts re-dealt over ranks or, with ``compact_batch=False``, each rank's own rows
with dropped rollouts masked -- out of the loss *and* its normaliser either way -- then split as TRL splits a batch and
the kept rows placed on their optimizer steps, into winnow's own buffer (trainer/pipeline/round.py).
Empty optimizer steps are skipped (trainer/guards/step_skip.py); the methods that are not stages act through the
hooks they register (trainer/pipeline/stages.py), and the loss is computed at one seam with its differences from TRL's
as arguments (trainer/loss/). No formula and no method lives here.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from typing import Any

import torch
from accelerate import PartialState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import get_last_checkpoint, rotate_checkpoints
from trl import GRPOConfig, GRPOTrainer
from trl.extras.profiling import profiling_decorator

from trainer import trl_contact
from trainer.algorithms.normalisers import ROW_NORMALISED
from trainer.config.core import THINK_PREFILL, ConfigError, WinnowConfig, as_winnow_config, pickled_redacted
from trainer.config.server import server_url
from trainer.guards import atomic_checkpoint, generation_resume
from trainer.guards.rewards import RewardGuard
from trainer.guards.startup_checks import check_before_load, cuda_usable, weight_sync_kind
from trainer.guards.step_skip import (
    EmptyStepGuard,
    EmptyStepStopCallback,
    NonFiniteGuard,
    NonFiniteStepCallback,
    OptimizerStepSkip,
    StepSkipCallback,
)
from trainer.loss.call import LossCall
from trainer.pipeline import stages, step_logs, token_budget
from trainer.pipeline.batch import GatheredRows
from trainer.pipeline.round import GenerationBuffer, MicroBatch, Round, RoundParts
from trainer.pipeline.step_logs import PhaseTimer, PhaseTimingCallback
from trainer.pipeline.token_budget import no_grad_logps
from trainer.rollout.prefill import prefill_ids, with_prefill
from trainer.server import overlapped_generation  # noqa: F401  (registers hook: overlap)
from trainer.server.client import harden_client, wait_for_server
from trainer.server.generation import SyncObserver, generation_class
from trainer.server.listeners import pin_nccl_group_to_loopback
from trainer.tools import model_card

# Every method of TRL's GRPOTrainer / HF Trainer this class overrides, with why TRL offers no public way (one line
# each). The two seams are _prepare_inputs (the generation batch in, to its Round) and _compute_loss (a MicroBatch's
# loss out); the rest is named here so that none is added without a reason (tests/contracts/test_no_runtime_patches.py
# checks the list).
OVERRIDES = {
    "__init__": "launch checks before weights load; builds the stages, the method hooks and the guards",
    "create_model_card": "the card names the base model, the method and the dataset",
    "_tokenize_prompts": "RAGEN's think prefill after the generation prompt",
    "_calculate_rewards": "a failing reward function stops every rank; prefilled replies scored with the prefill",
    "training_step": "micro-batches of an all-dropped step run no forward; loss time apart from generation",
    "_prepare_inputs": "seam 1: TRL's generation batch to its Round (trainer/pipeline/round.py), a MicroBatch out",
    "_compute_loss": "seam 2: a MicroBatch's loss with its LossCall (trainer/loss/), chunked under a token budget",
    "_get_per_token_logps_and_entropies": "TRL's no-grad passes over token-budget chunks, and their token counts",
    "_generate_single_turn": "max_staleness > 0: the batch's completions from the request sent s batches ahead",
    "_get_output_dir": "the staging folder while a checkpoint is written (atomic checkpoints)",
    "_save_checkpoint": "the stages' and hooks' state in the checkpoint, published by one rename; the args that a "
                        "hub push pickles are redacted",
    "save_model": "training_args.bin written with the secrets redacted",
    "train": "a resume that cannot continue a generation batch exactly is refused before weights load; a resume "
             "restores the stages', hooks' and generation buffer's state",
}


class WinnowGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with the winnow stage pipeline. Takes the same arguments: ``args`` is a
    :class:`WinnowConfig`, a plain ``GRPOConfig`` (every stage off) or None (TRL's default config)."""

    _tag_names = ["trl", "grpo", "winnow-rl"]  # TRL's, and winnow-rl's: the model's and its card's tags
    card_facts = None  # the recipe's model and dataset, for the model card (a CardFacts, set by build_trainer)
    round_type: type[Round] = Round  # owns each generation batch (trainer/pipeline/round.py); a subclass may extend it

    def __init__(
        self, model: Any, reward_funcs: Any = None, args: WinnowConfig | GRPOConfig | None = None, **kwargs: Any
    ):
        args = as_winnow_config(args, model)
        _validate_runtime(args, kwargs.get("rollout_func"))
        # W&B, vLLM for NCCL, fp32 masters (startup_checks.py)
        check_before_load(args, model, kwargs.get("peft_config"))
        server = server_url(args)
        sync = weight_sync_kind(args)
        if sync == "nccl":
            # A local server: TRL's weight-sync group binds loopback, not the default route (server/listeners.py).
            pin_nccl_group_to_loopback(server)
        if sync == "nccl" and PartialState().is_main_process:
            # Bounded and logged, before TRL's client polls /health without a timeout (trainer/server/client.py).
            wait_for_server(server, total_timeout=args.vllm_server_timeout)
        if sync in ("disk", "lora") and not args.weight_sync_dir:
            args.weight_sync_dir = os.path.join(args.output_dir, "weight_sync")
        self._reward_guard = RewardGuard()
        self._timer = PhaseTimer()  # timing_s/<phase> once per optimizer step (trainer/pipeline/step_logs.py)
        # winnow's subclass of TRL's generation backend: syncs timed and logged; disk/lora: our sync and no NCCL
        # group (trainer/server/generation.py)
        self.sync_observer = SyncObserver(timed=lambda: self._timer.phase("weight_sync"),
                                          on_metrics=self._log_weight_sync)
        backend = sync if sync in ("disk", "lora") else None
        with generation_class(args, backend, self.sync_observer) if args.use_vllm else nullcontext():
            super().__init__(model, self._reward_guard.wrap(reward_funcs), args, **kwargs)
        client = trl_contact.vllm_client(self)
        if sync == "nccl" and client is not None:  # main process only: every request bounded, errors named
            harden_client(client, args.vllm_request_timeout)  # (disk/lora: hardened before the first request)
        # The generation batch being trained and the micro-step counter that picks its micro-batch, in place of
        # TRL's private buffer; checkpointed, so generation boundaries survive a resume (guards/generation_resume.py)
        self.generation_buffer = GenerationBuffer(args.steps_per_generation, self.num_iterations)
        self.add_callback(PhaseTimingCallback(self._timer, self))
        self.global_rewards_per_func: torch.Tensor | None = None  # (N, reward functions), all processes
        # Only when stages can remove rollouts: with none configured the step logic is TRL's, untouched.
        self._empty_steps = EmptyStepGuard(args.empty_batch_stop_steps) if stages.can_remove_rollouts(args) else None
        if self._empty_steps is not None:
            self.add_callback(EmptyStepStopCallback(self._empty_steps, args))
        self._numerics = NonFiniteGuard() if args.skip_nonfinite_steps else None
        if self._numerics is not None:
            self.add_callback(NonFiniteStepCallback(self, self._numerics))
        # The one skipped optimizer step either guard arms, taken by a callback after theirs (guards/step_skip.py)
        self.step_skip = OptimizerStepSkip()
        if self._empty_steps is not None or self._numerics is not None:
            self.add_callback(StepSkipCallback(self, self.step_skip))
        # The methods that are not stages (DAPO's dynamic sampling, RAGEN's collapse probe and stops, the frozen
        # teacher), each built by the hook it registered (trainer/pipeline/stages.py): this class names none of them.
        self._hooks = stages.build_hooks(self, args)  # each names its points; a misspelt one fails here
        # Each configured stage's own state (Stage.state), handed to it as batch.stage_state[key].
        configured = stages.configured_stages(args)
        stage_states = {s.state_key: s.state(args) for s in configured if s.state is not None}
        # Everything checkpointed in the stage state file, by its key there (one protocol: stages.Checkpointed).
        guards = (("empty_steps", self._empty_steps), ("numerics", self._numerics))
        self._checkpointed: dict[str, stages.Checkpointed] = {k: obj for k, obj in guards if obj is not None}
        self._checkpointed.update({k: obj for k, obj in self._hooks.by_key.items()
                                   if isinstance(obj, stages.Checkpointed)})
        self._checkpointed.update(stage_states)
        self._checkpointed[generation_resume.STATE_KEY] = self.generation_buffer
        # What every generation batch's Round reads (trainer/pipeline/round.py), built once
        self.round_parts = RoundParts(hooks=self._hooks, timer=self._timer, stages=configured,
                                      needs=stages.required_inputs(args), stage_states=stage_states,
                                      counts_step_tokens=self._empty_steps is not None)
        token_budget.check_trainer(self)
        self._staging = False  # True while a checkpoint is written (see _get_output_dir)

    # --- TRL override points -------------------------------------------------------------------------

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None) -> None:
        """TRL's model card, naming the base model, the method and the dataset (trainer/tools/model_card.py)."""
        model_card.create(self, super().create_model_card, model_name, dataset_name, tags)

    def _tokenize_prompts(self, prompts: list):
        """TRL's prompt tokenisation, then the think prefill's ids after the generation prompt (rollout/prefill.py)."""
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        if self.args.think_prefill:
            extra = prefill_ids(trl_contact.tokenizer(self), THINK_PREFILL)
            prompt_ids = [list(ids) + extra for ids in prompt_ids]
        return prompt_ids, images, multimodal_fields

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: D401
        """TRL's reward computation (gathered over processes), with reward failures raised on every rank; with the
        think prefill, single-turn replies are scored with it in front (the multi-turn rollout parses its own)."""
        completions = self.completions_as_scored(completions)
        with self.phase("reward"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._reward_guard.raise_if_failed(self.accelerator)
        self.global_rewards_per_func = rewards_per_func
        return rewards_per_func

    def completions_as_scored(self, completions: list) -> list:
        """TRL's decoded completions as winnow's reward functions see them: with the think prefill in front of
        single-turn replies (the multi-turn rollout parses its own)."""
        if self.args.think_prefill and self.rollout_func is None:
            return with_prefill(completions, THINK_PREFILL)
        return completions

    # --- what the method hooks use (trainer/pipeline/stages.py) ---------------------------------------------

    def hook(self, key: str) -> Any | None:
        """The object the method hook ``key`` built for this run, or None when the config does not turn it on."""
        return self._hooks.by_key.get(key)

    def gathered(self, output: dict[str, Any]) -> GatheredRows:
        """The generation batch ``output``'s rows over every process, the round's own (trainer/pipeline/round.py):
        each key of TRL's dict crosses the processes once, however many readers (the stages' batch, compaction, the
        collapse probe, DAPO's relog) read it. Collective on a key's first read."""
        return self.generation_buffer.round.gathered(output)

    def last_generation_was_empty(self) -> bool:
        """Whether the latest generation batch had nothing to train on (stages removed every rollout)."""
        return self._empty_steps is not None and self._empty_steps.consecutive_empty_generations > 0

    def phase(self, name: str):
        """Time a training phase as ``timing_s/<name>`` (evaluation passes are not a training step's time)."""
        return self._timer.phase(name) if self.model.training else nullcontext()

    def training_step(self, model, inputs, num_items_in_batch):
        """:meth:`_training_step`, its time outside ``_prepare_inputs`` (generation and scoring) logged as
        ``timing_s/loss_fwd_bwd``; then the micro-step counted (trained or skipped), as TRL counts its own."""
        start, prepared = time.perf_counter(), self._timer.prepare_seconds
        try:
            loss = self._training_step(model, inputs, num_items_in_batch)
            self.generation_buffer.advance()
            return loss
        finally:
            spent = time.perf_counter() - start - (self._timer.prepare_seconds - prepared)
            self._timer.seconds["loss_fwd_bwd"] += spent

    def _training_step(self, model, inputs, num_items_in_batch):
        """TRL's training step; when stages can remove rollouts, the micro-batch is taken first (generating when due)
        and counted by the empty-step guard, and one whose optimizer step holds no kept rollout on any rank
        (``MicroBatch.trains`` False, trainer/algorithms/deal_plan.py) runs no forward and no backward at all --
        every rank skips together, the decision being global -- and the optimizer step is skipped. Under DeepSpeed
        (whose step is inside backward) and an fp16 GradScaler (whose step needs gradients to check for inf) their
        zero-weight rows run as TRL's step."""
        if self._empty_steps is None:
            return super().training_step(model, inputs, num_items_in_batch)
        # Trainer.training_step's own first lines: the mode decides how TRL generates (train vs eval batch)
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        micro = self._prepare_inputs(inputs)  # generates when due
        self._empty_steps.observe(self, micro)
        if not micro.trains and not self.is_deepspeed_enabled and self.accelerator.scaler is None:
            return torch.zeros((), device=self.accelerator.device)
        return super().training_step(model, micro, num_items_in_batch)  # its _prepare_inputs hands micro back

    @profiling_decorator  # TRL's own profiling key for this method (W&B "profiling/Time taken: ...")
    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> MicroBatch:
        """The current micro-batch. Training: when a new generation batch is due, TRL's generation and scoring of it
        (``_generate_and_score_completions``), handed to its :class:`Round` (trainer/pipeline/round.py: hooks,
        stages, dealing into ``steps_per_generation`` micro-batches), which the generation buffer holds; then the
        micro-step's micro-batch. Evaluation: TRL's batch. A micro-batch already taken (``_training_step`` hands it to
        HF's step) is handed back as it is."""
        if isinstance(generation_batch, MicroBatch):
            return generation_batch
        if not self.model.training:
            return MicroBatch(super()._prepare_inputs(generation_batch))
        start = time.perf_counter()
        buffer = self.generation_buffer
        if buffer.due():
            marks = step_logs.metric_marks(trl_contact.metrics(self))
            output = self.generate_and_score(generation_batch)
            generation = self.round_type(self, output, marks, buffer.micro_step)
            buffer.fill(generation)
            generation.run()
            if self._empty_steps is not None:
                self._empty_steps.observe_generation(self, generation.empty, generation.updates)
        self._timer.prepare_seconds += time.perf_counter() - start
        return buffer.current()

    def generate_and_score(self, prompts: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's generation and scoring of a batch of prompts (``_generate_and_score_completions``: this rank's batch
        dict), timed as ``timing_s/generation`` less the phases timed inside it (weight sync, rewards, log-prob
        passes). With overlapped generation and a ``rollout_func`` the generations in flight finish first: TRL syncs
        the weights before calling it."""
        overlap = self.hook("overlap")
        if overlap is not None and self.rollout_func is not None:
            overlap.before_generate(self)
        with self._timer.phase_less_inner("generation"):
            return trl_contact.generate_and_score(self, prompts)

    def _compute_loss(self, model, inputs):
        """The loss seam: the configured loss variant (``none`` = TRL's loss) on this micro-batch with its
        :class:`LossCall` (trainer/loss/call.py) -- over token-budget chunks with ``micro_batch_tokens``
        (trainer/pipeline/token_budget.py) -- and its logged metrics reduced once."""
        fn = stages.get_stage("loss_variant", self.args.loss_variant).fn
        call = self._loss_call(inputs)
        loss = token_budget.micro_batch_loss(self, model, inputs, fn, call)
        if model.training and torch.is_grad_enabled():
            for method in self._hooks.at("train_micro_batch"):  # e.g. PPO's critic: its value loss on this micro-batch
                method.train_micro_batch(self, inputs, call)
        call.recorder.flush(self.accelerator, trl_contact.metrics(self, "train" if self.model.training else "eval"))
        if self._numerics is not None and model.training:
            self._numerics.observe_loss(self, loss)
        return loss

    def _loss_call(self, inputs: dict[str, Any]) -> LossCall:
        """What this micro-batch's loss differs from TRL's by. The row scale: batch compaction's ``N / N_kept``
        (``MicroBatch.row_scale``: TRL divides grpo/sapo/dr_grpo/luspo losses by the micro-batch's rows, so training on
        the kept rollouts alone would multiply the loss by it; trainer/pipeline/round.py), times
        ``max_completion_length`` under ``dr_grpo_token_sum`` (verl's seq-mean-token-sum is TRL's dr_grpo without its
        division by that constant); token-normalised losses need none (the mask re-weights alone). The entropy
        bonus aggregated like the policy term: RAGEN's (verl's), ``entropy_aggregation: loss_type``
        (trainer/loss/trl_loss.py)."""
        scale = getattr(inputs, "row_scale", None)
        if self.args.dr_grpo_token_sum:
            scale = self.max_completion_length * (1.0 if scale is None else scale)
        aggregate = (self.args.entropy_aggregation == "loss_type" and self.args.loss_variant == "none"
                     and trl_contact.entropy_bonus_enabled(self))
        return LossCall(row_scale=scale if self.loss_type in ROW_NORMALISED else None, aggregate_entropy=aggregate,
                        sampler_ratio=self.args.max_staleness > 0)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **kwargs):
        """TRL's log-prob pass; with ``micro_batch_tokens``, its batched no-grad passes (old policy, reference:
        the calls that pass ``batch_size``) run over token-budget chunks instead of row slices."""
        forward = super()._get_per_token_logps_and_entropies
        if batch_size is None or torch.is_grad_enabled():  # the loss's own forward, or a one-off pass
            return forward(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                           compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs)
        return no_grad_logps(self, forward, self.phase, model, input_ids, attention_mask, logits_to_keep, batch_size,
                             compute_entropy, compute_aux_loss, **kwargs)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's single-turn generation; while training with ``max_staleness`` > 0, the completions of the request
        sent ``s`` batches ahead, from the weights of exactly ``s`` batches ago
        (trainer/server/overlapped_generation.py)."""
        overlap = self.hook("overlap")
        if overlap is not None and self.model.training:
            return overlap.completions(self, prompt_ids, num_generations)
        return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                             has_tool_images=has_tool_images)

    def _get_output_dir(self, trial):
        """Trainer's run folder -- or, while a checkpoint is being written, its staging folder."""
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, atomic_checkpoint.STAGING_DIR) if getattr(self, "_staging", False) else run_dir

    def _save_checkpoint(self, model, trial):
        """TRL's checkpoint plus the stages' own state (empty-step counters, collapse-detector schedule and
        EMAs, dynamic-sampling refills), written to a staging folder and published by one rename when every
        process is done (trainer/guards/atomic_checkpoint.py): a kill during a save never leaves a checkpoint that
        looks complete but is not."""
        run_dir = super()._get_output_dir(trial)
        name = f"checkpoint-{self.state.global_step}"
        staged = atomic_checkpoint.staged_path(run_dir, name)
        if self.args.should_save:
            atomic_checkpoint.clear(staged)
        self.accelerator.wait_for_everyone()
        self._staging = True
        try:
            with pickled_redacted(self.args):  # the hub push inside pickles the args again: redacted, as save_model
                super()._save_checkpoint(model, trial)
            self._record_published_best(run_dir, staged)
            generation_resume.save_batch(self, staged)  # inside a generation batch: its rest, for an exact resume
            for method in self._hooks.at("save_checkpoint"):  # e.g. PPO's critic: weights and optimizer state
                method.save_checkpoint(self, staged)
            state = self._stage_state()
            if state and self.args.should_save:
                with open(os.path.join(staged, generation_resume.STAGE_STATE_FILE), "w") as fh:
                    json.dump(state, fh)
        finally:
            self._staging = False
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            atomic_checkpoint.publish(staged, os.path.join(run_dir, name))
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
        self.accelerator.wait_for_everyone()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """HF Trainer's save of the model, tokenizer and ``training_args.bin``; the args it pickles there are a copy
        with the secrets redacted (trainer/config/redaction.py: ``hub_token``, ``model_init_kwargs.token``, URL
        user-info), written in place of the running args, which keep them (model loading, hub pushes need them)."""
        with pickled_redacted(self.args):
            super().save_model(output_dir, _internal_call=_internal_call)

    def _record_published_best(self, run_dir: str, staged: str) -> None:
        """Record the best checkpoint by its published path, not the staging one transformers saw (gone after the
        publish), here and in the staged trainer_state.json: rotation then keeps it and load_best_model_at_end
        loads it, as TRL's in-place checkpoints do (trainer/guards/atomic_checkpoint.py, published_best)."""
        if self.args.save_strategy == "no":  # transformers records no best checkpoint then either
            return
        best = atomic_checkpoint.published_best(run_dir, self.state.best_global_step, self.state.best_model_checkpoint)
        if best != self.state.best_model_checkpoint:
            self.state.best_model_checkpoint = best
            if self.args.should_save:  # transformers wrote the state with the staging path: write it again
                self.state.save_to_json(os.path.join(staged, TRAINER_STATE_NAME))

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any):
        """HF Trainer's train; a resume from a checkpoint inside a generation batch that cannot continue exactly is
        refused first, before any weight is loaded (trainer/guards/generation_resume.py), and a resume restores the
        run's own state once HF has loaded its own (:meth:`_restore`, at ``on_train_begin``)."""
        checkpoint = resume_from_checkpoint
        if isinstance(checkpoint, bool) and checkpoint:  # HF Trainer's own resolution of True
            checkpoint = get_last_checkpoint(self.args.output_dir)
        if not checkpoint:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                                 ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        generation_resume.check_resumable(self.args, self.accelerator.num_processes, checkpoint)
        # HF loads the weights, optimizer and scheduler, then calls on_train_begin before the first step
        restore = generation_resume.OnTrainBegin(lambda: self._restore(checkpoint))
        self.add_callback(restore)
        try:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                                 ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        finally:
            self.remove_callback(restore)

    def _restore(self, checkpoint: str) -> None:
        """The run's own state from ``checkpoint``: the stages' and guards' states, the generation buffer's micro-step
        and, mid-batch, its rest (train refuses a resume without), and each hook's (e.g. PPO's critic)."""
        path = os.path.join(checkpoint, generation_resume.STAGE_STATE_FILE)
        if os.path.exists(path):
            with open(path) as fh:
                state = json.load(fh)
            for key, obj in self._checkpointed.items():
                if key in state:
                    obj.load_state_dict(state[key])
        generation_resume.restore(self, checkpoint)
        for method in self._hooks.at("load_checkpoint"):
            method.load_checkpoint(self, checkpoint)

    # --- helpers -------------------------------------------------------------------------------------

    def _log_weight_sync(self, metrics: dict[str, float]) -> None:
        """Record one disk/lora sync's timings and size (logged with the step that generated after it)."""
        mode = "train" if self.model.training else "eval"
        for name, value in metrics.items():
            trl_contact.metrics(self, mode)[name].append(value)

    def _stage_state(self) -> dict[str, Any]:
        """What the stage state file holds: every checkpointed object's ``state_dict()`` under its key."""
        return {key: obj.state_dict() for key, obj in self._checkpointed.items()}


def _validate_runtime(args: WinnowConfig, rollout_func: Any) -> None:
    """Checks that need the trainer's arguments, not just the config; run before any model is loaded."""
    if server_url(args) is not None and args.weight_sync == "nccl" and not cuda_usable(args):
        raise ConfigError(
            "weight_sync",
            "'nccl' (TRL's broadcast) needs CUDA on the trainer and the server, and no CUDA device is visible "
            "(or use_cpu is true)",
            "use weight_sync: disk (full weights through a shared folder) or lora (PEFT adapters), or 'auto'",
        )
    if args.max_staleness > 0 and rollout_func is not None and not callable(getattr(rollout_func, "play_ahead", None)):
        raise ConfigError("max_staleness", f"{args.max_staleness} plays each batch ahead, on the main process; this "
                          f"rollout_func ({type(rollout_func).__name__}) sends its own requests from every process, "
                          "turn by turn, and has no play_ahead(trainer, prompts) to do that",
                          "use max_staleness: 0 with it (winnow's multi-turn environment rollout composes)")
    if args.old_logps_source != "sampler":
        return
    if not args.use_vllm and rollout_func is None:
        raise ConfigError(
            "old_logps_source",
            "'sampler' needs a generator that returns per-token log-probs, but use_vllm is False and no rollout_func "
            "was given (local generate returns none)",
            "set use_vllm=True, pass a rollout_func that returns 'logprobs', or use old_logps_source='policy'",
        )
    returns_logprobs = getattr(rollout_func, "returns_logprobs", None)  # a rollout_func may say (rollout.py)
    if callable(returns_logprobs) and not returns_logprobs(args):
        raise ConfigError(
            "old_logps_source",
            f"'sampler' needs per-token log-probs, and the rollout_func ({type(rollout_func).__name__}) returns none "
            "with this generation backend (the environment rollout's local model.generate backend has none)",
            "use old_logps_source='policy', or generate with the vLLM server (use_vllm=True, vllm_mode='server')",
        )
