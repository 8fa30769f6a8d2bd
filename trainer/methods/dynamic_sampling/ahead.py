"""DAPO's refill rounds under overlapped generation (``max_staleness`` > 0): generated when a batch arrives, from the
weights that generated the batch.

In the synchronous loop the refill rounds of batch ``k`` are decided from the batch's rewards when it trains, and
generated then, by the weights that generated its first round. With ``s`` > 0 the server holds newer weights by the
time batch ``k`` trains, so the decision moves to the batch's arrival: the main process scores every rank's rows of
the first round on the generation worker (the reward functions the trainer will run, on the same rows, with TRL's
arguments: :func:`arrival_rewards`), and while fewer than P groups are mixed it generates the next round of the
refill stream at once, up to ``max_num_gen_batches`` rounds -- the rule of :meth:`DynamicSampler.fill`. All rounds
of a batch are one request of the queue (trainer/server/overlap.py), so the next weight sync waits for them and they
all come from the batch's version.

When the batch trains, the trainer scores and decides again from TRL's own rewards (nothing about the synchronous
path changes) and takes the rounds in order; if it asks for more or fewer rounds than arrived, the reward functions
did not score the same rows the same way twice (a reward that reads ``trainer_state``, or draws random numbers), and
the run stops with that message rather than train on rounds from other weights.

The refill stream here is the global one: every rank's refill batch ``n``, in rank order. Accelerate deals a
sampler's consecutive batches to the ranks in turn (``BatchSamplerShard``, ``split_batches`` off), so rank ``r``'s
batch ``n`` is the ``n x P + r``-th local batch of the sampler and the concatenation over ranks is the ``n``-th chunk
of ``generation_batch_size`` sampler indices. The training loop's own refill prompts are checked against these when
they are taken (trainer/server/overlapped_generation.py).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import threading
from typing import Any, Callable

import torch
import transformers
from packaging.version import Version
from trl.chat_template_utils import parse_response
from trl.data_utils import is_conversational

from trainer import trl_contact
from trainer.algorithms.dapo import mixed_groups
from trainer.guards.rewards import RewardGuard


class FillAhead:
    """The main process's refill rounds of each batch, generated on arrival (module doc).

    ``dataset`` and ``sampler_fn`` make the refill stream exactly as the training loop's refill dataloader makes it;
    ``metric(rewards per function)`` is the value whose spread makes a group mixed. Refill prompts are tokenized on
    the trainer's thread (:meth:`top_up`, TRL's ``_tokenize_prompts``: a fast tokenizer is not safe to share between
    threads) before the worker needs them (:meth:`rounds`)."""

    def __init__(self, trainer: Any, dataset: Any, sampler_fn: Callable[[Any], Any],
                 metric: Callable[[torch.Tensor], torch.Tensor]):
        self.trainer = trainer
        self.dataset, self.sampler_fn, self.metric = dataset, sampler_fn, metric
        self.G = trainer.num_generations
        self.N = trainer.args.generation_batch_size  # rows of one generation batch, every rank's
        self.max_rounds = trainer.args.max_num_gen_batches
        self.consumed = 0  # refill batches the worker has used (checkpointed)
        self._produced = 0  # refill batches tokenized so far
        self._ready: collections.deque[tuple[list[dict[str, Any]], list[list[int]]]] = collections.deque()
        self._lock = threading.Lock()
        self._stream = None
        # the worker decodes with its own copy (decoding on the trainer's tokenizer would race with its encoding)
        self._processing_class = copy.deepcopy(trainer.processing_class)
        self._tokenizer = getattr(self._processing_class, "tokenizer", self._processing_class)

    # --- the trainer's thread ---------------------------------------------------------------------------------

    def top_up(self, batches_in_flight: int) -> None:
        """Tokenize refill batches until every batch in flight can take its whole share: at most
        ``max_num_gen_batches - 1`` each (called when a batch is submitted)."""
        with self._lock:
            target = self.consumed + batches_in_flight * (self.max_rounds - 1)
        while self._produced < target:
            rows = next(self._global_stream())
            prompt_ids, _, _ = trl_contact.tokenize_prompts(self.trainer, [x["prompt"] for x in rows])
            self._ready.append((rows, prompt_ids))
            self._produced += 1

    def state_dict(self) -> dict[str, int]:
        """The refill batches the worker used (with nothing in flight: the queue drains first)."""
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue the refill stream after the batches a checkpointed run used."""
        self.consumed = self._produced = int(state["consumed"])
        self._ready.clear()
        self._stream = None

    # --- the worker ---------------------------------------------------------------------------------------

    def rounds(self, post: Callable[[list[list[int]]], tuple], prompt_ids: list[list[int]],
               inputs: list[dict[str, Any]]) -> list[tuple]:
        """Every round of one batch: ``post(unique prompt ids)`` (the server's answer: prompt ids, completion ids,
        log-probs) for the first round's rows ``prompt_ids`` / ``inputs`` (every rank's, G per prompt), then refill
        rounds while fewer than P groups are mixed, up to ``max_num_gen_batches`` rounds in all."""
        P = self.N // self.G
        out = [post(prompt_ids[:: self.G])]
        found = min(P, int(self._mixed(inputs, prompt_ids, out[-1][1]).sum()))
        while found < P and len(out) < self.max_rounds:
            with self._lock:
                if not self._ready:
                    raise RuntimeError("dynamic sampling ahead: a refill round was needed before it was tokenized")
                inputs, prompt_ids = self._ready.popleft()
                self.consumed += 1
            out.append(post(prompt_ids[:: self.G]))
            found = min(P, found + int(self._mixed(inputs, prompt_ids, out[-1][1]).sum()))
        return out

    def _mixed(self, inputs: list[dict[str, Any]], prompt_ids: list[list[int]],
               completion_ids: list[list[int]]) -> torch.Tensor:
        rewards = arrival_rewards(self.trainer, self._processing_class, self._tokenizer, inputs, prompt_ids,
                                  completion_ids)
        return mixed_groups(self.metric(rewards), self.G)

    def _global_stream(self):
        if self._stream is None:
            self._stream = self._batches()
            for _ in range(self._produced):  # a resumed run: past what the checkpointed run used
                next(self._stream)
        return self._stream

    def _batches(self):
        sampler = self.sampler_fn(self.dataset)
        while True:  # epochs: the sampler's generator advances, as the training loop's refill dataloader's does
            indices = list(iter(sampler))
            for start in range(0, len(indices) - self.N + 1, self.N):
                yield [self.dataset[i] for i in indices[start:start + self.N]]


def arrival_rewards(trainer: Any, processing_class: Any, tokenizer: Any, inputs: list[dict[str, Any]],
                    prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> torch.Tensor:
    """The rewards per function (N, K, float32 as TRL keeps them) of rows the trainer has not scored yet, as its
    scoring will compute them: TRL's decoding of the completions (trl==1.16.0:trl/trainer/grpo_trainer.py:2228-2246)
    and its reward call (``_calculate_rewards``: 1579-1662, the dataset columns, ``trainer_state``), through winnow's
    view of a completion (the think prefill). A reward function that fails or returns garbage scores NaN here: the
    trainer's own scoring raises it when the batch trains. Model reward functions are refused before (they run on
    the trainer's devices)."""
    prompts = [x["prompt"] for x in inputs]
    if is_conversational({"prompt": prompts[0]}):
        if Version(transformers.__version__) >= Version("5.0.0") and (
            getattr(tokenizer, "response_template", None) is not None
            or getattr(tokenizer, "response_schema", None) is not None
        ):
            completions = [[parse_response(tokenizer, ids, prefix=prompt_ids[i], tools=trainer.tools)]
                           for i, ids in enumerate(completion_ids)]
        else:
            contents = processing_class.batch_decode(completion_ids, skip_special_tokens=True)
            completions = [[{"role": "assistant", "content": content}] for content in contents]
    else:
        completions = processing_class.batch_decode(completion_ids, skip_special_tokens=True)
    completions = trainer.completions_as_scored(completions)
    columns = [key for key in inputs[0] if key not in ("prompt", "completion", "completion_ids")]
    kwargs = {key: [x[key] for x in inputs] for key in columns}
    kwargs.update(trainer_state=trainer.state, log_extra=_nothing, log_metric=_nothing)
    guard = RewardGuard()  # its own failures: none of them reach the trainer's guard
    rewards = torch.full((len(prompts), len(trainer.reward_funcs)), float("nan"), dtype=torch.float32)
    for i, func in enumerate(guard.wrap([getattr(f, "__wrapped__", f) for f in trainer.reward_funcs])):
        values = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
        if hasattr(values, "__await__"):  # an async reward function: on TRL's event loop, as TRL runs it
            values = asyncio.run_coroutine_threadsafe(values, trainer.async_loop).result()
        rewards[:, i] = torch.tensor([torch.nan if v is None else v for v in values], dtype=torch.float32)
    return rewards


def _nothing(*args: Any, **kwargs: Any) -> None:
    """``log_extra`` / ``log_metric`` on arrival: the trainer's scoring logs when the batch trains."""
