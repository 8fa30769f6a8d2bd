"""Multi-turn environment rollout: a TRL ``rollout_func`` that plays episodes and trains on the exact tokens.

For each prompt of the batch (a level, envs/levels.py; TRL already repeats each one G times) an
:class:`~envs.episode.Episode` is played for up to ``max_turns`` turns. Episodes run batched: every turn is
one generation call for all live episodes of the process. What TRL trains on is built token by token:

- ``prompt_ids`` = the chat template applied to [system (rules), user (turn-1 state)] with the generation
  prompt;
- ``completion_ids`` = turn 1's **sampled ids** (mask 1) + the environment's reply (mask 0) + turn 2's
  sampled ids (mask 1) + ... Nothing sampled is decoded and re-encoded (the flaw of RAGEN's re-rendering,
  reference notes §7.3): the environment's reply is the token *difference* the model's training chat
  template adds for one more user message (``<|im_end|>\\n<|im_start|>user\\n...<|im_start|>assistant\\n``),
  and the next turn is sampled from exactly these tokens. A turn cut by ``turn_max_tokens`` is closed with
  the template's end-of-turn token (mask 0), as the template would close it.
- ``env_mask`` (TRL turns it into ``tool_mask``, a loss-only mask) = 1 on sampled tokens only.
- With a ``prefill`` (``think_prefill: true`` gives ``<think>``, RAGEN's generation prompt: mll-lab-nu/RAGEN@20daedc
  ragen/llm_agent/ctx_manager.py:1259-1263) its tokens end every context the model samples from: after the first
  prompt and after each environment reply (mask 0, never trained on), and each reply is parsed with the prefill
  prepended, as RAGEN does (ctx_manager.py:1406).

The chat template is the model's *training* template: for Qwen3 (and the other families TRL ships one
for) TRL's prefix-preserving variant, because the stock Qwen3 template drops earlier turns' think blocks
and would render a conversation that differs from what was sampled. A template that is not
prefix-preserving for a user turn is refused with a clear error.

Generation backends (:class:`LocalBackend`: ``model.generate``, CPU and tests; :class:`VLLMServerBackend`:
TRL's vLLM client, GPU) take token-id contexts and return sampled ids (and the sampling log-probs when the
backend gives them). Per-row extras -- ``episode_return``, ``success``, ``num_turns``, ``num_actions``,
``penalised_turns``, ``truncated``, ``turn_spans`` (each turn's sampled span in the completion, for the
collapse detector's multi-turn traces), ``env_seed`` -- reach the reward functions (rewards/env.py) as
keyword arguments; their batch means are logged as ``env/*``.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from accelerate.utils import broadcast_object_list, gather_object
from trl.chat_template_utils import get_training_chat_template
from trl.models.utils import unwrap_model_for_generation

from envs import make_env
from envs.episode import Episode, EpisodeSettings
from envs.levels import parse_level_prompt
from trainer import trl_contact
from trainer.config.errors import ConfigError


def training_chat_template(tokenizer: Any) -> str | None:
    """The model's training chat template: TRL's prefix-preserving variant where TRL ships one (Qwen3, Qwen2.5,
    Llama 3, ...), else None (the tokenizer's own template, checked by :class:`ChatTokens`)."""
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:  # no training variant known; the tokenizer's own may still be prefix-preserving (ChatML)
        return None


class ChatTokens:
    """Token-exact turn boundaries from a chat template (see the module docstring)."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None, template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.template = chat_template
        self.kwargs = dict(template_kwargs or {})
        self.turn_end_id = self._turn_end_id()
        self.turn_end = tokenizer.decode([self.turn_end_id])
        # Fail at construction, not mid-episode, when the template cannot give token-exact user turns.
        self.user_turn_ids({"role": "user", "content": "probe"})

    def _turn_end_id(self) -> int:
        """The special token the template closes an assistant turn with (``<|im_end|>`` for ChatML families,
        also when the tokenizer's eos is ``<|endoftext|>`` as in base Qwen2.5)."""
        marker = "winnow-assistant-turn"
        text = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": marker}], False)
        tail = self.encode(text.rsplit(marker, 1)[-1]) if marker in text else []
        special = set(self.tokenizer.all_special_ids) | {
            i for i, t in self.tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)}
        if not tail or tail[0] not in special:
            raise ValueError("the chat template does not close an assistant turn with a special token, so the rollout "
                             "cannot tell where a sampled turn ends; use a chat template with an end-of-turn token")
        return tail[0]

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The template's text for ``messages``."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, chat_template=self.template,
            **self.kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens in the text are parsed; none are added)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The first turn's context: ``messages`` with the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def user_turn_ids(self, message: dict[str, str]) -> list[int]:
        """Tokens the template adds after a closed assistant turn for one more user ``message`` and the next
        generation prompt (the end-of-turn token itself excluded: the model sampled it, or the rollout closes
        the turn with it)."""
        # The probe's assistant turn thinks: templates that drop earlier turns' think blocks (stock Qwen3) fail here.
        base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\na"}]
        prefix = self.render(base, add_generation_prompt=False)
        full = self.render([*base, message], add_generation_prompt=True)
        cut = prefix.rfind(self.turn_end) + len(self.turn_end)
        if cut < len(self.turn_end) or not full.startswith(prefix[:cut]):
            raise ValueError(
                "the chat template is not prefix-preserving for a user turn after an assistant turn, so a multi-turn "
                "rollout cannot be token-exact; use the model's training template (trl.chat_template_utils."
                "get_training_chat_template) or give the tokenizer a prefix-preserving chat_template"
            )
        return self.encode(full[cut:])


@dataclass
class Sample:
    """One sampled continuation: token ids and, when the backend gives them, their sampling log-probs."""

    ids: list[int]
    logprobs: list[float] | None = None


class LocalBackend:
    """``model.generate`` on the process's own episodes (CPU, tests). TRL's sampling settings; the
    parameters are gathered once per rollout under ZeRO-3 (TRL's ``unwrap_model_for_generation``)."""

    def __init__(self, trainer: Any):
        if trainer.is_deepspeed_enabled and not trainer.args.ds3_gather_for_generation:
            raise ConfigError(
                "ds3_gather_for_generation", "False is not supported by the multi-turn rollout (ranks play different "
                "numbers of turns, so generation cannot run in lockstep)", "keep the default True",
            )
        self.trainer = trainer

    @contextmanager
    def session(self) -> Iterator["LocalBackend"]:
        """Unwrap (and under ZeRO-3 gather) the policy once for all turns of the rollout."""
        t = self.trainer
        with unwrap_model_for_generation(
            t.model_wrapped, t.accelerator, gather_deepspeed3_params=t.args.ds3_gather_for_generation,
            generation_kwargs=t.generation_kwargs,
        ) as model, torch.no_grad():
            self._model = model
            yield self
        self._model = None

    def generate(
        self, contexts: list[list[int]], max_new_tokens: int, temperature: float, stop_ids: Sequence[int]
    ) -> list[Sample]:
        """Sample one continuation per context (left-padded batch)."""
        if not contexts:
            return []
        t = self.trainer
        pad = trl_contact.pad_token_id(t)
        width = max(len(c) for c in contexts)
        device = t.accelerator.device
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts], device=device)
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=device)
        config = copy.deepcopy(t.generation_config)
        config.max_new_tokens, config.temperature, config.eos_token_id = max_new_tokens, temperature, list(stop_ids)
        out = self._model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        return [Sample(row.tolist()) for row in out[:, width:].cpu()]


class VLLMServerBackend:
    """TRL's vLLM client (``vllm_mode: server``): the main process sends every process's contexts as token
    ids, one completion each, and broadcasts the results (collective: every rank calls every turn). The
    sampling log-probs come back with the ids (TRL's importance-sampling correction uses them)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def session(self):
        """Nothing to hold between turns (weights are synced by TRL before the rollout)."""
        return nullcontext(self)

    def generate(
        self, contexts: list[list[int]], max_new_tokens: int, temperature: float, stop_ids: Sequence[int]
    ) -> list[Sample]:
        """Generate on the server for every process's contexts; return this process's samples."""
        t = self.trainer
        acc = t.accelerator
        counts = gather_object([len(contexts)])
        every = gather_object(list(contexts))
        payload = [None]
        if acc.is_main_process and every:
            payload = [server_request(t, every, max_new_tokens, temperature, stop_ids)]
        broadcast_object_list(payload, from_process=0)
        if payload[0] is None:
            return []
        ids, logprobs = payload[0]
        start = sum(counts[: acc.process_index])
        return [
            Sample(list(i), list(lp))
            for i, lp in zip(ids[start : start + len(contexts)], logprobs[start : start + len(contexts)])
        ]


class DirectServerBackend(VLLMServerBackend):
    """TRL's vLLM client called by one process for contexts it already holds (every process's): no collective, so
    it can run on the worker thread of overlapped generation (``max_staleness``;
    trainer/server/overlapped_generation.py), which plays every process's episodes on the main process and hands
    each rank its rows when the batch trains. Each turn's request is the one :class:`VLLMServerBackend` sends for
    the same live episodes."""

    def generate(
        self, contexts: list[list[int]], max_new_tokens: int, temperature: float, stop_ids: Sequence[int]
    ) -> list[Sample]:
        """One request for ``contexts``; a sample each."""
        if not contexts:
            return []
        ids, logprobs = server_request(self.trainer, contexts, max_new_tokens, temperature, stop_ids)
        return [Sample(list(i), list(lp)) for i, lp in zip(ids, logprobs)]


def server_request(t: Any, contexts: list[list[int]], max_new_tokens: int, temperature: float,
                   stop_ids: Sequence[int]) -> tuple[list[list[int]], list[list[float]]]:
    """One completion per context from the vLLM server with TRL's sampling settings (the main process's call):
    (sampled ids, their log-probs)."""
    extra = dict(t.args.generation_kwargs or {})
    extra["stop_token_ids"] = list(stop_ids)
    out = trl_contact.vllm_client(t).generate(
        prompts=contexts, n=1, repetition_penalty=t.repetition_penalty, temperature=temperature,
        top_p=t.top_p, top_k=t.top_k, min_p=t.min_p or 0.0, max_tokens=max_new_tokens, logprobs=0,
        generation_kwargs=extra,
    )
    return out["completion_ids"], [[lp[0] for lp in row] for row in out["logprobs"]]


@dataclass
class _Row:
    """One episode's tokens as they are built."""

    prompt: list[int]
    completion: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_spans: list[list[int]] = field(default_factory=list)
    truncated: bool = False

    def append(self, ids: list[int], model: bool, logprobs: list[float] | None = None) -> None:
        self.completion += ids
        self.env_mask += [int(model)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def cut_at_stop(sample: Sample, stop_ids: set[int], limit: int) -> Sample:
    """The sampled ids up to and including the first stop token, at most ``limit`` of them."""
    ids = sample.ids[:limit]
    for k, token in enumerate(ids):
        if token in stop_ids:
            ids = ids[: k + 1]
            break
    return Sample(ids, None if sample.logprobs is None else sample.logprobs[: len(ids)])


class MultiTurnRollout:
    """The ``rollout_func`` of the environment tasks (see the module docstring)."""

    def __init__(self, env: str, env_kwargs: dict | None, settings: EpisodeSettings, turn_max_tokens: int,
                 eval_temperature: float, chat: ChatTokens, prefill: str = ""):
        self.env, self.env_kwargs = env, dict(env_kwargs or {})
        make_env(env, **self.env_kwargs)  # fail now on unknown constructor arguments, not at the first batch
        self.settings, self.turn_max_tokens, self.eval_temperature, self.chat = (settings, turn_max_tokens,
                                                                                 eval_temperature, chat)
        self.prefill = prefill
        self.prefill_ids = chat.encode(prefill) if prefill else []
        self.backend: LocalBackend | VLLMServerBackend | None = None
        self._ahead: MultiTurnRollout | None = None  # play_ahead's copy, with a tokenizer of its own

    @staticmethod
    def returns_logprobs(args: Any) -> bool:
        """Whether the sampled tokens come back with their log-probs: only from the vLLM server backend
        (``model.generate`` returns none), so ``old_logps_source: sampler`` is checked against this before load."""
        return bool(args.use_vllm) and args.vllm_mode == "server"

    def _backend(self, trainer: Any):
        if self.backend is None:
            if not trainer.use_vllm:
                self.backend = LocalBackend(trainer)
            elif trainer.vllm_mode == "server":
                self.backend = VLLMServerBackend(trainer)
            else:
                raise ConfigError("vllm_mode", f"{trainer.vllm_mode!r} is not supported by the multi-turn rollout",
                                  "use vllm_mode: server, or use_vllm: false for local generation")
            if trainer.max_completion_length < self.turn_max_tokens:
                raise ConfigError(
                    "max_completion_length",
                    f"{trainer.max_completion_length} is shorter than one turn "
                    f"(turn_max_tokens={self.turn_max_tokens})",
                    "raise it to hold every turn of an episode",
                )
        return self.backend

    def __call__(self, prompts: list, trainer: Any) -> dict[str, Any]:
        """Play one episode per prompt; return TRL's rollout dict (ids, log-probs, env_mask, extras). While training
        with ``max_staleness`` > 0, the episodes of this batch played ahead (every process's, on the main process)
        from the weights of exactly ``s`` batches ago."""
        backend = self._backend(trainer)
        training = trainer.model.training
        overlap = trainer.hook("overlap") if training else None
        if overlap is not None:
            return overlap.rollout(trainer, prompts, lambda every: self.play_ahead(trainer, every),
                                   lambda local: self._finish(trainer, local))
        temperature = trainer.temperature if training else self.eval_temperature
        episodes, rows = self._play(prompts, trainer, backend, temperature)
        self._log(trainer, self._stats(episodes, rows), "train" if training else "eval")
        return self._output(episodes, rows, isinstance(backend, VLLMServerBackend))

    def play_ahead(self, trainer: Any, prompts: list) -> dict[str, Any]:
        """Every process's episodes of a generation batch, played by the main process on the worker of overlapped
        generation (no collective): the rollout dict of all rows, with each row's logged statistics. The worker
        plays with its own copy of the chat tokens: a fast tokenizer is not safe to share between threads (each
        encode resets its padding and truncation state, which the trainer's thread may be using)."""
        if self._ahead is None:
            self._ahead = MultiTurnRollout(self.env, self.env_kwargs, self.settings, self.turn_max_tokens,
                                           self.eval_temperature, copy.deepcopy(self.chat), prefill=self.prefill)
        return self._ahead.play_all(trainer, prompts)

    def play_all(self, trainer: Any, prompts: list) -> dict[str, Any]:
        """:meth:`play_ahead`'s episodes, played with this rollout's own chat tokens through the server, by the
        calling process alone (no collective)."""
        episodes, rows = self._play(prompts, trainer, DirectServerBackend(trainer), trainer.temperature)
        return {**self._output(episodes, rows, True), "_env_stats": self._stats(episodes, rows)}

    def _finish(self, trainer: Any, local: dict[str, Any]) -> dict[str, Any]:
        """This rank's rows of :meth:`play_ahead`'s dict, when the batch trains: log them (collective), return TRL's
        rollout dict."""
        local = dict(local)
        self._log(trainer, local.pop("_env_stats"), "train")
        return local

    def _play(self, prompts: list, trainer: Any, backend: Any, temperature: float) -> tuple[list[Episode], list]:
        """Play one episode per prompt with ``backend``: the episodes and their token rows."""
        episodes = []
        for prompt in prompts:
            name, seed = parse_level_prompt(prompt)
            if name != self.env:
                raise ValueError(f"a {name!r} level reached the {self.env!r} rollout; one environment per run")
            episodes.append(Episode(make_env(self.env, **self.env_kwargs), seed, self.settings))
        rows = [_Row(self.chat.prompt_ids(ep.first_messages()) + self.prefill_ids) for ep in episodes]
        stop_ids = sorted(set(trainer.eos_token_ids) | {self.chat.turn_end_id})
        budget = trainer.max_completion_length
        with backend.session() as generator:
            for _ in range(self.settings.max_turns):  # every rank runs every turn: the server backend is collective
                live = [i for i, (ep, row) in enumerate(zip(episodes, rows)) if not ep.done and not row.truncated]
                samples = generator.generate([rows[i].prompt + rows[i].completion for i in live],
                                             self.turn_max_tokens, temperature, stop_ids)
                for i, sample in zip(live, samples):
                    self._play_turn(
                        episodes[i], rows[i], cut_at_stop(sample, set(stop_ids), self.turn_max_tokens), budget
                    )
        for row in rows:  # an episode over before its first turn (a level that starts solved) still needs a token
            if not row.completion:
                row.append([self.chat.turn_end_id], model=False)
        return episodes, rows

    def _output(self, episodes: list[Episode], rows: list, with_logprobs: bool) -> dict[str, Any]:
        """TRL's rollout dict of played episodes."""
        return {
            "prompt_ids": [r.prompt for r in rows],
            "completion_ids": [r.completion for r in rows],
            "logprobs": [r.logprobs for r in rows] if with_logprobs else None,
            "env_mask": [r.env_mask for r in rows],
            **self._extras(episodes, rows),
        }

    def _play_turn(self, episode: Episode, row: _Row, sample: Sample, budget: int) -> None:
        """Record the sampled turn, step the environment, and append its reply if the episode goes on."""
        start = len(row.completion)
        row.append(sample.ids, model=True, logprobs=sample.logprobs)
        row.turn_spans.append([start, len(row.completion)])
        # Decoded with special tokens kept (the parser drops <|...|> markers itself), so a tokenizer that marks its
        # think tags special does not lose them.
        text = self.chat.tokenizer.decode(sample.ids, skip_special_tokens=False)
        episode.play(self.prefill + text)
        if episode.done:
            return
        closing = [] if sample.ids and sample.ids[-1] == self.chat.turn_end_id else [self.chat.turn_end_id]
        reply = closing + self.chat.user_turn_ids(episode.next_user_message()) + self.prefill_ids
        if len(row.completion) + len(reply) + self.turn_max_tokens > budget:
            row.truncated = True  # the next turn would not fit max_completion_length: the episode ends here
            return
        row.append(reply, model=False)

    @staticmethod
    def _extras(episodes: list[Episode], rows: list[_Row]) -> dict[str, list]:
        summaries = [ep.summary() for ep in episodes]
        extras = {key: [s[key] for s in summaries] for key in summaries[0]} if summaries else {}
        extras["truncated"] = [r.truncated for r in rows]
        extras["turn_spans"] = [r.turn_spans for r in rows]
        extras["env_seed"] = [ep.seed for ep in episodes]
        return extras

    @staticmethod
    def _stats(episodes: list[Episode], rows: list[_Row]) -> list[list[float]]:
        """Each episode's logged numbers (:meth:`_log`'s columns)."""
        return [[ep.episode_return, float(ep.success), len(ep.turns), sum(t.executed for t in ep.turns),
                 sum(t.penalty != 0 for t in ep.turns) / max(len(ep.turns), 1), float(r.truncated),
                 float(sum(r.env_mask)), float(len(r.env_mask) - sum(r.env_mask))] for ep, r in zip(episodes, rows)]

    @staticmethod
    def _log(trainer: Any, stats: list[list[float]], mode: str) -> None:
        """Batch means over every process (collective), and pass@G: the share of prompt groups with at least one
        solved episode (RAGEN's ``pass@{group_size}``, es_manager.py:349-360; rows of a group are contiguous in
        the gathered batch, as TRL orders them)."""
        local = torch.tensor(stats, dtype=torch.float64, device=trainer.accelerator.device).reshape(-1, 8)
        every = trainer.accelerator.gather(local)
        names = ("return", "success_rate", "turns", "actions", "penalised_turn_fraction", "truncated_fraction",
                 "model_tokens", "env_tokens")
        for name, value in zip(names, every.mean(dim=0).tolist()):
            trl_contact.metrics(trainer, mode)[f"env/{name}"].append(value)
        group = trainer.num_generations if mode == "train" else (trainer.num_generations_eval or 1)
        if every.shape[0] and every.shape[0] % group == 0:
            solved = every[:, 1].reshape(-1, group).amax(dim=1)
            trl_contact.metrics(trainer, mode)[f"env/pass@{group}"].append(float(solved.mean()))
