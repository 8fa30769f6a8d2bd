"""What a step logs about its own work: where its time went (:class:`PhaseTimer`), and the metrics and completions
table of the batch that was trained.

Per-phase wall time is logged once per optimizer step as ``timing_s/<phase>`` (verl's ``timing_s/*``), so a
generation-bound run can be told from a trainer-bound one.

Phases are disjoint wall-clock seconds of this process: ``generation`` (TRL's generation and scoring of a batch,
``_generate_and_score_completions``, less the phases timed inside it: so the generation request, or the wait for an
overlapped one, with TRL's tokenising, decoding and padding around it), ``weight_sync`` (vLLM server weight push),
``reward`` (reward functions), ``old_logps`` / ``ref_logps`` (the no-grad log-prob passes), ``teacher_scoring``,
``collapse_check``, ``stage_pipeline`` (filter -> dropout -> advantage and the batch re-deal), ``loss_fwd_bwd`` (the
micro-steps' forward + backward, everything of ``training_step`` outside the generation phase) and ``optimizer``
(``optimizer.step``). A phase that did not run in a step is not logged for it (generation runs once per generation
batch). Only transformers' callback hooks and the trainer's own methods are used; no CUDA synchronisation is added
(on GPU a phase's time is where the host waited, as in verl's timers).

TRL logs ``reward``, ``reward_std``, ``frac_reward_zero_std``, ``rewards/<name>/*`` and ``completions/*`` once per
call of its generation-and-scoring step, and fills the completions table (``_logs``) with that call's rows and its
own GRPO advantages. With DAPO dynamic sampling that step runs once per generation *round*, so the logged means
average rounds whose groups were discarded, and the table shows the last round. Here the per-round values move to
``dynamic_sampling/all_rounds/<name>`` (what was generated) and the original names get the values of the trained
batch (the mixed groups kept; dropped top-up groups excluded), computed with TRL's own formulas; the table's rows
are the trained batch's, and its advantages are the stage pipeline's (what the loss uses), not TRL's.
"""

from __future__ import annotations

import time
import zlib
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from transformers import TrainerCallback
from trl.trainer.utils import nanstd

from trainer import trl_contact
from trainer.algorithms.grpo import grpo_advantages, normalize_then_sum_advantages, total_reward

PREFIX = "timing_s/"
PROMPT_DIGEST = "data/prompt_digest"


def prompt_digest(output: dict[str, Any], accelerator: Any) -> float:
    """CRC-32 of the generation batch's prompts over every process, row by row in order (collective: one gather of
    a number per row, so 1 and N processes holding the same global batch log the same value). Two runs that log the
    same value at every step trained on the same prompts in the same order: the pairing check of ``winnow-compare``
    (trainer/compare/report.py). Exact as a float (< 2**32)."""
    ids, mask = output["prompt_ids"].cpu(), output["prompt_mask"].cpu().bool()
    rows = [zlib.crc32(row[m].to(torch.int64).numpy().tobytes()) for row, m in zip(ids, mask)]
    every = accelerator.gather(torch.tensor(rows, dtype=torch.int64, device=output["prompt_ids"].device))
    return float(zlib.crc32(every.cpu().numpy().tobytes()))


class PhaseTimer:
    """Seconds per phase, accumulated over one optimizer step and then flushed into the trainer's metrics."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._optimizer_start: float | None = None
        self.prepare_seconds = 0.0  # running total inside _prepare_inputs (subtracted from loss_fwd_bwd)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    @contextmanager
    def phase_less_inner(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block, less the phases timed inside it, to ``name``."""
        start, inner = time.perf_counter(), sum(self.seconds.values())
        try:
            yield
        finally:
            spent = time.perf_counter() - start - (sum(self.seconds.values()) - inner)
            self.seconds[name] += spent

    def optimizer_started(self) -> None:
        """Mark the start of ``optimizer.step`` (transformers' pre-optimizer hook)."""
        self._optimizer_start = time.perf_counter()

    def optimizer_done(self) -> None:
        """Add the seconds since :meth:`optimizer_started` to ``optimizer`` (nothing if it was not called)."""
        if self._optimizer_start is not None:
            self.seconds["optimizer"] += time.perf_counter() - self._optimizer_start
            self._optimizer_start = None

    def flush(self, metrics: dict[str, list]) -> None:
        """Append this step's totals (``timing_s/*``) and start the next step."""
        for name, seconds in self.seconds.items():
            metrics[PREFIX + name].append(seconds)
        self.seconds.clear()


class PhaseTimingCallback(TrainerCallback):
    """Times ``optimizer.step`` (between transformers' pre/post optimizer hooks) and flushes each step's phases
    before the step is logged."""

    def __init__(self, timer: PhaseTimer, trainer: Any):
        self.timer, self.trainer = timer, trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.timer.optimizer_started()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.timer.optimizer_done()

    def on_step_end(self, args, state, control, **kwargs):
        self.timer.flush(trl_contact.metrics(self.trainer))


# -- the trained batch's metrics and table ----------------------------------------------------------------------------

ROUND_PREFIXES = ("completions/", "rewards/")
ROUND_KEYS = frozenset({"reward", "reward_std", "frac_reward_zero_std"})
ALL_ROUNDS = "dynamic_sampling/all_rounds/"
TABLE_COLUMNS = ("prompt", "completion")


def is_round_metric(name: str) -> bool:
    """Whether TRL appends ``name`` once per generation-and-scoring call (so once per dynamic-sampling round)."""
    return name in ROUND_KEYS or name.startswith(ROUND_PREFIXES)


def metric_marks(metrics: dict[str, list[float]]) -> dict[str, int]:
    """Length of every per-round metric list now: the values appended later belong to this generation batch."""
    return {k: len(v) for k, v in metrics.items() if is_round_metric(k)}


def table_snapshot(logs: dict[str, Any], n: int) -> dict[str, Any]:
    """The last ``n`` rows of TRL's completions table (one generation round's rows)."""
    snap = {k: list(logs[k])[-n:] for k in TABLE_COLUMNS}
    snap["rewards"] = {k: list(v)[-n:] for k, v in logs["rewards"].items()}
    snap["extra"] = {k: list(v)[-n:] for k, v in logs["extra"].items()}
    return snap


def relog_rounds(trainer: Any, marks: dict[str, int], kept: torch.Tensor, completion_ids: torch.Tensor,
                 completion_mask: torch.Tensor, tool_mask: torch.Tensor | None) -> None:
    """Move the per-round values appended since ``marks`` to ``dynamic_sampling/all_rounds/*`` and log the trained
    batch's under TRL's names. ``kept`` (N,) bool: the trained rows (whole groups) of the merged global batch, whose
    rewards are ``trainer.global_rewards_per_func``; ``completion_ids`` / ``completion_mask`` / ``tool_mask``: its
    gathered (right-padded) tensors."""
    metrics = trl_contact.metrics(trainer)
    for name in [k for k in metrics if is_round_metric(k)]:
        new = metrics[name][marks.get(name, 0):]
        del metrics[name][marks.get(name, 0):]
        metrics[ALL_ROUNDS + name].extend(new)
    if not bool(kept.any()):
        return  # nothing trained: no statistic over no row
    for name, value in trained_values(trainer, kept, completion_ids, completion_mask, tool_mask).items():
        metrics[name].append(value)


def trained_values(trainer: Any, kept: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                   tool_mask: torch.Tensor | None) -> dict[str, float]:
    """TRL's per-round metrics (trl/trainer/grpo_trainer.py ``_generate_and_score_completions``) over the kept rows."""
    args, G = trainer.args, trainer.num_generations
    R_k = trainer.global_rewards_per_func[kept]
    weights = trainer.reward_weights.to(R_k.device)
    R = total_reward(R_k, weights)
    if trainer.multi_objective_aggregation == "normalize_then_sum":
        _, sigma = normalize_then_sum_advantages(R_k, weights, G)
    else:
        _, sigma = grpo_advantages(R, G, scale_rewards=args.scale_rewards)
    out = {}
    for i, name in enumerate(trainer.reward_func_names):
        out[f"rewards/{name}/mean"] = torch.nanmean(R_k[:, i]).item()
        out[f"rewards/{name}/std"] = nanstd(R_k[:, i]).item()
    out["reward"] = torch.nanmean(R).item()
    out["reward_std"] = nanstd(R).item()
    out["frac_reward_zero_std"] = torch.isclose(sigma, torch.zeros_like(sigma)).float().mean().item()
    out.update(completion_values(trainer, completion_ids[kept], completion_mask[kept],
                                 None if tool_mask is None else tool_mask[kept]))
    return out


def completion_values(
    trainer: Any, ids: torch.Tensor, cm: torch.Tensor, tool_mask: torch.Tensor | None
) -> dict[str, float]:
    """``completions/*`` over rows of a right-padded batch (ids, completion mask, tool/env mask or None).

    TRL measures the token lists before padding; here a row's list is its completion-mask span (TRL's mask is 1
    exactly there), and a row whose mask ``mask_truncated_completions`` zeroed is truncated, with its non-pad tokens
    as its length. Lengths count model tokens only when a tool/env mask exists, as TRL does."""
    pad = trl_contact.pad_token_id(trainer)
    span = cm.sum(dim=1).long()
    eos_and_pad = torch.tensor([*trainer.eos_token_ids, pad], device=ids.device)
    last = ids.gather(1, (span - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    truncated = (span == 0) | ~torch.isin(last, eos_and_pad)
    listed = torch.where(span > 0, span, (ids != pad).sum(1))  # the row's token list (TRL pads tool masks with 1)
    in_list = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < listed.unsqueeze(1)
    # A masked truncated row's tool mask was zeroed too; its length then counts every listed token.
    model_tokens = None if tool_mask is None else (tool_mask.bool() & in_list).sum(1)
    lengths = listed if model_tokens is None else torch.where(span > 0, model_tokens, listed)
    lengths = lengths.float()
    term = lengths[~truncated] if bool((~truncated).any()) else torch.zeros(1, device=lengths.device)
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.float().mean().item(),
        "completions/mean_terminated_length": term.mean().item(),
        "completions/min_terminated_length": term.min().item(),
        "completions/max_terminated_length": term.max().item(),
    }


def rebuild_table(logs: dict[str, Any], snapshots: list[dict[str, Any]], sources: torch.Tensor) -> None:
    """Refill the completions table with the trained batch's rows: ``sources[i]`` = round * n + row of each row of
    the merged batch, ``snapshots[round]`` that round's rows (:func:`table_snapshot`)."""
    n = len(snapshots[0]["prompt"])
    picks = [(int(s) // n, int(s) % n) for s in sources.tolist()]
    for key in TABLE_COLUMNS:
        logs[key].clear()
        logs[key].extend(snapshots[r][key][i] for r, i in picks)
    for group in ("rewards", "extra"):
        for name, column in logs[group].items():
            if all(name in snap[group] and len(snap[group][name]) == n for snap in snapshots):
                column.clear()
                column.extend(snapshots[r][group][name][i] for r, i in picks)


def table_advantages(logs: dict[str, Any], advantages: torch.Tensor, mask: torch.Tensor) -> None:
    """The table's advantage column := the pipeline's per-rollout advantages (a per-token advantage is shown as its
    mean over the rollout's loss tokens), global row order."""
    if advantages.dim() == 2:
        m = mask.to(advantages.dtype)
        advantages = (advantages * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
    values = advantages.tolist()
    column = logs["advantages"]
    for _ in range(min(len(values), len(column))):
        column.pop()
    column.extend(values)
