"""The value model of PPO: a scalar head on the policy's architecture, its own AdamW, trained on the policy's
micro-batches.

As verl builds and reads it (volcengine/verl verl/workers/fsdp_workers.py, CriticWorker: the config's
``num_labels = 1`` and ``classifier_dropout = 0.0``, ``AutoModelForTokenClassification``; verl/workers/critic/
dp_critic.py ``_forward_micro_batch``: ``values = logits[:, -response_length - 1 : -1]``): the value of completion
token t is the head's output at the position before it, the state the token is chosen in.

Why a second module and optimizer rather than one wrapper around policy and value (TRL's PPO
``PolicyAndValueWrapper``): TRL's GRPOTrainer builds, prepares and syncs the policy to vLLM by its own parameter names;
a wrapper would rename every one of them. The critic is prepared by accelerate on its own (DDP across processes), has
its own learning rate and clipping as verl's critic worker does, and steps right after the policy's optimizer step.
"""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForTokenClassification

from trainer import trl_contact
from trainer.algorithms.gae import clipped_value_terms
from trainer.guards.step_skip import arm_zero_skip
from trainer.loss.trl_terms import trl_normalise
from trainer.pipeline.token_budget import weighted_parts

HOOK_KEY = "ppo_critic"  # the key the critic hook is registered under (trainer/methods/ppo/hook.py)

class Critic:
    """The value model, its optimizer and its update, for one run (built by the ``ppo_critic`` hook)."""

    def __init__(self, trainer: Any):
        args = trainer.args
        policy = trainer.accelerator.unwrap_model(trainer.model)
        self.path = args.critic_model_name_or_path or policy.name_or_path
        self.args, self.accelerator = args, trainer.accelerator
        # verl's critic config: one label, no classifier dropout. transformers 5 drops config kwargs the config
        # class does not declare, and its token-classification head then falls back to dropout 0.1: set it after.
        config = AutoConfig.from_pretrained(self.path, num_labels=1, pad_token_id=trl_contact.pad_token_id(trainer))
        config.update({"classifier_dropout": 0.0})
        # Seeded apart from the run's RNG stream: the head's initialisation must not move TRL's shuffles.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(args.seed)
            model = AutoModelForTokenClassification.from_pretrained(self.path, config=config, dtype=torch.float32)
        if args.gradient_checkpointing:  # as the policy (verl's critic model.enable_gradient_checkpointing)
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs or {"use_reentrant": False})
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(self.parameters, lr=args.critic_learning_rate,
                                      weight_decay=args.critic_weight_decay)
        self.deepspeed = getattr(trainer.accelerator.state, "deepspeed_plugin", None) is not None
        if self.deepspeed:
            # an engine of its own, with the policy's ZeRO stage (sharded under ZeRO-3 like the policy)
            self.model, self.optimizer = deepspeed_engine(model, optimizer, trainer.accelerator, args)
        else:
            # accelerate wraps the model (DDP across processes, the run's autocast); the optimizer stays a plain
            # AdamW stepped here, so no gradient-accumulation or loss-scaler rule of accelerate's applies to it twice.
            self.model, self.optimizer = trainer.accelerator.prepare_model(model), optimizer
        self.model.train()

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_tokens: int) -> torch.Tensor:
        """V per completion token (rows, completion_tokens), float32: the head at the position before each token."""
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits[:, -completion_tokens - 1:-1, 0].float()

    @torch.no_grad()
    def old_values(self, output: dict[str, Any], rows_per_forward: int) -> torch.Tensor:
        """The critic's values of this rank's rows of a new generation batch, before any update (no grad), in
        forwards of ``rows_per_forward`` rows."""
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        C = output["completion_ids"].shape[1]
        chunks = [self.values(ids[i:i + rows_per_forward], mask[i:i + rows_per_forward], C)
                  for i in range(0, ids.shape[0], rows_per_forward)]
        return torch.cat(chunks) if chunks else ids.new_zeros((0, C), dtype=torch.float32)

    def loss(self, trainer: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, ...]]]:
        """verl's clipped value loss on one micro-batch, aggregated as the policy's loss is (the loss type's
        normaliser, gradient accumulation included: verl's critic takes the actor's loss_agg_mode), times
        ``vf_coef``; and the micro-batch's value statistics as (sum over its loss tokens, token count)."""
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
        mask = mask.float()
        V = self.values(ids, attention, inputs["completion_ids"].shape[1])
        per_token, clipped = clipped_value_terms(V, inputs["returns"], inputs["old_values"], self.args.cliprange_value)
        loss = trl_normalise(trainer, per_token, mask, inputs) * self.args.vf_coef
        row_scale = getattr(inputs, "row_scale", None)  # compaction's row scale (MicroBatch), as the policy's
        if row_scale is not None:
            loss = loss * row_scale
        tokens = mask.sum().detach()
        stats = {"critic/vf_loss": ((per_token.detach() * mask).sum(), tokens),
                 "critic/vf_clipfrac": ((clipped.float() * mask).sum(), tokens),
                 "critic/vpred_mean": ((V.detach() * mask).sum(), tokens)}
        return loss, stats

    def train_micro_batch(self, trainer: Any, inputs: dict[str, Any]) -> dict[str, tuple[torch.Tensor, ...]]:
        """The value loss of one training micro-batch, backward into the critic's gradient (the optimizer steps at
        the policy's step: :meth:`step`); returns the value statistics as :meth:`loss` does. With
        ``micro_batch_tokens`` the critic runs the policy's token-budget chunks (trainer/pipeline/token_budget.py:
        the same chunks, weights and ZeRO-3 filler forwards), so its activations respect the same budget."""
        parts = weighted_parts(trainer, inputs)
        totals: dict[str, list[torch.Tensor]] = {}
        for i, (chunk, weight, filler) in enumerate(parts):
            loss, stats = self.loss(trainer, chunk)
            self.backward(loss * weight, final=i + 1 == len(parts))
            if filler:  # a forward for ZeRO-3's collectives only: no contribution, no statistics
                continue
            for key, (total, count) in stats.items():
                acc = totals.setdefault(key, [total * 0, count * 0])
                acc[0], acc[1] = acc[0] + total, acc[1] + count
        return {key: (total, count) for key, (total, count) in totals.items()}

    def backward(self, loss: torch.Tensor, final: bool = True) -> None:
        """Backward of one (chunk of a) micro-batch's value loss, already divided by the accumulation steps. The
        gradient is synchronised only by the last backward of the policy's sync micro-step (``final`` chunk while
        accelerate's ``sync_gradients``): DDP runs the others under ``no_sync``; a DeepSpeed engine is told the
        accumulation boundary explicitly, as accelerate's ``DeepSpeedEngineWrapper.backward`` tells the policy's, but
        its boundary step waits for the policy's optimizer step (:meth:`step` / :meth:`skip_step`), so a skipped
        policy step skips the critic's too."""
        sync = final and self.accelerator.sync_gradients
        if self.deepspeed:
            self.model.set_gradient_accumulation_boundary(sync)
            self.model.backward(loss, scale_wrt_gas=False)
            return
        with contextlib.nullcontext() if sync else self.accelerator.no_sync(self.model):
            loss.backward()

    def step(self) -> float | None:
        """The critic's update at the policy's optimizer step: gradient clipped to ``critic_max_grad_norm`` (the
        engine's ``gradient_clipping`` under DeepSpeed), optimizer stepped, gradient cleared; returns the gradient's
        norm before clipping (None with clipping off)."""
        if self.deepspeed:
            self.model.step()
            norm = self.model.get_global_grad_norm()
            return None if norm is None or self.args.critic_max_grad_norm <= 0 else float(norm)
        norm = None
        if self.args.critic_max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, self.args.critic_max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def skip_step(self) -> None:
        """The policy's step was skipped (an empty or non-finite step): drop the critic's gradient too, no update
        (DeepSpeed: the engine's boundary step through the ZeRO optimizer's overflow path, as the policy's)."""
        if self.deepspeed:
            arm_zero_skip(self.optimizer)
            self.model.step()
            return
        self.optimizer.zero_grad(set_to_none=True)

    def save(self, folder: str) -> None:
        """The critic's weights and optimizer state into ``folder`` (collective: every rank calls it). DeepSpeed:
        the engine's own checkpoint (each rank's shards)."""
        if self.deepspeed:
            self.model.save_checkpoint(folder, tag="critic")
            return
        if self.accelerator.is_main_process:
            os.makedirs(folder, exist_ok=True)
            self.accelerator.unwrap_model(self.model).save_pretrained(folder, safe_serialization=True)
            torch.save(self.optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))

    def load(self, folder: str) -> None:
        """Restore what :meth:`save` wrote (weights and optimizer state)."""
        if self.deepspeed:
            self.model.load_checkpoint(folder, tag="critic", load_optimizer_states=True,
                                       load_lr_scheduler_states=False)
            return
        state = load_file(os.path.join(folder, "model.safetensors"), device="cpu")
        self.accelerator.unwrap_model(self.model).load_state_dict(state)
        self.optimizer.load_state_dict(torch.load(os.path.join(folder, "optimizer.pt"), map_location="cpu",
                                                  weights_only=True))


def deepspeed_engine(model: torch.nn.Module, optimizer: torch.optim.Optimizer, accelerator: Any,
                     args: Any) -> tuple[Any, Any]:
    """A DeepSpeed engine for the critic from the run's DeepSpeed config, as TRL prepares its reference model
    (trl==1.16.0:trl/models/utils.py ``prepare_deepspeed``: ZeRO-3 bucket sizes from the hidden size) but for
    training: the critic's own AdamW, gradient clipping ``critic_max_grad_norm``, the policy's micro-batch and
    accumulation; no optimizer / scheduler block of the policy's and no optimizer offload (a torch AdamW)."""
    # heavy: only under DeepSpeed (TRL imports it lazily for the same reason)
    import deepspeed  # noqa: PLC0415

    config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    for key in ("optimizer", "scheduler", "train_batch_size"):
        config.pop(key, None)
    zero = config.setdefault("zero_optimization", {})
    zero.pop("offload_optimizer", None)
    hidden = getattr(model.config, "hidden_size", None)
    if zero.get("stage") == 3 and hidden is not None:
        zero.update(reduce_bucket_size=hidden * hidden, stage3_param_persistence_threshold=10 * hidden,
                    stage3_prefetch_bucket_size=int(0.9 * hidden * hidden))
    config.update(train_micro_batch_size_per_gpu=args.per_device_train_batch_size,
                  gradient_accumulation_steps=args.gradient_accumulation_steps,
                  gradient_clipping=float(args.critic_max_grad_norm), zero_allow_untested_optimizer=True)
    config["bf16"] = {"enabled": bool(args.bf16)}
    config["fp16"] = {"enabled": False}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, optimizer
