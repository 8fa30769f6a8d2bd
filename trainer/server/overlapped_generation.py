"""``max_staleness`` > 0 in the trainer: TRL's server-mode generation of one batch, split into its request (sent
ahead, on the worker of trainer/server/overlap.py) and its result (taken when the batch trains).

TRL's ``VLLMGeneration.generate`` (trl==1.16.0:trl/generation/vllm_generation.py:550-650, server branch) gathers
every rank's prompt ids, has the main process POST the unique prompts once with the sampling settings, broadcasts the
answer and hands each rank its slice; ``GRPOTrainer._generate_single_turn`` syncs the weights first when the step
changed and keeps the sampled token's log-prob. Here the same happens in two halves: the gather and the POST when the
batch is submitted (``k + s`` at the start of batch ``k``), the broadcast and the slice when batch ``k`` is taken. The
prompts of the batches ahead come from a second pass over the trainer's own dataloader (:class:`PromptLookahead`):
TRL's loop hands the trainer only the batch it trains. The sync is TRL's backend's ``sync_weights`` (NCCL, disk or
LoRA as configured), called by the queue between two requests.

Multi-turn environment episodes (winnow's ``rollout_func``, trainer/rollout/multi_turn.py) are played ahead the same
way, whole: the main process plays every rank's episodes of a batch on the worker, turn by turn, from the batch's
version (:meth:`OverlappedGeneration.rollout`); TRL's rollout path syncs the weights itself just before it calls the
rollout, once the generations in flight are done (:meth:`OverlappedGeneration.before_generate`).

Hook ``overlap`` (trainer/pipeline/stages.py): built when ``max_staleness`` > 0; its checkpoint file holds the batches
in flight (waited for), so a resume trains exactly the rollouts the uninterrupted run trains.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback

from trainer import trl_contact
from trainer.config.errors import ConfigError
from trainer.config.server import overlap_wait_bound_s, server_url
from trainer.pipeline.stages import register_hook
from trainer.server.generation import raise_on_every_rank, wait_group
from trainer.server.overlap import GenerationQueue

CHECKPOINT_FILE = "winnow_overlap.pt"


class PromptLookahead:
    """The trainer's local generation batches in the order its training loop will see them, read ahead.

    TRL's dataloader (``GRPOTrainer.get_train_dataloader``) yields each local generation batch ``R = num_iterations x
    steps_per_generation`` times in a row (its RepeatSampler); batch ``k`` is element ``k x R`` of the stream, epochs
    following one another as the loop's do. A second dataloader built the same way (same sampler seed, same sharding)
    yields the same stream."""

    def __init__(self, trainer: Any):
        self.loader = trainer.get_train_dataloader()
        self.repeat = trainer.num_iterations * trainer.args.steps_per_generation
        self._iterator = None
        self._next = 0  # the index of the batch the iterator yields next
        self._last: list[dict[str, Any]] | None = None  # batch _next - 1

    def batch(self, k: int) -> list[dict[str, Any]]:
        """Local generation batch ``k`` (non-decreasing ``k``: the stream is read once)."""
        if k < self._next - 1:
            raise ValueError(f"batch {k} is behind the lookahead ({self._next - 1} read)")
        if k == self._next - 1:
            return self._last
        while self._next <= k:
            first = self._element()
            for _ in range(self.repeat - 1):
                self._element()
            self._last, self._next = first, self._next + 1
        return self._last

    def _element(self) -> Any:
        # torch's DataLoader draws its base seed from the global RNG when an iterator starts: forked, so reading
        # ahead leaves the run's random stream where the training loop alone would leave it
        with torch.random.fork_rng(devices=[]):
            if self._iterator is None:
                self._iterator = iter(self.loader)
            try:
                return next(self._iterator)
            except StopIteration:  # the next epoch, as the training loop starts it
                self._iterator = iter(self.loader)
                return next(self._iterator)


class OverlappedGeneration:
    """The ``overlap`` hook: the queue of requests, the prompts ahead, TRL's request and slice, the metrics."""

    def __init__(self, trainer: Any):
        if getattr(trainer, "tools", None) or getattr(trainer, "environment_factories", None) is not None:
            raise ConfigError("max_staleness", "tool calls and environments generate several times per batch, "
                              "with the weights of each moment", "use max_staleness: 0 with tools or environments")
        self.trainer = trainer
        self.staleness = trainer.args.max_staleness
        self.main = trainer.accelerator.is_main_process
        self.lookahead = PromptLookahead(trainer)
        self.dynamic_sampling = bool(trainer.args.dynamic_sampling)
        if self.dynamic_sampling:
            _check_dynamic_sampling(trainer)
        self._fill = None  # DAPO's refill rounds generated on arrival (methods/dynamic_sampling/ahead.py), built once
        self._rounds: list = []  # the rounds of the batch being trained that its refills have not taken yet
        self._rounds_of = -1  # ... and that batch's index
        # the server may hold any weights when training starts: version 0 (the initial policy) is synced first. A
        # request is what the main process runs on the worker (a call); the other ranks run nothing
        self.queue = GenerationQueue(self.staleness, _call if self.main else _nothing, self._sync, server_version=-1)
        # while the main process waits for the server, the other ranks wait here (CPU, bounded by the schedule), not
        # in the weight sync's or the broadcast's NCCL collectives
        turns = 1 if trainer.rollout_func is None else trainer.rollout_func.settings.max_turns  # winnow's multi-turn
        self._wait_group = wait_group(trainer.accelerator, overlap_wait_bound_s(trainer.args, turns))  # (the only one)
        self._base_url = server_url(trainer.args)

    # --- what the trainer calls ------------------------------------------------------------------------------

    def completions(self, trainer: Any, prompt_ids: list[list[int]], num_generations: int):
        """``_generate_single_turn``'s answer for the current generation batch: (completion ids, the sampled
        tokens' log-probs), from the weights of version ``max(0, k - s)``. With dynamic sampling, the batch's later
        calls (its refill rounds) take the rounds generated on its arrival, in order."""
        k = _batch_index(trainer)
        if self.dynamic_sampling and self._rounds_of == k:
            if not self._rounds:
                raise RuntimeError(_ROUNDS_DIFFER.format(k=k, what="more refill rounds than"))
            return self._slice(trainer, k, self._rounds.pop(0), prompt_ids, num_generations)
        if self._rounds:
            raise RuntimeError(_ROUNDS_DIFFER.format(k=self._rounds_of, what="fewer refill rounds than"))
        # version k (the weights that trained on batches 0 .. k - 1) to the server, then the requests up to k + s;
        # batch k itself is requested here only at the run's start, from the prompts TRL hands over
        output = self._take(trainer, k, lambda j: self._request(
            prompt_ids if j == k else self._prompt_ids(trainer, j), num_generations, j))
        if self.dynamic_sampling:
            self._rounds, self._rounds_of = list(output["rounds"]), k
            output = self._rounds.pop(0)
        return self._slice(trainer, k, output, prompt_ids, num_generations)

    def _take(self, trainer: Any, k: int, request_of: Callable[[int], Any]) -> Any:
        """Batch ``k``'s result on every rank, after the protocol's start of the batch (``request_of(j)``: batch
        ``j``'s request, for the batches it sends), and its staleness and waits logged."""
        self._settle(trainer, k)
        self.queue.start_batch(k, request_of)
        failure, generated = None, None
        try:
            generated = self.queue.take(k)
        except Exception as exc:  # noqa: BLE001 -- raised on every rank just below
            failure = exc
        output = raise_on_every_rank(trainer.accelerator, failure, self._base_url, f"generation batch {k}",
                                     payload=generated.output if self.main else None, group=self._wait_group)
        self._log(trainer, k, generated.version)
        return output

    def _settle(self, trainer: Any, k: int) -> None:
        """Every rank learns whether batch ``k``'s request failed before the batch's first collective (the weight
        sync): the main process waits for the requests in flight, the others on the wait group; a failure is raised
        on every rank (the main process raises its own)."""
        failure = None
        if self.main:
            self.queue.wait()
            failure = self.queue.failure(k)
        raise_on_every_rank(trainer.accelerator, failure, self._base_url, f"generation batch {k}",
                            group=self._wait_group)

    def _slice(self, trainer: Any, k: int, output: tuple, prompt_ids: list[list[int]], num_generations: int):
        """This rank's rows of one round's answer (every rank's), checked against the prompts the loop handed over."""
        all_prompt_ids, all_completion_ids, all_logprobs = output
        rank = trainer.accelerator.process_index
        rows = slice(rank * len(prompt_ids), (rank + 1) * len(prompt_ids))
        expected = [ids for ids in all_prompt_ids for _ in range(num_generations)][rows]
        if [list(p) for p in expected] != [list(p) for p in prompt_ids]:
            raise RuntimeError(f"generation batch {k}: the prompts generated ahead are not the prompts the training "
                               "loop handed over (the lookahead dataloader, or dynamic sampling's refill stream, "
                               "diverged from the trainer's)")
        completion_ids = all_completion_ids[rows]
        logprobs = None if all_logprobs is None else [[lp[0] for lp in seq] for seq in all_logprobs[rows]]
        return completion_ids, logprobs

    def before_generate(self, trainer: Any) -> None:
        """Before TRL generates with a ``rollout_func`` (``WinnowGRPOTrainer.generate_and_score``): it syncs the
        step's weights before calling it, so the generations in flight (all from older weights) must be done first."""
        self._settle(trainer, _batch_index(trainer))

    def rollout(self, trainer: Any, prompts: list, play_ahead: Callable[[list], dict[str, Any]],
                finish: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """A ``rollout_func``'s answer for the current generation batch, played ahead from the weights of version
        ``max(0, k - s)`` (winnow's multi-turn rollout: trainer/rollout/multi_turn.py). ``play_ahead(every
        process's prompts)`` runs on the main process's worker with no collective and returns the rollout dict of
        all rows (per-row lists); ``finish(this rank's rows)`` runs when the batch trains (it may be collective).
        TRL synced this step's weights before the call (:meth:`before_generate`); the queue's sync skips them."""
        k = _batch_index(trainer)
        everything = self._take(trainer, k, lambda j: self._rollout_request(
            prompts if j == k else [x["prompt"] for x in self.lookahead.batch(j)], play_ahead))
        rank = trainer.accelerator.process_index
        rows = slice(rank * len(prompts), (rank + 1) * len(prompts))
        if everything["_prompts"][rows] != list(prompts):
            raise RuntimeError(f"generation batch {k}: the prompts played ahead are not the prompts the training loop "
                               "handed over (the lookahead dataloader diverged from the trainer's)")
        local = {key: value[rows] if isinstance(value, list) else value
                 for key, value in everything.items() if key != "_prompts"}
        return finish(local)

    def save_checkpoint(self, trainer: Any, folder: str) -> None:
        """The queue's counters and every batch in flight, waited for (all ranks wait; the main process writes),
        with the refill batches those batches used."""
        state = self.queue.state_dict()
        if self.dynamic_sampling:
            state["dynamic_sampling_ahead"] = self._fill_ahead().state_dict()
        if self.main:
            torch.save(state, os.path.join(folder, CHECKPOINT_FILE))

    def load_checkpoint(self, trainer: Any, folder: str) -> None:
        """Restore :meth:`save_checkpoint`'s batches: they are trained without being generated again."""
        path = os.path.join(folder, CHECKPOINT_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{folder} holds no {CHECKPOINT_FILE}: it was written with max_staleness 0, and "
                                    "its run generated no batch ahead; resume it with max_staleness: 0")
        state = torch.load(path, map_location="cpu", weights_only=True)  # token ids, log-probs, counters: no code
        if self.dynamic_sampling:
            self._fill_ahead().load_state_dict(state.pop("dynamic_sampling_ahead", {"consumed": 0}))
        self.queue.load_state_dict(state)

    # --- the two halves of TRL's request ---------------------------------------------------------------------

    def _prompt_ids(self, trainer: Any, k: int) -> list[list[int]]:
        """This rank's prompt ids of generation batch ``k``, tokenized as TRL tokenizes the batch it trains."""
        inputs = self.lookahead.batch(k)
        prompt_ids, images, _ = trl_contact.tokenize_prompts(trainer, [x["prompt"] for x in inputs])
        if images is not None:
            raise NotImplementedError("max_staleness > 0 does not send images yet")
        return prompt_ids

    def _request(self, prompt_ids: list[list[int]], num_generations: int, k: int) -> Callable[[], Any] | None:
        """Gather every rank's prompt ids (collective): the main process's POST of the unique ones (None on the
        other ranks, which send nothing). With dynamic sampling, every rank's rows too: the main process scores
        them on arrival and generates the refill rounds they need (methods/dynamic_sampling/ahead.py)."""
        everyone = self._gather(prompt_ids)
        if self.dynamic_sampling:
            rows = self._gather(list(self.lookahead.batch(k)))
            if not self.main:
                return None
            self._fill_ahead().top_up(self.staleness + 1)  # at most s + 1 batches unfinished, this one included
            return functools.partial(self._rounds_ahead, everyone, rows, num_generations)
        request = {"prompts": everyone[::num_generations], "n": num_generations}
        return functools.partial(self._post, request) if self.main else None

    def _rounds_ahead(self, prompt_ids: list[list[int]], rows: list[dict[str, Any]], n: int) -> dict[str, list]:
        """On the worker: every round of one batch, refills decided on arrival."""
        post = lambda unique: self._post({"prompts": unique, "n": n})  # noqa: E731
        return {"rounds": self._fill_ahead().rounds(post, prompt_ids, rows)}

    def _fill_ahead(self) -> Any:
        if self._fill is None:
            self._fill = self.trainer.hook("dynamic_sampling").ahead()
        return self._fill

    def _rollout_request(self, prompts: list, play_ahead: Callable[[list], dict[str, Any]]) -> Callable | None:
        """Gather every rank's prompts (collective): the main process plays all their episodes."""
        everyone = self._gather(prompts)
        return functools.partial(_played, play_ahead, everyone) if self.main else None

    def _gather(self, rows: list) -> list:
        return gather_object(rows) if self.trainer.accelerator.num_processes > 1 else list(rows)

    def _post(self, request: dict[str, Any]) -> tuple:
        """The main process's request, on the queue's worker: TRL's client and sampling settings."""
        backend = trl_contact.vllm_generation(self.trainer)
        output = backend.vllm_client.generate(prompts=request["prompts"], **sampling_params(backend, request["n"]))
        return output["prompt_ids"], output["completion_ids"], output["logprobs"]

    def _sync(self, version: int) -> None:
        """Put the trainer's current weights (``version``) on the server: TRL's backend's sync (collective) -- unless
        TRL's rollout path synced this step's weights just before (:meth:`before_generate`)."""
        if not trl_contact.weights_synced_this_step(self.trainer):
            trl_contact.vllm_generation(self.trainer).sync_weights()

    def _log(self, trainer: Any, k: int, version: int) -> None:
        metrics = trl_contact.metrics(trainer)
        stats = self.queue.pop_stats()
        metrics["async/staleness"].append(float(k - version))
        metrics["async/policy_version"].append(float(version))
        metrics["async/generation_wait_s"].append(stats.generation_wait_s)
        metrics["async/sync_wait_s"].append(stats.sync_wait_s)
        metrics["async/train_wait_s"].append(stats.train_wait_s)


_ROUNDS_DIFFER = (
    "generation batch {k}: dynamic sampling asked for {what} the rounds generated when the batch arrived. The "
    "reward functions scored the same rows differently at arrival and when the batch trained (a reward that reads "
    "trainer_state or draws random numbers); with max_staleness > 0 dynamic sampling needs rewards that depend on "
    "the rows alone, or use max_staleness: 0")


def _check_dynamic_sampling(trainer: Any) -> None:
    """What dynamic sampling's arrival-time scoring cannot run: a model reward (on the trainer's devices, not the
    worker's), a rollout_func's episodes (played whole on the worker, their rewards scored by the environment)."""
    if trainer.rollout_func is not None:
        raise ConfigError("max_staleness", "dynamic sampling with multi-turn episodes would replay whole refill "
                          "episodes on arrival", "use max_staleness: 0 with dynamic_sampling and environment rollouts")
    models = [name for name, f in zip(trainer.reward_func_names, trainer.reward_funcs, strict=True)
              if isinstance(f, torch.nn.Module)]
    if models:
        raise ConfigError("max_staleness", f"dynamic sampling scores each batch on arrival, on the generation worker; "
                          f"the reward model(s) {models} run on the trainer's devices",
                          "use max_staleness: 0 with reward models and dynamic_sampling")


def sampling_params(backend: Any, n: int) -> dict[str, Any]:
    """The sampling settings TRL's server branch sends with each request (trl==1.16.0:
    trl/generation/vllm_generation.py:612-623), read from TRL's backend."""
    return {
        "n": n,
        "repetition_penalty": backend.repetition_penalty,
        "temperature": backend.temperature,
        "top_p": backend.top_p,
        "top_k": backend.top_k,
        "min_p": 0.0 if backend.min_p is None else backend.min_p,
        "max_tokens": backend.max_completion_length,
        "logprobs": backend.logprobs,
        "structured_outputs_regex": backend.structured_outputs_regex,
        "generation_kwargs": backend.generation_kwargs,
    }


def _batch_index(trainer: Any) -> int:
    """The generation batch the trainer is at (TRL's loop: one per ``steps_per_generation`` micro-steps)."""
    buffer = trainer.generation_buffer
    return buffer.micro_step // buffer.micro_steps_per_batch


def _call(request: Callable[[], Any]) -> Any:
    """The main process's request, on the queue's worker."""
    return request()


def _played(play_ahead: Callable[[list], dict[str, Any]], prompts: list) -> dict[str, Any]:
    """``play_ahead``'s rollout dict of ``prompts``, with the prompts (checked against those the loop hands over)."""
    return {**play_ahead(prompts), "_prompts": list(prompts)}


def _nothing(request: Any) -> None:
    """A rank other than the main process sends nothing: it receives the batch by broadcast when it is taken."""
    return None


class OverlapCallback(TrainerCallback):
    """Evaluation and the end of training around the overlapped requests.

    - Before an evaluation (``control.should_evaluate`` at a step's end): evaluation generates through TRL's own
      path, which first syncs the weights of that moment, so the generations in flight are waited for, and the
      queue learns that the server no longer holds the version it published. At a generation batch's end those
      weights are the next batch's version: its publish then finds them synced by TRL at this step and sends
      nothing (``weights_synced_this_step``); after a step inside a batch it syncs.
    - At the end of training the requests still in flight (the ``s`` batches ahead) are waited for, and the worker
      stopped: no thread outlives the run, and the server is idle when ``train()`` returns."""

    def __init__(self, overlap: OverlappedGeneration):
        self.overlap = overlap

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_evaluate:
            self.overlap.queue.wait()
            self.overlap.queue.server_reloaded()

    def on_train_end(self, args, state, control, **kwargs):
        self.overlap.queue.close()


@register_hook("overlap", enabled=lambda args: getattr(args, "max_staleness", 0) > 0,
               points=("save_checkpoint", "load_checkpoint"))
def build(trainer: Any) -> OverlappedGeneration:
    """Overlapped generation for a run with ``max_staleness`` > 0, and its callback (evaluation, the run's end)."""
    overlap = OverlappedGeneration(trainer)
    trainer.add_callback(OverlapCallback(overlap))
    return overlap
