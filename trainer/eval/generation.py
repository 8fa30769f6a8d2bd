"""Generation backends of the evaluation harness: local ``generate``, the vLLM engine, a vLLM server, and
the oracle control systems -- all behind one call, ``generate(questions, k) -> k completions each``.

Reproducibility and resume: every question is sampled with its own seed, derived from the preset seed and
the question's (benchmark, id) -- so what a question gets does not depend on which other questions are
generated in the same call, and an evaluation killed half-way and rerun produces exactly the samples an
uninterrupted run would have (local backend: one ``generate`` call per question, no padding; vLLM:
per-request seeds).
"""

from __future__ import annotations

import hashlib
import json
import random
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class Decoding:
    """Sampling settings (a paper's preset or the user's)."""

    max_tokens: int = 8192
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20  # 0 = off
    seed: int = 0


@dataclass
class Completion:
    """One sampled response: its text, its token ids (the model's own, when the backend has them), and
    whether it stopped at ``max_tokens``."""

    text: str
    token_ids: list[int]
    truncated: bool


@dataclass(frozen=True)
class Question:
    """What a backend needs of an evaluation item: a stable key, the chat messages, the gold answer (the
    oracle controls use it) and its benchmark (for shuffling golds within one benchmark)."""

    benchmark: str
    id: str
    messages: list[dict[str, str]]
    gold: str
    kind: str


class Generator(Protocol):
    def generate(self, questions: list[Question], k: int) -> list[list[Completion]]: ...


def question_seed(seed: int, benchmark: str, qid: str) -> int:
    """A 63-bit seed for one question, stable across processes and runs (sha256, not ``hash()``)."""
    digest = hashlib.sha256(f"{seed}|{benchmark}|{qid}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]], chat_template_kwargs: dict) -> list[int]:
    """The chat-templated prompt's token ids, generation prompt appended: what every backend feeds the model."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False,
                                         **chat_template_kwargs)


class LocalGenerator:
    """transformers ``generate`` on a local model (CPU or one GPU), one question (k samples) per call."""

    def __init__(self, model: Any, tokenizer: Any, decoding: Decoding, chat_template_kwargs: dict | None = None):
        self.model, self.tokenizer, self.decoding = model, tokenizer, decoding
        self.chat_template_kwargs = chat_template_kwargs or {}

    def generate(self, questions: list[Question], k: int) -> list[list[Completion]]:
        d = self.decoding
        out = []
        for q in questions:
            ids = torch.tensor([chat_prompt_ids(self.tokenizer, q.messages, self.chat_template_kwargs)],
                               device=self.model.device)
            torch.manual_seed(question_seed(d.seed, q.benchmark, q.id))
            with torch.no_grad():
                seqs = self.model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=d.temperature > 0,
                    temperature=d.temperature if d.temperature > 0 else None,
                    top_p=d.top_p if d.temperature > 0 else None,
                    top_k=(d.top_k or None) if d.temperature > 0 else None,
                    max_new_tokens=d.max_tokens,
                    num_return_sequences=k,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
            out.append([self._completion(row[ids.shape[1]:].tolist()) for row in seqs])
        return out

    def _completion(self, tokens: list[int]) -> Completion:
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        end = next((i for i, t in enumerate(tokens) if t in eos), None)
        if end is not None:
            tokens = tokens[: end + 1]  # keep the eos it stopped on; drop the padding after it
        truncated = end is None and len(tokens) >= self.decoding.max_tokens
        return Completion(self.tokenizer.decode(tokens, skip_special_tokens=True), tokens, truncated)


class VLLMEngineGenerator:
    """vLLM's offline engine (GPU): all questions in one call, a per-request seed for each question."""

    def __init__(self, model: str, decoding: Decoding, chat_template_kwargs: dict | None = None, **engine_kwargs: Any):
        from vllm import LLM  # optional: vLLM, a GPU extra (`vllm`)

        self.llm = LLM(model=model, seed=decoding.seed, **engine_kwargs)
        self.decoding = decoding
        self.chat_template_kwargs = chat_template_kwargs or {}

    def generate(self, questions: list[Question], k: int) -> list[list[Completion]]:
        from vllm import SamplingParams  # optional: as above

        d = self.decoding
        tok = self.llm.get_tokenizer()
        prompts = [
            {"prompt_token_ids": chat_prompt_ids(tok, q.messages, self.chat_template_kwargs)}
            for q in questions
        ]
        params = [
            SamplingParams(n=k, temperature=d.temperature, top_p=d.top_p, top_k=d.top_k or -1, max_tokens=d.max_tokens,
                           seed=question_seed(d.seed, q.benchmark, q.id))
            for q in questions
        ]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            [Completion(o.text, list(o.token_ids), o.finish_reason == "length") for o in r.outputs] for r in results
        ]


class ServerGenerator:
    """A running OpenAI-compatible server (``vllm serve MODEL``): ``/v1/completions`` with the chat template
    applied here, so the prompt is exactly what the local tokenizer renders. Token ids are not part of that
    API; lengths are counted by re-encoding the text with the same tokenizer."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, decoding: Decoding, timeout: float = 600.0,
                 chat_template_kwargs: dict | None = None):
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model, self.tokenizer, self.decoding, self.timeout = model, tokenizer, decoding, timeout
        self.chat_template_kwargs = chat_template_kwargs or {}

    def generate(self, questions: list[Question], k: int) -> list[list[Completion]]:
        d = self.decoding
        out = []
        for q in questions:
            prompt = self.tokenizer.apply_chat_template(q.messages, add_generation_prompt=True, tokenize=False,
                                                        **self.chat_template_kwargs)
            body = {"model": self.model, "prompt": prompt, "n": k, "max_tokens": d.max_tokens,
                    "temperature": d.temperature, "top_p": d.top_p, "top_k": d.top_k or -1,
                    "seed": question_seed(d.seed, q.benchmark, q.id)}
            request = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    choices = sorted(json.load(response)["choices"], key=lambda c: c.get("index", 0))
            except OSError as err:
                raise ConnectionError(f"generation server {self.url} failed for {q.benchmark}/{q.id}: {err}. "
                                      "Is `vllm serve` running there with this model?") from err
            out.append([
                Completion(c["text"], self.tokenizer.encode(c["text"], add_special_tokens=False),
                           c.get("finish_reason") == "length")
                for c in choices
            ])
        return out


class OracleGenerator:
    """Control systems that prove the pipeline: ``gold`` answers every question with its gold answer
    (scores ~100 %); ``shuffled`` with the gold of another question of the same benchmark (a seeded
    derangement; scores ~0 % unless two questions share an answer)."""

    def __init__(self, mode: str, all_questions: list[Question], seed: int = 0):
        if mode not in ("gold", "shuffled"):
            raise ValueError(f"oracle mode must be 'gold' or 'shuffled', got {mode!r}")
        self.mode = mode
        self.answer: dict[tuple[str, str], str] = {}
        by_benchmark: dict[str, list[Question]] = {}
        for q in all_questions:
            by_benchmark.setdefault(q.benchmark, []).append(q)
        for name, qs in by_benchmark.items():
            golds = [q.gold for q in qs]
            if mode == "shuffled" and len(qs) > 1:
                rng = random.Random(f"{seed}|{name}")
                shift = rng.randrange(1, len(qs))  # a rotation by a non-zero shift: no question keeps its own
                golds = golds[shift:] + golds[:shift]
            self.answer.update({(q.benchmark, q.id): g for q, g in zip(qs, golds)})

    def generate(self, questions: list[Question], k: int) -> list[list[Completion]]:
        out = []
        for q in questions:
            a = self.answer[(q.benchmark, q.id)]
            text = f"Answer: {a}" if q.kind == "choice" else f"The final answer is \\boxed{{{a}}}."
            out.append([Completion(text, [], False) for _ in range(k)])
        return out


def token_entropy(
    model: Any, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0
) -> tuple[float, int]:
    """Actor entropy over the response's valid tokens of softmax(logits / ``temperature``), summed, and the token
    count (the paper's token-mean entropy is Σ sums / Σ counts). ``temperature`` 1 is the raw model distribution;
    the GRPODropout authors' evaluation divides by the sampling temperature (hexuandeng/GRPODropout@4ad3b3b:
    eval/utils/entropy.py:62-63). One no-grad forward; the full-vocabulary entropy is computed in float32
    position by position in chunks so a 152k vocabulary does not need a (T, V) float64 copy."""
    if not temperature > 0:
        raise ValueError(f"token_entropy: temperature must be > 0, got {temperature}")
    if not completion_ids:
        return 0.0, 0
    ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    total = 0.0
    for chunk in logits.split(256):
        logp = (chunk.float() / temperature).log_softmax(-1)
        total += float(-(logp.exp() * logp).sum())
    return total, len(completion_ids)
