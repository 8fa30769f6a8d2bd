"""Evaluation runs: systems x benchmarks -> per-sample JSONL (resumable) -> summary, table, plots.

Layout of ``output_dir``::

    <system>/config.json     what produced the results (a rerun with another config refuses to mix them)
    <system>/results.jsonl   one record per (benchmark, question, sample); see trainer/eval/metrics.py
    summary.json             metrics per system and benchmark (Mean@k, pass@k, entropy, length, W split)
    table.md                 the papers' layout: one row per system, one column per benchmark, Avg.
    benchmarks.png           per-benchmark bars

Resume: a question's k records are written with one ``write`` + flush + fsync, after it is generated and
graded. On start, complete questions are kept, a question cut short by a kill (a partial last line or fewer
than k records) is dropped and redone; nothing complete is generated again.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainer.config.redaction import redact
from trainer.eval.benchmarks import EvalItem, load_benchmark
from trainer.eval.generation import (
    Decoding,
    Generator,
    LocalGenerator,
    OracleGenerator,
    Question,
    ServerGenerator,
    VLLMEngineGenerator,
    chat_prompt_ids,
    token_entropy,
)
from trainer.eval.grading import extract_final_answer, grade
from trainer.eval.metrics import dispersion_split, summarize
from trainer.eval.prompts import PROMPT_PRESETS, prompt_messages
from trainer.eval.report import markdown_table, plot_benchmarks
from trainer.tools import optional

logger = logging.getLogger(__name__)

BACKENDS = ("local", "vllm", "server", "oracle_gold", "oracle_shuffled")


@dataclass
class BenchmarkSpec:
    """One benchmark of a run: its name, samples per question (k) and loader options."""

    name: str
    k: int = 1
    num_samples: int | None = None
    path: str | None = None
    split: str | None = None
    config: str | None = None


@dataclass
class SystemSpec:
    """One evaluated system: a model through a backend, or an oracle control."""

    name: str
    model: str | None = None
    backend: str = "local"
    base_url: str | None = None  # backend "server"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"system {self.name!r}: backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend in ("local", "vllm", "server") and not self.model:
            raise ValueError(f"system {self.name!r}: backend {self.backend!r} needs `model`")
        if self.backend == "server" and not self.base_url:
            raise ValueError(f"system {self.name!r}: backend 'server' needs `base_url` (e.g. http://127.0.0.1:8000)")


@dataclass
class EvalConfig:
    """A whole evaluation: systems, benchmarks, decoding, where results go."""

    output_dir: str
    systems: list[SystemSpec]
    benchmarks: list[BenchmarkSpec]
    decoding: Decoding = field(default_factory=Decoding)
    entropy: bool = True  # token-mean actor entropy (one extra forward per response; local backend only)
    # the temperature the entropy's softmax divides the logits by: a number (1.0 = the raw model distribution), or
    # "decoding" = decoding.temperature (1 when greedy), what the GRPODropout authors measure
    # (hexuandeng/GRPODropout@4ad3b3b:eval/utils/entropy.py:62-63, called with the sampling temperature)
    entropy_temperature: float | str = 1.0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    grade_timeout: float = 5.0
    dispersion_threshold: int = 8  # W split: questions every system answers correctly >= / < this many times
    dispersion_systems: list[str] | None = None  # systems that define the W split (default: all; leave controls out)
    question_batch: int = 64  # questions per vLLM engine call (it batches them); other backends go one by one
    prompt: str = "default"  # prompt preset (trainer/eval/prompts.py): "default" or a paper's, e.g. "grpodropout"
    # record each response's generated token ids (``completion_ids``): the alpha audit's teacher scoring
    # (launch/score_teacher.py) scores them exactly; off by default (8k-token responses make results files large)
    token_ids: bool = False

    def __post_init__(self) -> None:
        if self.prompt not in PROMPT_PRESETS:
            raise ValueError(f"prompt: unknown preset {self.prompt!r}; use one of {sorted(PROMPT_PRESETS)}")
        t = self.entropy_temperature
        if not (t == "decoding" or (isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0)):
            raise ValueError(f"entropy_temperature: {t!r} is neither a number > 0 nor 'decoding'; use 1.0 (the raw "
                             "model distribution) or 'decoding' (the sampling temperature, the GRPODropout authors')")

    @property
    def entropy_temp(self) -> float:
        """The temperature the recorded entropies are measured at (``entropy_temperature`` resolved)."""
        if self.entropy_temperature == "decoding":
            return self.decoding.temperature if self.decoding.temperature > 0 else 1.0
        return float(self.entropy_temperature)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalConfig":
        """Build from a YAML mapping: ``benchmarks`` is a mapping name -> options (or a list of names)."""
        d = dict(d)
        unknown = set(d) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise ValueError(f"unknown eval config keys {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        benches = d.pop("benchmarks")
        if isinstance(benches, list):
            benches = {name: {} for name in benches}
        return cls(
            systems=[SystemSpec(**s) for s in d.pop("systems")],
            benchmarks=[BenchmarkSpec(name=name, **(opts or {})) for name, opts in benches.items()],
            decoding=Decoding(**d.pop("decoding", {})),
            **d,
        )


def run(config: EvalConfig) -> dict[str, Any]:
    """Evaluate every system on every benchmark (resuming what is done) and write the summary and reports."""
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = {b.name: load_benchmark(b.name, path=b.path, split=b.split, config=b.config, num_samples=b.num_samples,
                                    seed=config.decoding.seed) for b in config.benchmarks}
    records: list[dict[str, Any]] = []
    for system in config.systems:
        records += evaluate_system(config, system, items)
    summary = summarize(records)
    systems = config.dispersion_systems or [s.name for s in config.systems]
    summary["dispersion_W"] = {b.name: dispersion_split([r for r in records if r["benchmark"] == b.name], systems,
                                                         threshold=config.dispersion_threshold)
                               for b in config.benchmarks}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "table.md").write_text(markdown_table(summary, benchmarks=[b.name for b in config.benchmarks]))
    if optional.installed("matplotlib"):  # the table and summary are the results; the plot is the `demo` extra's
        plot_benchmarks(summary, out / "benchmarks.png")
    else:
        logger.warning("benchmarks.png not drawn: %s", optional.missing_message("matplotlib", "the plot"))
    return summary


def evaluate_system(config: EvalConfig, system: SystemSpec, items: dict[str, list[EvalItem]]) -> list[dict]:
    """All records of one system, generating only the questions its results file does not hold yet."""
    folder = Path(config.output_dir) / system.name
    config_file = folder / "config.json"
    _check_config(config_file, config, system)
    results = folder / "results.jsonl"
    ks = {b.name: b.k for b in config.benchmarks}
    done = _load_complete(results, ks)
    todo = [(b, item) for b, lst in items.items() for item in lst if (b, item.id) not in done]
    logger.info("system %s: %d questions done, %d to generate", system.name, sum(1 for _ in done), len(todo))
    generator = model = tokenizer = None
    if todo:
        generator, model, tokenizer = _build_generator(config, system, items)
    # Recorded only now that the backend and its model loaded: a typo in a model path leaves no config.json
    # that would make the corrected re-run refuse the folder.
    folder.mkdir(parents=True, exist_ok=True)
    if not config_file.exists():
        config_file.write_text(json.dumps(_config_record(config, system), indent=2))
    if todo:
        # Only the vLLM engine gains from batching questions; elsewhere one question per call means a kill
        # loses at most the question in flight.
        batch = config.question_batch if system.backend == "vllm" else 1
        with open(results, "a") as fh:
            for start in range(0, len(todo), batch):
                chunk = todo[start : start + batch]
                by_k: dict[int, list[tuple[str, EvalItem]]] = {}
                for b, item in chunk:
                    by_k.setdefault(ks[b], []).append((b, item))
                for k, group in by_k.items():
                    questions = [_question(item, config) for _, item in group]
                    completions = generator.generate(questions, k)
                    for (b, item), q, samples in zip(group, questions, completions):
                        lines = _records(config, system, item, q, samples, model, tokenizer)
                        fh.write("".join(json.dumps(r) + "\n" for r in lines))
                        fh.flush()
                        os.fsync(fh.fileno())
                        done[(b, item.id)] = lines
    return [r for lines in done.values() for r in lines]


def _records(config, system, item: EvalItem, q: Question, samples, model, tokenizer) -> list[dict[str, Any]]:
    scores = grade([(item, c.text) for c in samples], timeout=config.grade_timeout)
    prompt_ids = None
    out = []
    for i, (c, score) in enumerate(zip(samples, scores)):
        record = {"system": system.name, "benchmark": item.benchmark, "id": item.id, "sample": i,
                  "correct": float(score), "answer": extract_final_answer(item, c.text), "length": len(c.token_ids),
                  "truncated": bool(c.truncated), "completion": c.text}
        if config.token_ids and c.token_ids:  # a server backend returns text: its ids are the text re-encoded
            record["completion_ids"] = list(c.token_ids)
        if config.entropy and model is not None:
            if prompt_ids is None:
                prompt_ids = chat_prompt_ids(tokenizer, q.messages, config.chat_template_kwargs)
            record["entropy_sum"], record["entropy_tokens"] = token_entropy(model, prompt_ids, c.token_ids,
                                                                            config.entropy_temp)
        out.append(record)
    return out


def _question(item: EvalItem, config: EvalConfig) -> Question:
    return Question(item.benchmark, item.id, prompt_messages(item, config.prompt), item.gold, item.kind)


def _build_generator(
    config: EvalConfig, system: SystemSpec, items: dict[str, list[EvalItem]]
) -> tuple[Generator, Any, Any]:
    """The system's backend, and the local model/tokenizer when entropies are computed here."""
    if system.backend.startswith("oracle"):
        all_questions = [_question(item, config) for lst in items.values() for item in lst]
        return OracleGenerator(system.backend.removeprefix("oracle_"), all_questions, config.decoding.seed), None, None
    # heavy: transformers; an eval of oracle systems needs none of it
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.config.model_path import resolve_model_path

    path = resolve_model_path(system.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    needs_model = system.backend == "local" or config.entropy
    model = AutoModelForCausalLM.from_pretrained(path, dtype=system.dtype).eval() if needs_model else None
    if system.backend == "local":
        return LocalGenerator(model, tokenizer, config.decoding, config.chat_template_kwargs), model, tokenizer
    if system.backend == "server":
        gen = ServerGenerator(system.base_url, system.model, tokenizer, config.decoding,
                              chat_template_kwargs=config.chat_template_kwargs)
        return gen, model, tokenizer

    return VLLMEngineGenerator(path, config.decoding, config.chat_template_kwargs), model, tokenizer


def _config_record(config: EvalConfig, system: SystemSpec) -> dict[str, Any]:
    """What ``<system>/config.json`` records: everything that changes a system's results (secrets redacted:
    trainer/config/redaction.py, e.g. the user-info of a server's ``base_url``)."""
    return redact({"system": asdict(system), "decoding": asdict(config.decoding), "entropy": config.entropy,
                   "chat_template_kwargs": config.chat_template_kwargs,
                   "benchmarks": [asdict(b) for b in config.benchmarks],
                   # only when not the default, so result folders written before presets existed still resume
                   **({"prompt": config.prompt} if config.prompt != "default" else {}),
                   **({"entropy_temperature": config.entropy_temperature}
                      if config.entropy_temperature != 1.0 else {}),
                   **({"token_ids": True} if config.token_ids else {})})


def _check_config(path: Path, config: EvalConfig, system: SystemSpec) -> None:
    """Refuse to append results produced under another configuration to an existing results file."""
    if path.exists() and json.loads(path.read_text()) != _config_record(config, system):
        raise ValueError(f"{path.parent} holds results of another configuration ({path}); use another "
                         "output_dir or delete that folder to start over")


def _load_complete(results: Path, ks: dict[str, int]) -> dict[tuple[str, str], list[dict]]:
    """Complete questions of a results file; rewrites the file without partial ones (a kill mid-write)."""
    if not results.exists():
        return {}
    groups: dict[tuple[str, str], list[dict]] = {}
    for line in results.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the torn last line of a killed run
        groups.setdefault((record["benchmark"], record["id"]), []).append(record)
    complete = {key: sorted(rs, key=lambda r: r["sample"]) for key, rs in groups.items()
                if key[0] in ks and sorted(r["sample"] for r in rs) == list(range(ks[key[0]]))}
    tmp = results.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for rs in complete.values() for r in rs))
    os.replace(tmp, results)
    return complete
