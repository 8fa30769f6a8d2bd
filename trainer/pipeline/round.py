"""One generation batch, from TRL's hand-over to its last micro-batch: a :class:`Round`.

TRL generates and scores a generation batch (``GRPOTrainer._generate_and_score_completions``, called by the trainer's
``_prepare_inputs`` through trainer/trl_contact.py) and hands over its batch dict, this rank's rows. From there one
object owns it:

1. the method hooks that act on the batch as generated (``after_generation``: DAPO's refills; ``before_pipeline``:
   RAGEN's collapse probe);
2. one :class:`~trainer.pipeline.batch.GatheredRows` over every process, so each key of TRL's dict crosses the
   processes once, however many readers it has (the stages' view, compaction, the collapse probe, DAPO's relog);
3. the stages' typed view (:class:`~trainer.pipeline.batch.RolloutBatch`) and their one
   :class:`~trainer.pipeline.stages.Decision`, with this rank's advantages written back and the ``after_decision``
   hooks called;
4. one dealing (trainer/pipeline/dealing.py: compaction or masking, TRL's shuffle and split, the kept rows placed on
   their optimizer steps, the ranks balanced);
5. the result as ``steps_per_generation`` typed :class:`MicroBatch` es: TRL's keys, plus what winnow knows of each as
   attributes (its row scale, whether its optimizer step trains, its loss tokens over every process), so the loss
   seam reads no private key of a dict.

Collective: every rank builds its round at the same micro-step and runs the same code.

The trainer's :class:`GenerationBuffer` holds the round being trained and the micro-step counter that picks its
micro-batch; nothing of the round is kept on the trainer. TRL 1.16 keeps both as privates of its trainer
(``_buffered_inputs``, ``_step``; trl==1.16.0: trl/trainer/grpo_trainer.py:948-951, 1513, 1538-1546) and fills them
inside its ``_prepare_inputs``. winnow re-deals a batch's rows over its optimizer steps after the split
(trainer/algorithms/deal_plan.py), skips micro-batches that train nothing, and checkpoints the batch for an exact
resume (trainer/guards/generation_resume.py); done on TRL's privates, each of those wrote TRL's state from outside.
This object owns them instead: the trainer's ``_prepare_inputs`` asks TRL for a generation batch when
:meth:`GenerationBuffer.due`, :meth:`fill`\\s the buffer with the batch's round, which deals it, and its
``training_step`` calls :meth:`advance` after every micro-step, trained or skipped.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from trainer import trl_contact
from trainer.pipeline import stages, step_logs, token_budget
from trainer.pipeline.batch import GatheredRows, RolloutBatch, gather_padded
from trainer.pipeline.dealing import KEPT_KEY, DealSettings, deal, loss_tokens
from trainer.pipeline.stages import BuiltHooks
from trainer.pipeline.step_logs import PhaseTimer

# The dealing's per-micro-batch facts, as the dealing writes them into its dicts (and a mid-batch checkpoint stores
# them: trainer/guards/generation_resume.py); a MicroBatch carries them as attributes instead.
ROW_SCALE_KEY = "winnow_loss_scale"
ALL_DROPPED_KEY = "winnow_all_dropped"


class MicroBatch(dict):
    """One micro-batch: TRL's batch dict of its rows (TRL's keys, and the per-row inputs of the configured stages' loss
    variants), so TRL's own loss takes it as it is, with winnow's facts as attributes:

    - ``row_scale``: the row-normalised losses' scale of a thinned batch (compaction's ``N/K * B'/B``, or a
      ``filtered_updates`` mini-batch's; trainer/pipeline/dealing.py), or None;
    - ``trains``: False when its whole optimizer step holds no kept row on any rank (it then runs no forward);
    - ``step_tokens``: its loss tokens summed over every process (counted only when stages can remove rollouts:
      the empty-step guard reads it, trainer/guards/step_skip.py), or None.
    """

    def __init__(self, inputs: dict[str, Any], *, row_scale: torch.Tensor | None = None, trains: bool = True,
                 step_tokens: float | None = None):
        super().__init__(inputs)
        self.row_scale, self.trains, self.step_tokens = row_scale, trains, step_tokens

    @classmethod
    def dealt(cls, inputs: dict[str, Any], step_tokens: float | None = None) -> MicroBatch:
        """A micro-batch from the dealing's dict: its private keys become attributes (or a checkpoint's saved dict)."""
        inputs = dict(inputs)
        row_scale = inputs.pop(ROW_SCALE_KEY, None)
        trains = inputs.pop(ALL_DROPPED_KEY, None) is None
        inputs.pop(KEPT_KEY, None)  # the deal's own marker, when no step dealing removed it
        return cls(inputs, row_scale=row_scale, trains=trains, step_tokens=step_tokens)

    def with_values(self, **values: Any) -> MicroBatch:
        """A copy with some of TRL's keys replaced, winnow's facts kept."""
        return MicroBatch({**self, **values}, row_scale=self.row_scale, trains=self.trains,
                          step_tokens=self.step_tokens)

    def saved(self) -> dict[str, Any]:
        """The plain dict a mid-batch checkpoint stores (``torch.load(weights_only=True)`` reads plain dicts only)."""
        out = dict(self)
        if self.row_scale is not None:
            out[ROW_SCALE_KEY] = self.row_scale
        if not self.trains:
            out[ALL_DROPPED_KEY] = torch.tensor(1)
        return out



def typed_micro_batches(dealt: list[dict[str, Any]], accelerator: Any, count_tokens: bool) -> list[MicroBatch]:
    """The dealing's micro-batch dicts as MicroBatches; with ``count_tokens``, each one's loss tokens over every
    process (its ``step_tokens``: what the empty-step guard decides an optimizer step by), in one all-reduce of S
    numbers for the generation batch (collective then)."""
    if not count_tokens or not dealt:
        return [MicroBatch.dealt(mb) for mb in dealt]
    local = torch.stack([loss_tokens(mb).to(torch.float64) for mb in dealt]).to(accelerator.device)
    total = accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local
    return [MicroBatch.dealt(mb, float(tokens)) for mb, tokens in zip(dealt, total.tolist())]


@dataclass(frozen=True)
class RoundParts:
    """What every round of a run reads, built once with the trainer: its method hooks, its phase timer, the configured
    stages (pipeline order), the per-row inputs they need and their checkpointed states, and whether stages can
    remove rollouts (then the round deals kept rows to their optimizer steps and counts each step's tokens)."""

    hooks: BuiltHooks
    timer: PhaseTimer
    stages: list[stages.Stage]
    needs: frozenset[str]
    stage_states: dict[str, Any]
    counts_step_tokens: bool


class Round:
    """One generation batch of a run (see the module docstring). ``output``: TRL's batch dict as generated and
    scored, this rank's rows; ``marks``: the lengths of TRL's metric lists before it was generated (DAPO relogs what
    its rounds appended); ``first_micro_step``: the generation buffer's counter when it was generated."""

    def __init__(self, trainer: Any, output: dict[str, Any], marks: dict[str, int], first_micro_step: int,
                 micro_batches: list[MicroBatch] | None = None):
        self.trainer, self.output, self.marks, self.first_micro_step = trainer, output, marks, first_micro_step
        self._gathered: GatheredRows | None = None
        self.decision: stages.Decision | None = None
        self.empty = False  # no kept rollout with a loss token: the generation batch trains nothing
        self.updates = 0  # its optimizer steps that train a kept row
        self.micro_batches: list[MicroBatch] = micro_batches or []

    @classmethod
    def restored(cls, trainer: Any, micro_batches: list[dict[str, Any]], first_micro_step: int) -> Round:
        """The rest of a round from a mid-batch checkpoint: its dealt micro-batches as saved (collective when the
        empty-step guard counts tokens)."""
        typed = typed_micro_batches(micro_batches, trainer.accelerator, trainer.round_parts.counts_step_tokens)
        return cls(trainer, {}, {}, first_micro_step, micro_batches=typed)

    def gathered(self, output: dict[str, Any] | None = None) -> GatheredRows:
        """The batch's rows over every process (the round's batch dict, or ``output`` where a hook replaced it);
        each key gathered once, on its first read (collective then)."""
        output = self.output if output is None else output
        if self._gathered is None or self._gathered.output is not output:
            trainer = self.trainer
            self._gathered = GatheredRows(output, trainer.accelerator, trl_contact.pad_token_id(trainer))
        return self._gathered

    def run(self) -> None:
        """Hooks, stages, dealing: the round's micro-batches (collective)."""
        tr, parts = self.trainer, self.trainer.round_parts
        initial_keep = None
        trl_contact.metrics(tr)[step_logs.PROMPT_DIGEST].append(step_logs.prompt_digest(self.output, tr.accelerator))
        for method in parts.hooks.at("after_generation"):  # e.g. DAPO: constant-reward groups replaced by new ones
            self.output, initial_keep = method.after_generation(tr, self.output, self.marks)
        step = tr.state.global_step + 1
        for method in parts.hooks.at("before_pipeline"):  # the unfiltered batch (RAGEN's collapse probe)
            method.before_pipeline(tr, self.output, step)
        batch = self.rollout_batch(initial_keep)
        with parts.timer.phase("stage_pipeline"):
            self.decision = stages.run_pipeline(batch, tr.args)
        self._write_decision(batch)
        for method in parts.hooks.at("after_decision"):  # e.g. RAGEN's reward-variance stop
            method.after_decision(tr, self.decision)
        with parts.timer.phase("stage_pipeline"):
            self._deal()

    def rollout_batch(self, keep: torch.Tensor | None = None) -> RolloutBatch:
        """The stages' typed view of the batch over every process (collective). ``keep``: the initial global keep
        mask (dynamic sampling's top-up groups start dropped)."""
        tr, output, parts = self.trainer, self.output, self.trainer.round_parts
        gathered = self.gathered()
        computed: dict[str, Any] = {}  # this rank's rows of every needed input (stages.register_input)
        for spec in stages.input_providers(parts.needs):
            # timed only when it runs: a phase that did not run logs no key
            with parts.timer.phase(spec.phase) if spec.phase else nullcontext():
                computed.update(spec.compute(tr, output, parts.needs, computed))
        rows = {k: v for k, v in computed.items() if not k.startswith("_")}
        old_logps, entropies = rows.pop("old_logps", None), rows.pop("entropies", None)
        acc = tr.accelerator

        def gather_rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else gather_padded(acc, t, 0)

        extras: dict[str, Any] = {"global_step": tr.state.global_step, "max_steps": tr.state.max_steps}
        extras.update({k: gather_rows(v) for k, v in rows.items() if v is not None})
        return RolloutBatch(
            R_k=tr.global_rewards_per_func,
            reward_weights=tr.reward_weights.to(output["completion_mask"].device),
            reward_names=list(tr.reward_func_names),
            G=tr.num_generations,
            completion_ids=gathered["completion_ids"],
            mask=gathered.loss_mask().float(),
            old_logps=gather_rows(old_logps),
            entropies=gather_rows(entropies),
            extras=extras,
            keep=keep,
            stage_state=parts.stage_states,
        )

    def _write_decision(self, batch: RolloutBatch) -> None:
        """This rank's rows of the decision into TRL's batch dict (advantages, the stages' loss inputs), the
        completions table's advantages and the stages' metrics."""
        tr, output, decision = self.trainer, self.output, self.decision
        B, T = output["completion_ids"].shape
        rank = tr.accelerator.process_index
        rows = slice(rank * B, (rank + 1) * B)
        for stage in tr.round_parts.stages:  # per-row tensors the loss variants read in every micro-batch
            if stage.loss_inputs is not None:
                for key, t in stage.loss_inputs(batch, tr.args).items():
                    output[key] = t[rows, :T] if t.dim() >= 2 else t[rows]
        step_logs.table_advantages(trl_contact.completion_logs(tr), decision.advantages, batch.mask)
        advantages = decision.advantages[rows]
        output["advantages"] = advantages[:, :T] if advantages.dim() == 2 else advantages
        self.empty = not bool((decision.keep & batch.trainable).any())
        metrics = trl_contact.metrics(tr)
        for name, value in decision.metrics.items():
            metrics[name].append(value)

    def _deal(self) -> None:
        """The micro-batches: removed rows compacted away or masked, TRL's split, kept rows dealt to their optimizer
        steps (trainer/pipeline/dealing.py), then each step's loss tokens counted once over the processes."""
        tr, args = self.trainer, self.trainer.args
        world = tr.accelerator.num_processes
        settings = DealSettings(
            steps_per_generation=args.steps_per_generation,
            accumulation=args.gradient_accumulation_steps,
            micro_batch_rows=args.per_device_train_batch_size,
            passes=tr.num_iterations,
            filtered_updates=args.filtered_updates,
            compact=args.compact_batch,
            balance_tokens=token_budget.balances_rank_tokens(args, world),
            loss_type=tr.loss_type,
            pad_token_id=trl_contact.pad_token_id(tr),
            step_dealing=tr.round_parts.counts_step_tokens,
        )
        dealt = deal(self.output, self.decision.keep, self.decision.advantages, settings=settings,
                     first_micro_step=self.first_micro_step, accelerator=tr.accelerator, gathered=self.gathered())
        self._gathered = None  # dealt: the gathered rows are not read again
        if dealt.rank_tokens is not None and world > 1:  # what each rank's forwards pay for, after compaction
            trl_contact.metrics(tr)["tokens/rank_max"].append(float(dealt.rank_tokens.max()))
            trl_contact.metrics(tr)["tokens/rank_min"].append(float(dealt.rank_tokens.min()))
        self.updates = 0 if self.empty else dealt.updates
        self.micro_batches = typed_micro_batches(dealt.micro_batches, tr.accelerator,
                                                 tr.round_parts.counts_step_tokens)


class GenerationBuffer:
    """A generation batch's ``steps_per_generation`` (S) micro-batches, replayed ``num_iterations`` (mu) times, and
    the run's micro-step counter. A new batch is due every S x mu micro-steps, and when nothing is buffered (a run's
    start, or a resume on a batch boundary). Checkpointed state (the stages.Checkpointed protocol): the counter."""

    def __init__(self, steps_per_generation: int, num_iterations: int):
        self.steps_per_generation = int(steps_per_generation)
        self.num_iterations = int(num_iterations)
        self.micro_step = 0  # micro-steps trained (or skipped) so far in this run
        self.round: Round | None = None  # the generation batch being trained

    @property
    def micro_steps_per_batch(self) -> int:
        """S x mu: the micro-steps one generation batch trains (TRL's ``generate_every``)."""
        return self.steps_per_generation * self.num_iterations

    @property
    def micro_batches(self) -> list[MicroBatch] | None:
        """The round's micro-batches, in order of use (None before the first round)."""
        return None if self.round is None else self.round.micro_batches

    def due(self) -> bool:
        """Whether the next micro-step needs a new generation batch."""
        return self.round is None or self.micro_step % self.micro_steps_per_batch == 0

    def at_batch_boundary(self) -> bool:
        """Whether the micro-steps so far end a generation batch (the next one generates)."""
        return self.micro_step % self.micro_steps_per_batch == 0

    def fill(self, round_: Round) -> None:
        """Buffer a new generation batch's round (dealt by its ``run`` after this, or restored already dealt)."""
        self.round = round_

    def current(self) -> MicroBatch:
        """The micro-batch of the current micro-step."""
        batches = self.micro_batches
        if batches is None:
            raise RuntimeError("no generation batch is buffered: call fill() when due() says so")
        if len(batches) != self.steps_per_generation:
            raise ValueError(f"a generation batch splits into steps_per_generation={self.steps_per_generation} "
                             f"micro-batches, got {len(batches)}")
        return batches[self.micro_step % self.steps_per_generation]

    def advance(self) -> None:
        """Count one micro-step (after its backward, or after it was skipped)."""
        self.micro_step += 1

    def state_dict(self) -> dict[str, int]:
        """The counter (global_step x gradient_accumulation_steps at a checkpoint)."""
        return {"micro_step": self.micro_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Set the counter back to a checkpoint's value (the batch itself is restored by generation_resume)."""
        self.micro_step = int(state["micro_step"])
