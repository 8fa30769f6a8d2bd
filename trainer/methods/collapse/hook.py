"""RAGEN-2's template-collapse detector (paper §3.2, §3.5): is the reasoning still input-dependent?

Every ``collapse_every`` steps (and at step 1) the trainer hands the *unfiltered* global batch to
:class:`CollapseDetector`. It extracts (X, Z) pairs -- X = the context up to and including the opening think
tag, Z = the exact sampled reasoning tokens up to the closing tag -- samples up to ``collapse_num_samples``
traces (seeded, identical on every rank), scores each Z under every distinct X among the sampled traces with the
current policy (teacher-forced, no grad, at the sampling temperature, through TRL's own log-prob helper so PEFT,
ZeRO-3 and the fused LM head behave as in the loss), and logs the MI family of :func:`mi_metrics` on the
per-token mean (``collapse/*``) and summed (``collapse/*_seq``) log-prob matrices.

Cost of one check = (#distinct contexts) x (#sampled traces) teacher-forced sequences, bounded by
``collapse_max_tokens`` real tokens per sample; the pairs are split evenly over processes (every rank runs the same
number of forward passes, which ZeRO-3 needs) and scored ``collapse_micro_batch_size`` at a time -- or, with
``micro_batch_tokens``, in the token-budget chunks of the loss passes (trainer/pipeline/token_budget.py), the chunk
count all-reduced to the maximum over ranks.

Differences from the released code, on purpose: Z is the sampled token ids, not re-tokenised text (ragen.md
§7.3); the think tags are located as tokens. X uses the canonical context ``prompt + <think>`` as in the
reference, whatever the model emitted before its opening tag. When a batch has no think span at all
(non-thinking mode, models without think tokens) Z is the model's first turn -- for single-turn tasks the
whole completion -- and ``collapse/z_is_whole_completion`` = 1 says so.

Multi-turn episodes (trainer/rollout/multi_turn.py; the model's turns are the runs of ``tool_mask`` = 1): with
``collapse_turns: first`` each episode's first turn is a trace (X = the level's prompt) and the metrics are
``collapse/*``. With ``all`` every check computes both samples RAGEN computes (mll-lab-nu/RAGEN@20daedc
ragen/trainer/collapse_metrics.py:142-219; both on in config/base.yaml:151-153): the first-turn metrics as above
and, under ``collapse/trajectory/*``, the trajectory-uniform sample -- every model turn is a trace whose context is
everything before it (system, observations, earlier turns, the environment's replies), ``collapse_num_samples``
(episode, turn) pairs are drawn with replacement and each draw is its own column. Each sample has its own EMA
of the marginal std, as upstream keys it by sample (collapse_metrics.py:315-317).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from trainer import trl_contact
from trainer.algorithms.collapse_metrics import mi_metrics, signature_retrieval
from trainer.config.errors import ConfigError
from trainer.methods.collapse.reasoning_span import THINK_OPEN, reasoning_token_span
from trainer.pipeline.stages import register_config_check, register_hook
from trainer.pipeline.token_budget import equal_forward_fillers, plan_chunks, shortest_row

logger = logging.getLogger(__name__)

__all__ = ["BatchTraces", "CollapseDetector", "Trace", "first_turn_traces", "mi_metrics"]

ZSCORE_EPS = 1e-3  # RAGEN's std_eps (collapse_metrics.py:41), mi_metrics' default
_SEQ_KEYS = ("mi_estimate", "conditional_entropy", "reasoning_entropy", "marginal_std", "mi_zscore")
TRAJECTORY = "trajectory/"  # metric prefix of the multi-turn sample (upstream: collapse_trajectory_sample/)


@dataclass(frozen=True)
class Trace:
    """One reasoning trace: X (the exact context before the reasoning) and Z (the sampled reasoning ids)."""

    context: tuple[int, ...]
    reasoning: tuple[int, ...]
    episode: int = -1  # the rollout row the trace came from (multi-turn sampling is uniform over episodes)


@dataclass(frozen=True)
class BatchTraces:
    """What one check needs from the gathered batch: first-turn traces and contexts, and with
    ``collapse_turns: all`` every turn's trace plus the number of episodes M (draws pick an episode in [0, M))."""

    traces: list[Trace | None]
    contexts: list[tuple[int, ...]]
    whole_completion: bool
    turns: list[Trace | None] | None = None
    episodes: int = 0


def first_turn_traces(
    prompts: list[list[int]],
    completions: list[list[int]],
    think_open: int | None,
    think_close: int | None,
    tokenizer: Any = None,
) -> tuple[list[Trace | None], list[tuple[int, ...]], bool]:
    """First-turn (X, Z) of every rollout (None where the rollout has no complete, non-empty think span).

    ``completions`` hold only the model's first turn (see :meth:`CollapseDetector.batch_traces`). Returns
    the traces, every rollout's context X (the columns come from these, valid trace or not) and whether Z
    is the whole completion (no think span anywhere in the batch)."""
    if (think_open is None or think_close is None) and tokenizer is not None:
        return _text_traces(prompts, completions, tokenizer)
    prefilled = [bool(p) and p[-1] == think_open for p in prompts]
    thinking = think_open is not None and think_close is not None
    thinking = thinking and (any(think_open in c for c in completions) or any(prefilled))
    if not thinking:
        traces = [Trace(tuple(p), tuple(c)) if c else None for p, c in zip(prompts, completions)]
        return traces, [tuple(p) for p in prompts], True
    contexts = [tuple(p) if pre else (*p, think_open) for p, pre in zip(prompts, prefilled)]
    out: list[Trace | None] = []
    for completion, context, pre in zip(completions, contexts, prefilled):
        if think_open in completion:
            start = completion.index(think_open) + 1
        elif pre:  # the template pre-fills the opening tag
            start = 0
        else:
            out.append(None)
            continue
        if think_close not in completion[start:]:
            out.append(None)  # truncated before the closing tag: no complete reasoning
            continue
        end = completion.index(think_close, start)
        out.append(Trace(context, tuple(completion[start:end])) if end > start else None)
    return out, contexts, False


def _text_traces(prompts: list[list[int]], completions: list[list[int]], tokenizer: Any):
    """:func:`first_turn_traces` for tokenizers whose think tags are several tokens: Z located in the text and
    mapped back to the sampled ids (methods/reasoning_span.py); X = the context, which ends with the ``<think>``
    prefill's ids when the think prefill is on, else the context + ``<think>``'s ids (RAGEN's canonical X)."""
    opening = tuple(tokenizer.encode(THINK_OPEN, add_special_tokens=False))
    prefilled_any = any(tuple(p[-len(opening):]) == opening for p in prompts)
    if not prefilled_any and not any(
        THINK_OPEN in tokenizer.decode(c, skip_special_tokens=False) for c in completions
    ):
        # no reasoning anywhere (a model that does not think): the whole first turn, flagged, as the token path does
        traces = [Trace(tuple(p), tuple(c)) if c else None for p, c in zip(prompts, completions)]
        return traces, [tuple(p) for p in prompts], True
    traces: list[Trace | None] = []
    contexts: list[tuple[int, ...]] = []
    for prompt, completion in zip(prompts, completions):
        prefilled = tuple(prompt[-len(opening):]) == opening
        context = tuple(prompt) if prefilled else (*prompt, *opening)
        contexts.append(context)
        span = reasoning_token_span(tokenizer, completion, prefilled) if completion else None
        traces.append(None if span is None else Trace(context, tuple(completion[span[0]:span[1]])))
    return traces, contexts, False


class CollapseDetector:
    """Runs the MI check on the trainer's batches on schedule; holds the EMA state of the z-scores."""

    def __init__(self, args: Any, tokenizer: Any):
        self.every = args.collapse_every
        self.num_samples = args.collapse_num_samples
        self.max_tokens = args.collapse_max_tokens
        self.micro_batch_size = args.collapse_micro_batch_size
        self.token_budget = getattr(args, "micro_batch_tokens", None)
        self._tokens = [0, 0]  # padded, real tokens the current check's forwards ran
        self.seed = args.seed
        self.all_turns = getattr(args, "collapse_turns", "first") == "all"
        self.pad_id = tokenizer.pad_token_id
        self.tokenizer = tokenizer
        self.think_open = _single_token_id(tokenizer, "<think>")
        self.think_close = _single_token_id(tokenizer, "</think>")
        self._next_due: int | None = None
        self._ema: dict[str, float] = {}
        self._warned_budget = False

    def state_dict(self) -> dict[str, Any]:
        """Schedule position and EMA values, for checkpoints."""
        return {"next_due": self._next_due, "ema": dict(self._ema)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` on resume."""
        self._next_due = state["next_due"]
        # checkpoints from before the trajectory sample hold the first-turn EMA without its sample prefix
        self._ema = {(k if "/" in k else f"first/{k}"): float(v) for k, v in state["ema"].items()}

    def before_pipeline(self, trainer: Any, output: dict[str, Any], step: int) -> None:
        """The trainer's hook point (trainer/pipeline/stages.py): on schedule, score the unfiltered batch, before any
        stage removes rollouts (RAGEN's order), and log ``collapse/*``."""
        if not self.due(step):
            return
        with trainer.phase("collapse_check"):
            traces = self.batch_traces(trainer, output)
            for name, value in self.check(trainer, traces, step).items():
                trl_contact.metrics(trainer)[f"collapse/{name}"].append(value)

    def due(self, step: int) -> bool:
        """Whether a generation for optimizer step ``step`` (1-based) is checked: step 1, then the first
        generation at or after each multiple of ``every`` (generations can span several steps)."""
        if self._next_due is None:  # fresh start or resume
            self._next_due = 1 if step <= 1 else math.ceil(step / self.every) * self.every
        if step < self._next_due:
            return False
        self._next_due = (step // self.every + 1) * self.every
        return True

    def batch_traces(self, trainer: Any, output: dict[str, Any]) -> BatchTraces:
        """Gather TRL's batch from every process and extract each rollout's first-turn trace and, with
        ``collapse_turns: all``, every turn's trace (collective)."""
        rows = trainer.gathered(output)  # the rows the stages read next, gathered once (masks select the tokens)
        prompt_ids, prompt_mask = rows["prompt_ids"].tolist(), rows["prompt_mask"].tolist()
        completion_ids, completion_mask = rows["completion_ids"].tolist(), rows.loss_mask().long().tolist()
        prompts = [[t for t, m in zip(ids, mask) if m] for ids, mask in zip(prompt_ids, prompt_mask)]
        completions = [_first_run(ids, mask) for ids, mask in zip(completion_ids, completion_mask)]
        traces, contexts, whole = first_turn_traces(prompts, completions, self.think_open, self.think_close,
                                                    self.tokenizer)
        if not self.all_turns:
            return BatchTraces(traces, contexts, whole)
        # one (context, turn) pair per model turn; the context ends where the turn starts
        pairs = [(row, pair) for row, (p, ids, mask) in enumerate(zip(prompts, completion_ids, completion_mask))
                 for pair in _turns(p, ids, mask)]
        turn_traces, _, _ = first_turn_traces([p for _, (p, _) in pairs], [c for _, (_, c) in pairs],
                                              self.think_open, self.think_close, self.tokenizer)
        turns = [None if t is None else Trace(t.context, t.reasoning, row) for t, (row, _) in zip(turn_traces, pairs)]
        return BatchTraces(traces, contexts, whole, turns, len(prompts))

    def check(self, trainer: Any, batch: BatchTraces, step: int) -> dict[str, float]:
        """The first-turn check (``collapse/*``) and, with ``collapse_turns: all``, the trajectory-uniform one
        (``collapse/trajectory/*``) on the same batch, as RAGEN computes both in every check.

        Collective: every rank calls it with the same (gathered) batch."""
        started = time.perf_counter()
        self._tokens = [0, 0]
        metrics = self._first_turn_check(trainer, batch, step)
        if batch.turns is not None:
            trajectory = self._trajectory_check(trainer, batch, step)
            metrics.update({f"{TRAJECTORY}{k}": v for k, v in trajectory.items()})
        if self._tokens[0]:  # this rank's scoring forwards, as the other passes' tokens/padded_<pass>
            logged = trl_contact.metrics(trainer)
            logged["tokens/padded_collapse"].append(float(self._tokens[0]))
            logged["tokens/real_collapse"].append(float(self._tokens[1]))
        metrics["seconds"] = time.perf_counter() - started
        return metrics

    def _first_turn_check(self, trainer: Any, batch: BatchTraces, step: int) -> dict[str, float]:
        """Up to ``num_samples`` first-turn traces (without replacement, collapse_metrics.py:720-750) scored under
        every distinct prompt among them."""
        traces = batch.traces
        valid = [t for t in traces if t is not None]
        metrics = {
            "traces_total": float(len(traces)),
            "traces_valid": float(len(valid)),
            "valid_thinking_rate": len(valid) / max(len(traces), 1),
            "z_is_whole_completion": float(batch.whole_completion),
        }
        columns = list(dict.fromkeys(batch.contexts))
        sampled = self._sample(valid, columns, step) if len(columns) >= 2 else []
        # the columns are the prompts of the sampled traces' groups (upstream: np.unique of the sample's group
        # ids, collapse_metrics.py:249-256), so a prompt none of whose traces was drawn is not a column
        drawn = {t.context for t in sampled}
        columns = [c for c in columns if c in drawn]
        metrics["num_prompts"] = float(len(columns))
        if len(columns) < 2:
            return metrics  # MI needs >= 2 distinct prompts among the sampled traces
        column_of = {c: j for j, c in enumerate(columns)}
        pairs = [(n, j) for n in range(len(sampled)) for j in range(len(columns))]
        sums, counts = self._score(trainer, sampled, columns, pairs)
        L_sum = sums.view(len(sampled), len(columns))
        L_mean = L_sum / counts.view(len(sampled), len(columns))
        true = torch.tensor([column_of[t.context] for t in sampled])
        metrics.update(mi_metrics(L_mean, true))
        seq = mi_metrics(L_sum, true)
        metrics.update({f"{k}_seq": seq[k] for k in _SEQ_KEYS})
        metrics.update(self._ema_metrics(metrics, "first"))
        metrics["num_samples"] = float(len(sampled))
        metrics["tokens_scored"] = float(sum(len(columns[j]) + len(sampled[n].reasoning) for n, j in pairs))
        return metrics

    def _trajectory_check(self, trainer: Any, batch: BatchTraces, step: int) -> dict[str, float]:
        """RAGEN's trajectory-uniform multi-turn sample: each draw is a column of its own, so the mixture in
        the marginal weights a context by how often it was drawn, as upstream (trajectory group ids =
        arange, collapse_metrics.py:168-180). A context drawn twice is scored once and its column repeated;
        retrieval treats identical contexts as the same prompt (upstream's column signatures, :292-300)."""
        turns = batch.turns or []
        valid = [t for t in turns if t is not None]
        metrics = {
            "traces_total": float(len(turns)),
            "traces_valid": float(len(valid)),
            "valid_thinking_rate": len(valid) / max(len(turns), 1),
        }
        draws = self._trajectory_uniform(valid, batch.episodes, step)
        metrics["num_drawn"] = float(len(draws))
        sampled = self._within_budget(draws)
        metrics["num_samples"] = float(len(sampled))
        columns = list(dict.fromkeys(t.context for t in sampled))
        metrics["num_prompts"] = float(len(sampled))
        metrics["num_distinct_prompts"] = float(len(columns))
        if len(sampled) < 2:
            return metrics  # MI needs >= 2 columns
        column_of = {c: j for j, c in enumerate(columns)}
        pairs = [(n, j) for n in range(len(sampled)) for j in range(len(columns))]
        sums, counts = self._score(trainer, sampled, columns, pairs)
        distinct = torch.tensor([column_of[t.context] for t in sampled])  # each draw's column, as a context
        L_sum = sums.view(len(sampled), len(columns))[:, distinct]  # (K, K): column d = draw d's context
        L_mean = L_sum / counts.view(len(sampled), len(columns))[:, distinct]
        own = torch.arange(len(sampled))
        for suffix, L in (("", L_mean), ("_seq", L_sum)):
            values = mi_metrics(L, own)
            keys = _SEQ_KEYS if suffix else [k for k in values if not k.startswith("retrieval")]
            metrics.update({f"{k}{suffix}": values[k] for k in keys})
        metrics.update(signature_retrieval(L_mean, own, distinct))
        metrics.update(self._ema_metrics(metrics, "trajectory"))
        metrics["tokens_scored"] = float(sum(len(columns[j]) + len(sampled[n].reasoning) for n, j in pairs))
        return metrics

    def _trajectory_uniform(self, valid: list[Trace], episodes: int, step: int) -> list[Trace]:
        """RAGEN's multi-turn sample (collapse_metrics.py:798-831, ``_sample_trajectory_uniform``):
        min(num_samples, #valid turns) draws with replacement, each an episode uniformly among all M episodes of
        the batch, then one of its valid turns uniformly; a draw that lands on an episode without a valid turn
        yields nothing (upstream's ``if turn_counts[m] > 0``)."""
        by_episode: dict[int, list[Trace]] = {}
        for trace in valid:
            by_episode.setdefault(trace.episode, []).append(trace)
        if not by_episode or episodes < 1:
            return []
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 1)
        draws = []
        for _ in range(min(self.num_samples, len(valid))):
            turns = by_episode.get(int(torch.randint(episodes, (1,), generator=generator)))
            if turns:
                draws.append(turns[int(torch.randint(len(turns), (1,), generator=generator))])
        return draws

    def _within_budget(self, draws: list[Trace]) -> list[Trace]:
        """The longest prefix of the draws whose scoring (every draw under every distinct context drawn:
        K x sum|X distinct| + #distinct x sum|Z| tokens) fits ``collapse_max_tokens``; traces and columns shrink
        together. The RAGEN recipes size the budget so 64 x 64 always fits (collapse_num_samples^2 x the longest
        sequence); a cut is logged (``num_samples`` < ``num_drawn``) and warned about once."""
        seen: set[tuple[int, ...]] = set()
        sum_x = sum_z = 0
        kept = 0
        for k, trace in enumerate(draws, start=1):
            if trace.context not in seen:
                seen.add(trace.context)
                sum_x += len(trace.context)
            sum_z += len(trace.reasoning)
            if k * sum_x + len(seen) * sum_z > self.max_tokens:
                if not self._warned_budget:
                    self._warned_budget = True
                    logger.warning(
                        "collapse_max_tokens=%d scores only %d of the %d drawn multi-turn traces; RAGEN scores all "
                        "(set collapse_max_tokens >= collapse_num_samples^2 x the longest prompt + episode).",
                        self.max_tokens, kept, len(draws))
                break
            kept = k
        return draws[:kept]

    def _ema_metrics(self, metrics: dict[str, float], sample: str = "first") -> dict[str, float]:
        """RAGEN's EMA z-score (mll-lab-nu/RAGEN@20daedc ragen/trainer/collapse_metrics.py:315-342): the marginal std
        is smoothed (decay 0.9, started at its first value; one EMA per ``sample``, as upstream keys it by label)
        and the *current* mean gap is divided by it:
        mi_zscore_ema = mean_n(matched_n - marginal_n) / (EMA(marginal_std) + 1e-3); the same on summed log-probs."""
        out = {}
        for suffix in ("", "_seq"):
            key = f"{sample}/marginal_std{suffix}"
            current = metrics[f"marginal_std{suffix}"]
            previous = self._ema.get(key, current)
            self._ema[key] = ema = 0.9 * previous + 0.1 * current
            out[f"marginal_std{suffix}_ema"] = ema
            out[f"mi_zscore{suffix}_ema"] = metrics[f"mi_estimate{suffix}"] / (ema + ZSCORE_EPS)
        return out

    def _sample(self, valid: list[Trace], columns: list[tuple[int, ...]], step: int) -> list[Trace]:
        """Seeded sample without replacement; traces are admitted in sampling order while the token budget
        (every column x this trace) holds. A trace longer than the whole budget is truncated to fit."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        order = torch.randperm(len(valid), generator=generator).tolist()
        context_tokens = sum(len(c) for c in columns)
        budget = self.max_tokens
        out: list[Trace] = []
        for i in order:
            if len(out) == self.num_samples:
                break
            trace = valid[i]
            cost = context_tokens + len(columns) * len(trace.reasoning)
            if cost > budget:
                room = (budget - context_tokens) // len(columns)
                if out or room < 1:
                    break
                trace = Trace(trace.context, trace.reasoning[:room])
                cost = context_tokens + len(columns) * room
            out.append(trace)
            budget -= cost
        return out

    def _score(
        self, trainer: Any, sampled: list[Trace], columns: list[tuple[int, ...]], pairs: list[tuple[int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed log q(Z_n | X_j) and |Z_n| for every pair, computed shard-wise on every process."""
        acc = trainer.accelerator
        world, rank = acc.num_processes, acc.process_index
        per_rank = -(-len(pairs) // world)
        mine = list(range(rank, len(pairs), world))
        mine += [mine[-1] if mine else 0] * (per_rank - len(mine))  # equal work everywhere; duplicates dropped
        # Sort by length so each micro-batch pads little (the token-budget planner sorts again, the same way).
        mine.sort(key=lambda p: len(columns[pairs[p][1]]) + len(sampled[pairs[p][0]].reasoning))
        device = acc.device
        chunks, fillers = self._chunks(acc, mine, [len(columns[pairs[p][1]]) for p in mine],
                                       [len(sampled[pairs[p][0]].reasoning) for p in mine])
        rows = []
        for chunk, filler in [(c, False) for c in chunks] + [(f, True) for f in fillers]:
            X = [columns[pairs[p][1]] for p in chunk]
            Z = [sampled[pairs[p][0]].reasoning for p in chunk]
            input_ids, attention_mask, z_mask = _left_aligned(X, Z, self.pad_id, device)
            with torch.no_grad():
                logps, _, _ = trl_contact.per_token_logps_and_entropies(trainer,
                    trainer.model, input_ids, attention_mask, z_mask.size(1)
                )
            if filler:  # a forward only to keep ZeRO-3's collectives in lockstep with ranks that have more chunks
                continue
            self._tokens[0] += input_ids.numel()
            self._tokens[1] += int(attention_mask.sum())
            sums = (logps.double() * z_mask).sum(dim=1)
            ids = torch.tensor(chunk, dtype=torch.float64, device=device)
            rows.append(torch.stack([ids, sums, z_mask.sum(dim=1).double()], dim=1))
        gathered = acc.gather(torch.cat(rows)).cpu()
        out_sum = torch.zeros(len(pairs), dtype=torch.float64)
        out_count = torch.zeros(len(pairs), dtype=torch.float64)
        out_sum[gathered[:, 0].long()] = gathered[:, 1]  # duplicated padding pairs write identical values
        out_count[gathered[:, 0].long()] = gathered[:, 2]
        return out_sum, out_count

    def _chunks(self, acc: Any, mine: list[int], x_len: list[int], z_len: list[int]):
        """(chunks, filler chunks) of this rank's length-sorted pairs: ``collapse_micro_batch_size`` at a time (the
        same count on every rank by construction), or with ``micro_batch_tokens`` the token-budget plan of the loss
        and old-log-prob passes (X = prompt, Z = completion; :func:`_left_aligned` trims each chunk to its own
        longest X and Z) with the chunk count all-reduced to the maximum over ranks and the shortest pair as filler."""
        if self.token_budget is None:
            return [mine[s : s + self.micro_batch_size] for s in range(0, len(mine), self.micro_batch_size)], []
        plan = plan_chunks(x_len, z_len, self.token_budget)
        fillers = equal_forward_fillers(acc, len(plan), acc.device)
        return [[mine[i] for i in rows] for rows in plan], [[mine[shortest_row(x_len, z_len)]]] * fillers


def _left_aligned(
    X: list[tuple[int, ...]], Z: list[tuple[int, ...]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[pad.. X | Z ..pad] rows: contexts left-padded so every Z starts at the same position, as TRL lays out
    prompt + completion for its own log-prob pass (scored tokens = the last ``max |Z|`` positions)."""
    lx, lz = max(len(x) for x in X), max(len(z) for z in Z)
    ids = torch.full((len(X), lx + lz), pad_id, dtype=torch.long)
    attention = torch.zeros((len(X), lx + lz), dtype=torch.long)
    for i, (x, z) in enumerate(zip(X, Z)):
        ids[i, lx - len(x) : lx] = torch.tensor(x)
        ids[i, lx : lx + len(z)] = torch.tensor(z)
        attention[i, lx - len(x) : lx + len(z)] = 1
    return ids.to(device), attention.to(device), attention[:, lx:].double().to(device)


def _first_run(ids: list[int], mask: list[int]) -> list[int]:
    """The model's first turn: tokens of the first contiguous run of mask = 1 (the whole completion when
    nothing is masked out except padding)."""
    out: list[int] = []
    for token, m in zip(ids, mask):
        if m:
            out.append(token)
        elif out:
            break
    return out


def _turns(prompt: list[int], ids: list[int], mask: list[int]) -> list[tuple[list[int], list[int]]]:
    """Every model turn (run of mask = 1) of a completion with its context: the prompt and all tokens before it."""
    out: list[tuple[list[int], list[int]]] = []
    start = None
    for k, m in enumerate([*mask, 0]):
        if m and start is None:
            start = k
        elif not m and start is not None:
            out.append((prompt + ids[:start], ids[start:k]))
            start = None
    return out


def _single_token_id(tokenizer: Any, token: str) -> int | None:
    """Id of ``token`` when the vocabulary has it as one token (Qwen3's think tags), else None."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


@register_hook("collapse", enabled=lambda args: args.collapse_detection, points=("before_pipeline",))
def build_collapse_detector(trainer: Any) -> CollapseDetector:
    """RAGEN-2's collapse probe for ``trainer`` (its schedule and EMAs are checkpointed)."""
    return CollapseDetector(trainer.args, trl_contact.tokenizer(trainer))


@register_config_check
def check_collapse_fields(args: Any) -> None:
    """The probe's sizes: at least one step between checks, two traces (a mutual information needs two), one token
    and one sequence per forward."""
    for name, low in (
        ("collapse_every", 1),
        ("collapse_num_samples", 2),
        ("collapse_max_tokens", 1),
        ("collapse_micro_batch_size", 1),
    ):
        if getattr(args, name) < low:
            raise ConfigError(name, f"must be >= {low} (got {getattr(args, name)})", f"use a value >= {low}")
