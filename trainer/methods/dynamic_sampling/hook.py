"""DAPO dynamic sampling (Yu et al. 2025 §3.2) on TRL's generation batch.

TRL generates exactly one batch of P prompt groups per ``steps_per_generation`` micro-steps. With
``dynamic_sampling`` on, the trainer keeps the groups whose metric varies (``algorithms.dapo.mixed_groups``)
and, while fewer than P are kept, generates another batch of the same size from a *refill stream* -- a second
pass over the training set with its own seeded ``RepeatSampler`` (so refills never repeat the main stream's
upcoming prompts in lockstep) -- up to ``max_num_gen_batches`` batches in all. The first P mixed groups (in
generation order) become the training batch, dealt over processes exactly as TRL deals a batch, so every
stage downstream sees an ordinary batch of whole groups.

When the bound is hit, ``dynamic_sampling_on_limit`` decides: ``error`` stops (verl's DAPO recipe raises), or
``partial`` trains on the mixed groups found: the batch is topped up with whole groups from the last round that
are marked dropped (the stage pipeline's keep mask starts False for them), so they leave the loss and its
normaliser (compaction removes them); a step with no mixed group at all is skipped like any empty step.

Every rank takes the same decisions (they depend on the gathered rewards only) and calls the same collectives
in the same order. The number of refill batches drawn is part of the checkpoint (``state_dict``), so a resumed
run continues the refill stream where it stopped.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from trl.trainer.utils import RepeatSampler

from trainer import trl_contact
from trainer.algorithms.dapo import mixed_groups
from trainer.algorithms.grpo import total_reward
from trainer.config.errors import ConfigError
from trainer.methods.dynamic_sampling.ahead import FillAhead
from trainer.pipeline import step_logs
from trainer.pipeline.batch import LEFT_PADDED, gather_key, pad_value, row_keys, trim_padding
from trainer.pipeline.stages import register_config_check, register_hook

logger = logging.getLogger(__name__)
REFILL_SEED_OFFSET = 7919  # the refill stream's sampler seed = seed + this (distinct from the main stream's)


class DynamicSampler:
    """Fills a generation batch with mixed groups by generating more batches; see the module docstring."""

    def __init__(self, trainer: Any):
        args = trainer.args
        if args.dynamic_sampling_metric != "reward" and args.dynamic_sampling_metric not in trainer.reward_func_names:
            raise ConfigError(
                "dynamic_sampling_metric",
                f"{args.dynamic_sampling_metric!r} is not one of this run's reward functions "
                f"{trainer.reward_func_names}",
                "use 'reward' (the total) or one of those names",
            )
        if isinstance(trainer.train_dataset, torch.utils.data.IterableDataset):
            raise ValueError(
                "dynamic_sampling needs a map-style train_dataset (refills index it); got an iterable one"
            )
        self.trainer = trainer
        self.refills_drawn = 0  # refill batches consumed so far (checkpointed)
        self._iterator = None
        # Of the last fill: (N,) round * N + row of each row of the trained batch (which generated row it is), or
        # None when the first batch was used as it came (the trainer's completions table follows it).
        self.last_sources: torch.Tensor | None = None

    # --- refill stream ------------------------------------------------------------------------------

    def _dataloader(self):
        return trl_contact.training_dataloader(self.trainer, "Dynamic sampling refill", refill_sampler(self.trainer))

    def _next_refill(self) -> list[dict[str, Any]]:
        # Each new DataLoader iterator draws its base seed from the global torch RNG. Forked here, the refill stream
        # never moves the RNG that sampling uses, so a resumed run (which re-creates the stream at another moment
        # and skips through it) samples exactly what the uninterrupted run sampled.
        with torch.random.fork_rng(devices=[]):
            if self._iterator is None:
                self._iterator = self._stream()
                for _ in range(self.refills_drawn):  # resume: skip what the interrupted run consumed
                    next(self._iterator)
            batch = next(self._iterator)
        self.refills_drawn += 1
        return batch

    def _stream(self):
        loader = self._dataloader()
        while True:  # epochs: the sampler's generator advances, so each pass is a new permutation
            yield from loader

    def state_dict(self) -> dict[str, int]:
        return {"refills_drawn": self.refills_drawn}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.refills_drawn = int(state["refills_drawn"])
        self._iterator = None

    # --- the trainer's hook point (trainer/pipeline/stages.py) ------------------------------------------

    def after_generation(self, trainer: Any, output: dict[str, Any], marks: dict[str, int]):
        """:meth:`fill`, then TRL's per-round metrics and completions table made to describe the trained batch
        (trainer/pipeline/step_logs.py). Returns (this rank's batch, initial global keep or None)."""
        R_k = trainer.global_rewards_per_func
        N = R_k.shape[0]
        snapshots = [step_logs.table_snapshot(trl_contact.completion_logs(trainer), N)]

        def generate(refill):
            out = trainer.generate_and_score(refill)
            snapshots.append(step_logs.table_snapshot(trl_contact.completion_logs(trainer), N))
            return out

        output, keep, metrics = self.fill(output, generate)
        for name, value in metrics.items():
            trl_contact.metrics(trainer)[f"dynamic_sampling/{name}"].append(value)
        if self.last_sources is not None:  # the batch was assembled: relog it, rebuild the table
            rows = trainer.gathered(output)  # the assembled batch, as the stages and compaction read it next
            kept = torch.ones(N, dtype=torch.bool, device=R_k.device) if keep is None else keep
            step_logs.relog_rounds(
                trainer, marks, kept, rows["completion_ids"], rows["completion_mask"],
                rows["tool_mask"] if "tool_mask" in rows else None)
            step_logs.rebuild_table(trl_contact.completion_logs(trainer), snapshots, self.last_sources)
        return output, keep

    # --- filling --------------------------------------------------------------------------------------

    def _metric(self, R_k: torch.Tensor) -> torch.Tensor:
        return sampling_metric(self.trainer, R_k)

    def ahead(self) -> FillAhead:
        """The main process's side of this sampler for overlapped generation (``max_staleness`` > 0): the refill
        rounds of a batch generated on its arrival, from the batch's own weights (ahead.py)."""
        return FillAhead(self.trainer, self._dataloader().dataset, refill_sampler(self.trainer), self._metric)

    def fill(self, output: dict[str, Any], generate) -> tuple[dict[str, Any], torch.Tensor | None, dict[str, float]]:
        """Return (this rank's batch, initial global keep mask or None when nothing is dropped, metrics).

        ``output`` is TRL's first generation batch (its gathered rewards in ``trainer.global_rewards_per_func``);
        ``generate(inputs)`` runs TRL's generation and scoring for refill prompts (collective)."""
        t, args = self.trainer, self.trainer.args
        G = t.num_generations
        R_k = t.global_rewards_per_func
        N = R_k.shape[0]
        P = N // G
        mixed = mixed_groups(self._metric(R_k), G)
        metrics = {"first_batch_mixed_ratio": float(mixed.float().mean())}
        self.last_sources = None
        if bool(mixed.all()):
            metrics.update(gen_batches=1.0, mixed_groups=float(P), limit_hit=0.0)
            return output, None, metrics
        keys = row_keys(output)
        if keys is None:
            raise ValueError("dynamic_sampling cannot re-deal this batch (multimodal inputs); turn it off")
        parts: list[dict[str, torch.Tensor]] = []  # gathered rows of the kept groups, per round
        found, rounds, generated = 0, 1, P
        while True:
            take = mixed.nonzero().squeeze(1)[: P - found]
            rows = (take.unsqueeze(1) * G + torch.arange(G, device=take.device)).flatten()
            glob = self._gather(output, keys, R_k)
            glob["__source__"] = torch.arange(N, device=R_k.device) + (rounds - 1) * N
            parts.append({k: v[rows] for k, v in glob.items()})
            found += int(take.numel())
            if found == P or rounds >= args.max_num_gen_batches:
                break
            output = generate(self._next_refill())
            R_k = t.global_rewards_per_func
            mixed = mixed_groups(self._metric(R_k), G)
            rounds += 1
            generated += P
        limit_hit = found < P
        if limit_hit and args.dynamic_sampling_on_limit == "error":
            raise RuntimeError(
                f"dynamic_sampling: only {found} of {P} prompt groups had a varying {args.dynamic_sampling_metric!r} "
                f"after max_num_gen_batches={args.max_num_gen_batches} generation batches ({generated} groups). Raise "
                "max_num_gen_batches, check the reward (all-correct or all-wrong data?), or set "
                "dynamic_sampling_on_limit: partial"
            )
        if limit_hit:
            logger.warning(
                "dynamic_sampling: %d of %d groups mixed after %d generation batches; training on those (the rest are "
                "out of the loss)",
                found,
                P,
                rounds,
            )
            # Top up with whole groups of the last round (any content: they are marked dropped).
            parts.append({k: v[: (P - found) * G] for k, v in glob.items()})
        keep = torch.zeros(N, dtype=torch.bool, device=R_k.device)
        keep[: found * G] = True
        merged = _concat_rows(parts, trl_contact.pad_token_id(t))
        t.global_rewards_per_func = merged.pop("__rewards__")
        self.last_sources = merged.pop("__source__")
        local = self._deal(merged, output)
        metrics.update(
            gen_batches=float(rounds),
            mixed_groups=float(found),
            limit_hit=float(limit_hit),
            generated_groups=float(generated),
        )
        return local, (None if found == P else keep), metrics

    def _gather(self, output: dict[str, Any], keys: list[str], R_k: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every row tensor of this round from all processes (collective), plus the gathered rewards."""
        acc, pad_id = self.trainer.accelerator, trl_contact.pad_token_id(self.trainer)
        glob = {k: gather_key(acc, k, output[k], pad_id) for k in keys}
        glob["__rewards__"] = R_k
        return glob

    def _deal(self, merged: dict[str, torch.Tensor], last_output: dict[str, Any]) -> dict[str, Any]:
        """This rank's slice of the merged global batch (TRL's layout: rank r holds rows [r*B, (r+1)*B)), with
        padding trimmed and the generation-batch token count recomputed."""
        acc = self.trainer.accelerator
        N = merged["completion_ids"].shape[0]
        B = N // acc.num_processes
        rows = slice(acc.process_index * B, (acc.process_index + 1) * B)
        local = {k: v[rows] for k, v in merged.items()}
        trim_padding(local)
        mask = merged["completion_mask"] * merged["tool_mask"] if "tool_mask" in merged else merged["completion_mask"]
        local["num_items_in_batch"] = mask.sum()
        for k, v in last_output.items():  # 0-dim extras TRL put in the batch
            if k not in local and torch.is_tensor(v) and v.dim() == 0:
                local[k] = v
        return local


def refill_sampler(trainer: Any):
    """The refill stream's sampler factory: TRL's ``RepeatSampler`` over whole generation batches, seeded apart from
    the main stream (``seed + REFILL_SEED_OFFSET``)."""
    return lambda dataset: RepeatSampler(
        data_source=dataset,
        mini_repeat_count=trainer.num_generations,
        batch_size=trainer.args.generation_batch_size // trainer.num_generations,
        repeat_count=1,
        shuffle=True,
        seed=trainer.args.seed + REFILL_SEED_OFFSET,
    )


def sampling_metric(trainer: Any, R_k: torch.Tensor) -> torch.Tensor:
    """The value whose spread within a group makes it mixed: the weighted total reward, or one reward function's
    (``dynamic_sampling_metric``), from the rewards per function ``R_k`` (N, K)."""
    name = trainer.args.dynamic_sampling_metric
    if name == "reward":
        return total_reward(R_k, trainer.reward_weights.to(R_k.device))
    return R_k[:, trainer.reward_func_names.index(name)]


def _concat_rows(parts: list[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Concatenate per-round gathered rows, padding per-token tensors to a common width as TRL pads each key
    (compaction.TRL_PAD; prompts on the left)."""
    out = {}
    for key in parts[0]:
        tensors = [p[key] for p in parts]
        if tensors[0].dim() >= 2 and key != "__rewards__":
            width = max(t.shape[1] for t in tensors)
            pad = pad_value(key, pad_token_id)
            tensors = [_pad(t, width, pad, left=key in LEFT_PADDED) for t in tensors]
        out[key] = torch.cat(tensors, dim=0)
    return out


def _pad(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra == 0:
        return t
    filler = torch.full((t.shape[0], extra, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
    return torch.cat([filler, t] if left else [t, filler], dim=1)


@register_hook("dynamic_sampling", enabled=lambda args: args.dynamic_sampling, points=("after_generation",))
def build_dynamic_sampler(trainer: Any) -> DynamicSampler:
    """DAPO's dynamic sampling for ``trainer`` (its refill stream and checkpointed count)."""
    return DynamicSampler(trainer)


@register_config_check
def check_dynamic_sampling_fields(args: Any) -> None:
    """At least one generation batch per training batch; groups of two or more rollouts to compare."""
    if args.max_num_gen_batches < 1:
        raise ConfigError(
            "max_num_gen_batches", f"must be >= 1 (got {args.max_num_gen_batches})", "use e.g. 10; 1 = no refill"
        )
    if args.dynamic_sampling and args.num_generations is not None and args.num_generations < 2:
        raise ConfigError("num_generations", "dynamic_sampling compares rollouts within a group", "set >= 2")
