"""The teacher-scoring pass of UECR-GRPO's fixed-rollout alpha audit (paper App. F.4): a ``teacher_score`` for
every response an evaluation run generated.

F.4 scores each held-out response against the checkpoint that generated it ("pi_old,i is the checkpoint that
generated each response"), with the frozen teacher, responses truncated at 8,192 tokens:

    teacher_score_i = (1/L_i) sum_t [log pi_T(y_t | x, y_<t) - log pi_ckpt(y_t | x, y_<t)]   at T = 1,

the PUU teacher score R^T of training (§B, trainer/algorithms/uecr.py ``token_gap`` / ``teacher_score``), with
both log-probs from the trainer's own scorer (trainer/methods/uecr/teacher.py ``score_tokens``: float32 head, the
model's logit scale and softcap). Nothing here computes a log-prob itself.

Input: an evaluation folder of launch/eval.py, ``<eval_dir>/<system>/{config.json, results.jsonl}``; one
system = one checkpoint. The prompt is rebuilt exactly as the evaluation built it (same benchmark rows, prompt
preset and chat-template arguments, read from ``config.json``); the response is the generated token ids the
runner records with ``token_ids: true`` (``completion_ids``), else its text re-encoded (with a warning: a
re-encoding can differ from the generated tokens).
A response with no token takes the mean score of its question's scored responses (as training does for a
rollout without loss tokens), so it moves neither the group's mean nor its range.

Output: ``<eval_dir>/<system>/teacher_scores.jsonl`` (every results record plus ``teacher_score``,
``teacher_tokens`` and the teacher and token cap used), written once a system is complete; a rerun with the
same teacher and cap skips finished systems.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from trainer.algorithms.uecr import teacher_score, token_gap
from trainer.config.model_path import resolve_model_path
from trainer.eval.benchmarks import load_benchmark
from trainer.eval.generation import Decoding, chat_prompt_ids
from trainer.eval.runner import BenchmarkSpec, EvalConfig, SystemSpec, _question
from trainer.methods.uecr.teacher import check_vocabulary, score_tokens

logger = logging.getLogger(__name__)

F4_MAX_TOKENS = 8192  # App. F.4: "long responses are truncated at 8,192 tokens"
SCORES_FILE = "teacher_scores.jsonl"


@torch.no_grad()
def group_scores(
    teacher: Any,
    checkpoint: Any,
    prompt_ids: Sequence[int],
    completions: Sequence[Sequence[int]],
    *,
    pad_token_id: int = 0,
    micro_batch_size: int = 4,
    chunk_tokens: int = 512,
    micro_batch_tokens: int | None = None,
) -> tuple[list[float], list[int]]:
    """Teacher scores and scored-token counts of one question's responses (all share ``prompt_ids``):
    prompt + response rows, right-padded, scored by both models in one :func:`score_tokens` call each
    (``micro_batch_size`` rows per forward, each forward trimmed to its longest response, or with
    ``micro_batch_tokens`` length-sorted forwards of at most that many tokens)."""
    device = next(checkpoint.parameters()).device
    L = max(1, max((len(c) for c in completions), default=0))
    P = len(prompt_ids)
    ids = torch.full((len(completions), P + L), pad_token_id, dtype=torch.long, device=device)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(completions), L), dtype=torch.float32, device=device)
    for n, c in enumerate(completions):
        ids[n, :P] = torch.as_tensor(list(prompt_ids), device=device)
        ids[n, P : P + len(c)] = torch.as_tensor(list(c), dtype=torch.long, device=device)
        attention[n, : P + len(c)] = 1
        mask[n, : len(c)] = 1
    common = dict(micro_batch_size=micro_batch_size, chunk_tokens=chunk_tokens, token_budget=micro_batch_tokens)
    t = score_tokens(teacher, ids, attention, L, **common)["logps"][0]
    s = score_tokens(checkpoint, ids, attention, L, **common)["logps"][0]
    scores = teacher_score(token_gap(t, s, mask), mask).double()
    counts = mask.sum(1).long()
    valid = counts > 0
    if valid.any() and not valid.all():  # no evidence: the group's mean over scored responses (see module doc)
        scores = torch.where(valid, scores, scores[valid].mean())
    return scores.tolist(), counts.tolist()


def _system_config(folder: Path) -> EvalConfig:
    """The evaluation config of one system folder, from its ``config.json`` (runner._config_record)."""
    path = folder / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{folder}: no config.json; teacher scoring reads launch/eval.py output folders")
    rec = json.loads(path.read_text())
    return EvalConfig(output_dir=str(folder.parent), systems=[SystemSpec(**rec["system"])],
                      benchmarks=[BenchmarkSpec(**b) for b in rec["benchmarks"]], decoding=Decoding(**rec["decoding"]),
                      entropy=rec["entropy"], chat_template_kwargs=rec["chat_template_kwargs"],
                      prompt=rec.get("prompt", "default"))


def load_scoring_model(path: str, dtype: str = "auto", device: str | None = None) -> Any:
    """A frozen model for scoring (eval mode, no grad) on ``device`` (default: cuda when available)."""
    path = resolve_model_path(path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")

    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto" if dtype == "auto" else getattr(torch, dtype))
    return model.to(device).eval().requires_grad_(False)


def check_system(
    folder: str | Path, teacher_path: str, checkpoint_path: str | None = None
) -> tuple[EvalConfig, str, Any]:
    """Before any weights load: the folder's eval config, its checkpoint path and tokenizer; refuses an oracle
    control (no model) and a teacher that reads other token ids
    (:func:`trainer.methods.uecr.teacher.check_vocabulary`)."""
    folder = Path(folder)
    cfg = _system_config(folder)
    system = cfg.systems[0]
    if system.backend.startswith("oracle"):
        raise ValueError(f"{folder.name}: an oracle control has no model to score against; leave it out (--systems)")
    ckpt_path = resolve_model_path(checkpoint_path or system.model)
    tokenizer = AutoTokenizer.from_pretrained(ckpt_path)
    teacher_path = resolve_model_path(teacher_path)
    check_vocabulary(tokenizer, teacher_path, AutoConfig.from_pretrained(teacher_path))
    return cfg, ckpt_path, tokenizer


def score_system(folder: str | Path, teacher_path: str, *, teacher: Any = None, checkpoint_path: str | None = None,
                 max_tokens: int = F4_MAX_TOKENS, dtype: str = "auto", device: str | None = None,
                 micro_batch_size: int = 4, chunk_tokens: int = 512,
                 micro_batch_tokens: int | None = None) -> list[dict[str, Any]]:
    """Score every response of one system folder and write ``teacher_scores.jsonl`` there; returns the records.
    ``teacher``: an already loaded teacher (scoring several checkpoints loads it once); ``checkpoint_path``
    overrides the model the folder's config names (a checkpoint folder that moved)."""
    folder = Path(folder)
    out = folder / SCORES_FILE
    results = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    stamp = {"teacher": teacher_path, "teacher_max_tokens": max_tokens}
    if out.exists():
        done = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        if len(done) == len(results) and all({k: r.get(k) for k in stamp} == stamp for r in done):
            logger.info("%s: already scored with %s", folder.name, teacher_path)
            return done
    cfg, ckpt_path, tokenizer = check_system(folder, teacher_path, checkpoint_path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if teacher is None:
        teacher = load_scoring_model(teacher_path, dtype, device)
    checkpoint = load_scoring_model(ckpt_path, dtype, device)
    specs = {b.name: b for b in cfg.benchmarks}
    items: dict[str, dict[str, Any]] = {}
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in results:
        groups[(r["benchmark"], r["id"])].append(r)
    scored, warned = [], False
    for (bench, qid), recs in groups.items():
        if bench not in items:
            b = specs[bench]
            items[bench] = {it.id: it for it in load_benchmark(b.name, path=b.path, split=b.split, config=b.config,
                                                               num_samples=b.num_samples, seed=cfg.decoding.seed)}
        prompt_ids = chat_prompt_ids(tokenizer, _question(items[bench][qid], cfg).messages, cfg.chat_template_kwargs)
        if any("completion_ids" not in r for r in recs) and not warned:
            warned = True
            logger.warning("%s: results without completion_ids (eval config token_ids: false): scoring the response "
                           "text re-encoded, which can differ from the generated tokens", folder.name)
        completions = [(r["completion_ids"] if "completion_ids" in r
                        else tokenizer.encode(r["completion"], add_special_tokens=False))[:max_tokens] for r in recs]
        scores, counts = group_scores(teacher, checkpoint, prompt_ids, completions,
                                      pad_token_id=tokenizer.pad_token_id or 0, micro_batch_size=micro_batch_size,
                                      chunk_tokens=chunk_tokens, micro_batch_tokens=micro_batch_tokens)
        scored += [{**r, "teacher_score": s, "teacher_tokens": n, **stamp} for r, s, n in zip(recs, scores, counts)]
    tmp = out.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in scored))
    os.replace(tmp, out)
    del checkpoint
    return scored
