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
4. one dealing (below: compaction or masking, TRL's shuffle and split, the kept rows placed on
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

Dealing (:func:`deal`): after the stages decide (kept rows, advantages), this rank's share of the batch is built
once as ``steps_per_generation`` micro-batches:

1. removed rows leave the batch (compaction, below: every rank takes an equal share of the kept rows) or stay in it
   masked out of the loss and its normalisers (``compact_batch: false``, or a batch that cannot be re-dealt row by
   row, such as images); when nothing was removed (and no rank balance asks for a re-deal) the batch is TRL's,
   untouched;
2. the batch is shuffled and split as TRL 1.16 splits it (:func:`trainer.trl_contact.split_generation_batch`);
3. when stages can remove rows, the kept rows are moved to their optimizer steps (:func:`redeal`, by the plan of
   ``filtered_updates``: trainer/algorithms/deal_plan.py).

Every rank makes the same choices from the global decision, so the result needs no more communication than the
gather of the batch the stages read (trainer/pipeline/batch.py) and, for some loss types, one reduction (both
collective: every rank calls :func:`deal`).

Compaction: rollouts the stages removed leave the training batch instead of riding along masked.

Masking a removed rollout gives the right loss but still pays its forward and backward; the reference codes
then pad the smaller batch by duplicating rows, which biases the update. Here, after the stages decide, every
rank gathers the kept rows of the whole generation batch, takes an equal share (round-robin over the kept
rows' global order; with token-budget micro-batches, the same row counts chosen so every rank holds about as many
tokens: trainer/algorithms/rank_balance.py), and fills its share up to a multiple of ``steps_per_generation`` with
*zero-weight* rows: a copy of a kept row whose loss mask (TRL's ``tool_mask``) and advantage are zero, so it is
counted in no token normaliser and, through ``winnow_loss_scale``, in no row normaliser either. TRL then shuffles
and splits the smaller local batch into the same number of micro-steps as before, so every rank runs the same number
of forward/backward calls (DDP and ZeRO-3 collectives cannot deadlock, even for a rank that held no kept row).

Equivalence with the masked formulation (tested per loss type): token-normalised losses (dapo, cispo, vespo)
divide by the global kept-token count, which compaction keeps; row-normalised ones (grpo, sapo, dr_grpo,
luspo) divide by the micro-batch's row count, which compaction changes from B to B' -- the loss scale
``N/K * B'/B`` restores each kept row's weight exactly. Both hold step for step when one optimizer step
consumes the whole generation batch (``steps_per_generation == gradient_accumulation_steps``); with several
optimizer steps per generation, the re-deal then deals the kept rows over the steps
(``filtered_updates``) after TRL's shuffle. ``bnpo`` and TRL's entropy bonus normalise by the loss tokens of each
process's micro-batch (DDP then averages over processes), so they equal the masked formulation only with one
process and one micro-batch per optimizer step: with more processes the re-deal changes which kept rows share a
process, hence each process's normaliser (TRL's own bnpo likewise depends on how its shuffle deals rows).

Multimodal batches (pixel values, image counts) are left masked: their per-image tensors do not split by row.
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch

from trainer import trl_contact
from trainer.algorithms.deal_plan import PROPORTIONAL, VERL_MINIBATCH, DealPlan, compacted_micro_rows, optimizer_steps
from trainer.algorithms.normalisers import BATCH_TOKEN_NORMALISED, ROW_NORMALISED
from trainer.algorithms.rank_balance import balanced_shares, round_robin_counts, round_robin_shares
from trainer.pipeline import stages, step_logs, token_budget
from trainer.pipeline.batch import (
    ALL_DROPPED_KEY,
    KEPT_KEY,
    ROW_SCALE_KEY,
    GatheredRows,
    RolloutBatch,
    gather_padded,
    row_keys,
    trim_padding,
)
from trainer.pipeline.stages import BuiltHooks
from trainer.pipeline.step_logs import PhaseTimer

_warned_redeal: set[str] = set()  # keys already warned of, once each
logger = logging.getLogger(__name__)


class MicroBatch(dict):
    """One micro-batch: TRL's batch dict of its rows (TRL's keys, and the per-row inputs of the configured stages' loss
    variants), so TRL's own loss takes it as it is, with winnow's facts as attributes:

    - ``row_scale``: the row-normalised losses' scale of a thinned batch (compaction's ``N/K * B'/B``, or a
      ``filtered_updates`` mini-batch's; :func:`deal`), or None;
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
        steps (:func:`deal`), then each step's loss tokens counted once over the processes."""
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


# -- the dealing: the decision to this rank's micro-batches (the module docstring's part 'Dealing') -------------

@dataclass(frozen=True)
class DealSettings:
    """The recipe's settings the dealing reads; identical on every process."""

    steps_per_generation: int  # S: micro-batches per generation batch
    accumulation: int  # A: gradient_accumulation_steps
    micro_batch_rows: int  # per_device_train_batch_size
    passes: int  # num_iterations: the micro-batches are replayed this many times
    filtered_updates: str  # deal_plan.FILTERED_UPDATES
    compact: bool  # compact_batch
    balance_tokens: bool  # compaction balances the ranks' tokens (balance_rank_tokens with a token budget, > 1 rank)
    loss_type: str  # TRL's loss_type: which normaliser a re-deal must correct (trainer/algorithms/normalisers.py)
    pad_token_id: int
    step_dealing: bool  # stages can remove rows: kept rows are dealt to their optimizer steps


@dataclass
class Dealt:
    """This rank's micro-batches of a generation batch, in order of use, and what the dealing counted."""

    micro_batches: list[dict[str, Any]]
    updates: int  # optimizer steps of the batch (all passes) that train at least one kept row
    rank_tokens: torch.Tensor | None = None  # (world,) each rank's real tokens after compaction, fillers included


def deal(output: dict[str, Any], keep: torch.Tensor, advantages: torch.Tensor, *, settings: DealSettings,
         first_micro_step: int, accelerator: Any, gathered: GatheredRows | None = None) -> Dealt:
    """Deal ``output`` (TRL's local batch dict, this rank's rows, advantages written) by the global decision ``keep``
    (N,) and ``advantages`` (N,) or (N, T), the micro-step counter standing at ``first_micro_step``; ``gathered``:
    the batch's rows over every process as the stages read them (trainer/pipeline/batch.py). Collective."""
    S, A = settings.steps_per_generation, settings.accumulation
    batch, plan, rank_tokens = _remove_rows(output, keep, advantages, settings, first_micro_step, accelerator,
                                            gathered)
    micro_batches = trl_contact.split_generation_batch(batch, S)
    updates = optimizer_steps(first_micro_step, S, A, settings.passes)
    if plan is not None and settings.step_dealing:
        micro_batches = redeal(
            micro_batches,
            plan,
            accelerator.process_index,
            row_normalised=settings.loss_type in ROW_NORMALISED,
            token_normalised=settings.loss_type in BATCH_TOKEN_NORMALISED,
            reduce_sum=lambda t: accelerator.reduce(t, reduction="sum") if accelerator.num_processes > 1 else t,
        )
        updates = plan.updates()
    return Dealt(micro_batches, updates, rank_tokens)


def _remove_rows(
    output: dict[str, Any], keep: torch.Tensor, advantages: torch.Tensor, settings: DealSettings,
    first_micro_step: int, accelerator: Any, gathered: GatheredRows | None,
) -> tuple[dict[str, Any], DealPlan | None, torch.Tensor | None]:
    """Step 1: the batch to split (compacted, or ``output`` with removed rows masked in place), the plan that deals
    its kept rows, and the ranks' tokens after compaction; ``(output, None, None)`` when nothing was removed and
    nothing asks for a re-deal (TRL's batch as it is)."""
    S, world, rank = settings.steps_per_generation, accelerator.num_processes, accelerator.process_index
    if bool(keep.all()) and not settings.balance_tokens:
        return output, None, None  # nothing removed: TRL's masks and normalisers stay untouched (off means off)
    K = int(keep.sum())
    common = dict(mode=settings.filtered_updates, micro_batches=S, accumulation=settings.accumulation,
                  first_micro_step=first_micro_step, passes=settings.passes,
                  recipe_micro_rows=settings.micro_batch_rows)
    if settings.compact:
        micro_rows = compacted_micro_rows(K, world, S, settings.accumulation, settings.micro_batch_rows,
                                          settings.filtered_updates)
        compacted = compact(output, keep, advantages, accelerator=accelerator, pad_token_id=settings.pad_token_id,
                            steps_per_generation=S, micro_batch_rows=settings.micro_batch_rows,
                            rows_per_step=micro_rows, balance_tokens=settings.balance_tokens, gathered=gathered)
        if compacted is not None:
            rank_tokens = compacted.pop("winnow_rank_tokens", None)
            counts = tuple(round_robin_counts(K, world))
            return compacted, DealPlan(counts=counts, micro_rows=micro_rows, **common), rank_tokens
    # masked: removed rows stay, out of the loss (TRL's loss-only tool_mask) and of every normaliser
    B = output["completion_ids"].shape[0]
    rows = slice(rank * B, (rank + 1) * B)
    local_keep = keep[rows].unsqueeze(1)
    tool_mask = output.get("tool_mask")
    tool_mask = torch.ones_like(output["completion_mask"]) if tool_mask is None else tool_mask
    output["tool_mask"] = tool_mask * local_keep.to(tool_mask.dtype)  # loss-only mask: attention is untouched
    loss_mask = output["completion_mask"] * output["tool_mask"]
    output["num_items_in_batch"] = accelerator.gather(loss_mask.sum()).sum()
    N = keep.numel()
    output[ROW_SCALE_KEY] = torch.tensor(N / max(K, 1), device=output["advantages"].device)
    output[KEPT_KEY] = keep[rows].clone()
    counts = tuple(int(c) for c in keep.view(world, B).sum(dim=1))
    return output, DealPlan(counts=counts, micro_rows=B // S, **common), None


# -- compaction: removed rows leave the batch ------------------------------------------------------------

def compact(
    output: dict[str, Any],
    keep: torch.Tensor,
    advantages: torch.Tensor,
    *,
    accelerator: Any,
    pad_token_id: int,
    steps_per_generation: int,
    micro_batch_rows: int,
    rows_per_step: int | None = None,
    balance_tokens: bool = False,
    gathered: GatheredRows | None = None,
) -> dict[str, Any] | None:
    """This rank's compacted share of the generation batch (collective: every rank must call it).

    ``keep`` (N,) and ``advantages`` (N,) or (N, T) are the pipeline's global decision; ``output`` is TRL's
    local batch dict. ``rows_per_step`` is the rows of each local micro-batch (default: the fewest that spread
    this rank's share over all micro-steps; trainer/algorithms/deal_plan.py sizes it per ``filtered_updates``). The
    result marks the rank's kept rows (``winnow_kept``). Returns the new dict, or None when the batch cannot
    be compacted. ``balance_tokens``: the ranks' shares keep round-robin's row counts but are chosen so their real
    tokens (prompt + completion) are about equal (trainer/algorithms/rank_balance.py), and the zero-weight filler is
    the shortest kept row. When any row is kept, the result carries ``winnow_rank_tokens`` (world,), each rank's
    real tokens including fillers, for the caller to log and remove. ``gathered``: the generation batch's
    :class:`GatheredRows` over ``output`` when the caller has one (keys its other readers gathered are not gathered
    again)."""
    keys = row_keys(output)
    if keys is None:
        return None
    world, rank = accelerator.num_processes, accelerator.process_index
    if gathered is None:
        gathered = GatheredRows(output, accelerator, pad_token_id)
    if gathered.output is not output:
        raise ValueError("compact: the gathered rows are of another batch dict")
    glob = {key: gathered[key] for key in keys}
    if "tool_mask" not in glob:  # TRL has no tool mask without tools: every model token counts (its pad is 1 too)
        glob["tool_mask"] = torch.ones_like(glob["completion_mask"])
        keys.append("tool_mask")
    N = glob["completion_ids"].shape[0]
    kept = keep.nonzero().squeeze(1)
    K = int(kept.numel())
    loss_tokens = glob["completion_mask"] * glob["tool_mask"]

    per_rank = max(1, math.ceil(K / world))
    if rows_per_step is None:
        rows_per_step = math.ceil(per_rank / steps_per_generation)
    size = rows_per_step * steps_per_generation
    real = (glob["prompt_mask"].sum(dim=1) + glob["completion_mask"].sum(dim=1))[kept]  # a kept row's tokens
    if balance_tokens and K:
        shares = balanced_shares(real.tolist(), world)
        filler_at = int(real.argmin())  # the cheapest row to carry at weight zero
    else:
        shares = round_robin_shares(K, world)
        filler_at = 0
    mine = kept[torch.tensor(shares[rank], dtype=torch.long, device=kept.device)]
    filler = kept[filler_at] if K else torch.tensor(0, device=keep.device)
    rows = torch.cat([mine, filler.repeat(size - mine.numel())])
    weight = torch.zeros(size, dtype=glob["tool_mask"].dtype, device=rows.device)
    weight[: mine.numel()] = 1

    # Row tensors first: TRL's shuffle takes the batch size from the first value of the dict.
    new = {key: glob[key][rows] for key in keys}
    new.update({k: v for k, v in output.items() if k not in new and torch.is_tensor(v) and v.dim() == 0})
    new["tool_mask"] = new["tool_mask"] * weight.unsqueeze(1)
    new[KEPT_KEY] = weight > 0
    A = advantages[rows]
    if A.dim() == 2:
        A = A[:, : new["completion_ids"].shape[1]]
    new["advantages"] = A * (weight if A.dim() == 1 else weight.unsqueeze(1)).to(A.dtype)
    trim_padding(new)
    new["num_items_in_batch"] = loss_tokens[kept].sum() if K else loss_tokens.new_zeros(())
    # Row-normalised losses: TRL divides each micro-batch by its rows (now rows_per_step instead of
    # micro_batch_rows); the masked formulation weighted each kept row N/K / micro_batch_rows.
    scale = (N / max(K, 1)) * rows_per_step / micro_batch_rows
    new[ROW_SCALE_KEY] = torch.tensor(scale, device=A.device)
    if K == 0:
        new[ALL_DROPPED_KEY] = torch.tensor(1, device=A.device)
    if K:  # each rank's real tokens, zero-weight fillers included: what its forwards pay for
        fill = real[filler_at]
        new["winnow_rank_tokens"] = torch.stack([
            real[torch.tensor(share, dtype=torch.long, device=real.device)].sum() + (size - len(share)) * fill
            for share in shares])
    return new


# -- the re-deal: kept rows moved to their optimizer steps (trainer/algorithms/deal_plan.py) ----------

def redeal(
    micro_batches: list[dict[str, Any]],
    plan: DealPlan,
    rank: int,
    *,
    row_normalised: bool,
    token_normalised: bool,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor],
) -> list[dict[str, Any]]:
    """This process's micro-batches with its kept rows moved where ``plan`` puts them (collective in
    proportional mode with a token-normalised loss: every process must call it).

    ``micro_batches`` is TRL's split of the local generation batch, carrying :data:`KEPT_KEY`; the key is
    removed from the result."""
    local = _concat(micro_batches)
    kept_flags = local.pop(KEPT_KEY) if local is not None else None
    if local is None or kept_flags is None:
        for batch in micro_batches:
            batch.pop(KEPT_KEY, None)
        return micro_batches
    S, c = plan.micro_batches, plan.micro_rows
    kept = kept_flags.bool().nonzero().squeeze(1).tolist()
    rest = (~kept_flags.bool()).nonzero().squeeze(1).tolist()
    if len(kept) != plan.counts[rank] or kept_flags.numel() != S * c:
        raise RuntimeError(f"deal plan expects {plan.counts[rank]} kept of {S * c} rows, batch has {len(kept)} of "
                           f"{kept_flags.numel()}")
    buckets: list[list[int]] = [[] for _ in range(S)]
    for row, micro in zip(kept, plan.placement(rank)):
        buckets[micro].append(row)
    for bucket in buckets:  # fill with removed / zero-weight rows, in TRL's shuffled order
        need = c - len(bucket)
        bucket.extend(rest[:need])
        rest = rest[need:]
    order = torch.tensor([row for bucket in buckets for row in bucket], device=kept_flags.device)
    out = [{k: (v[order[i * c:(i + 1) * c]] if torch.is_tensor(v) and v.dim() else v) for k, v in local.items()}
           for i in range(S)]

    per_micro = plan.kept_per_micro_batch()
    windows = [plan.window(i) for i in range(S)]
    kept_in_window = [0] * (max(windows) + 1)
    for i, n in enumerate(per_micro):
        kept_in_window[windows[i]] += n
    if plan.mode == VERL_MINIBATCH and row_normalised:
        # TRL weighs a row 1/(c*A*world); verl's fixed accumulation count weighs every row 1/M, M = b*A*world
        for batch in out:
            batch[ROW_SCALE_KEY] = torch.tensor(c / plan.recipe_micro_rows, device=kept_flags.device)
    if plan.mode == PROPORTIONAL:
        world, A = len(plan.counts), plan.accumulation
        if row_normalised:  # TRL weighs a row 1/(c*A*world); the step's own mean weighs it 1/kept_in_window
            for i, batch in enumerate(out):
                batch[ROW_SCALE_KEY] = torch.tensor(c * A * world / max(kept_in_window[windows[i]], 1),
                                                           device=kept_flags.device)
        if token_normalised:  # TRL's normaliser per step is num_items * A / S: make it the step's own tokens
            local_tokens = torch.zeros(len(kept_in_window), dtype=torch.float64, device=kept_flags.device)
            for i, batch in enumerate(out):
                local_tokens[windows[i]] += float(loss_tokens(batch))
            tokens = reduce_sum(local_tokens)
            for i, batch in enumerate(out):
                batch["num_items_in_batch"] = (tokens[windows[i]] * S / A).to(torch.float32)
    for i, batch in enumerate(out):
        batch.pop(ALL_DROPPED_KEY, None)
        if plan.aligned and kept_in_window[windows[i]] == 0:  # the whole step is empty on every process
            batch[ALL_DROPPED_KEY] = torch.tensor(1, device=kept_flags.device)
    return out


def loss_tokens(batch: dict[str, Any]) -> torch.Tensor:
    """This process's loss tokens of a (micro-)batch: TRL's completion mask times its loss-only tool mask."""
    mask = batch["completion_mask"]
    return (mask * batch["tool_mask"]).sum() if batch.get("tool_mask") is not None else mask.sum()


def _concat(micro_batches: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Undo TRL's split (keeping its shuffled row order), or None for batches that do not split by row."""
    first = micro_batches[0]
    rows = first[KEPT_KEY].shape[0] if KEPT_KEY in first else None
    local: dict[str, Any] = {}
    for key, value in first.items():
        if value is None or (torch.is_tensor(value) and value.dim() == 0):
            local[key] = value
        elif torch.is_tensor(value) and value.shape[0] == rows:
            local[key] = torch.cat([batch[key] for batch in micro_batches])
        else:  # images and other per-sample lists: keep TRL's split
            if key not in _warned_redeal:
                _warned_redeal.add(key)
                logger.warning("optimizer-step dealing off for batches with %r; TRL's random split is kept", key)
            return None
    return local
