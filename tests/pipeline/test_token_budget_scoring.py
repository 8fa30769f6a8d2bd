"""``micro_batch_tokens`` in the no-grad scoring passes outside TRL: teacher (and T=1 student) scoring and the
collapse detector's cross-scoring run in the token-budget chunks of the loss passes and give the same numbers.

Anchors: a plain Hugging Face forward of each row alone, unpadded, with its log-softmax written out here (outside the
code under test), and the row-micro-batch path these passes had before (``micro_batch_tokens: null``). Rows have
long-tailed completion lengths (1 .. 24 tokens) and left-padded prompts of different lengths, so chunks really
trim, and the planner must have made several chunks with fewer padded tokens than the row micro-batches.
"""

from __future__ import annotations

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity
from transformers import AutoModelForCausalLM

from trainer import WinnowConfig, WinnowGRPOTrainer
from trainer.methods.collapse import hook as collapse_detector
from trainer.methods.collapse.hook import BatchTraces, Trace
from trainer.methods.uecr.teacher import score_tokens
from trainer.tools.assets import make_tiny_qwen3

COMPLETION_LENGTHS = [1, 1, 2, 2, 3, 3, 4, 5, 7, 10, 16, 24]  # long tail: p50 ~3.5, max 24
PROMPT_LENGTHS = [3, 9, 5, 4, 12, 6, 3, 7, 5, 10, 4, 5]
T_MAX = 24
BUDGET = 48  # the longest rows (prompt + completion 20-29 tokens) fit once per chunk: several chunks
PAD = 151643  # Qwen3's <|endoftext|>, the tiny model's pad token


@pytest.fixture(scope="module")
def teacher_path() -> str:
    """A tiny Qwen3 of another size and seed than the student (as tests/methods/test_teacher.py)."""
    return str(make_tiny_qwen3(seed=7, hidden_size=32, intermediate_size=64))


def long_tailed_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt + completion ids, attention mask): prompts left-padded, completions right-padded (TRL's layout)."""
    g = torch.Generator().manual_seed(3)
    B, P = len(COMPLETION_LENGTHS), max(PROMPT_LENGTHS)
    ids = torch.full((B, P + T_MAX), PAD)
    mask = torch.zeros(B, P + T_MAX, dtype=torch.long)
    for r, (p, c) in enumerate(zip(PROMPT_LENGTHS, COMPLETION_LENGTHS)):
        ids[r, P - p:P + c] = torch.randint(100, 20000, (p + c,), generator=g)
        mask[r, P - p:P + c] = 1
    return ids, mask


def plain_scores(model, ids: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, one unpadded forward of its real tokens: log-prob of each completion token (from the state before
    it) at ``temperature`` and the full-vocabulary entropy there, in (B, T_MAX) with 0 on padding."""
    P = max(PROMPT_LENGTHS)
    logps, entropy = torch.zeros(len(ids), T_MAX), torch.zeros(len(ids), T_MAX)
    for r, (p, c) in enumerate(zip(PROMPT_LENGTHS, COMPLETION_LENGTHS)):
        row = ids[r, P - p:P + c][None]
        with torch.no_grad():
            logits = model(input_ids=row).logits[0, p - 1:p + c - 1].double() / temperature
        lsm = logits - logits.logsumexp(-1, keepdim=True)
        logps[r, :c] = lsm.gather(-1, row[0, p:, None]).squeeze(-1).float()
        entropy[r, :c] = (-(lsm.exp() * lsm).sum(-1)).float()
    return logps, entropy


def rel_err(got: torch.Tensor, want: torch.Tensor, where: torch.Tensor) -> float:
    """Largest deviation on ``where`` relative to the quantity's largest magnitude there."""
    return float((got - want)[where].abs().max()) / float(want[where].abs().max())


class TwoRanks:
    """An accelerator stand-in for the forward-count all-reduce: this rank is told the other ran ``extra`` more
    forwards, so the scorer must add that many filler forwards and discard them."""

    num_processes, process_index = 2, 0

    def __init__(self, extra: int):
        self.extra, self.device = extra, torch.device("cpu")

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        assert reduction == "max"
        return tensor + self.extra


def test_teacher_scores_with_a_token_budget_equal_row_batches_and_plain_forwards(teacher_path):
    model = AutoModelForCausalLM.from_pretrained(teacher_path).eval()
    ids, mask = long_tailed_rows()
    real = mask[:, -T_MAX:].bool()
    common = dict(temperatures=(1.0, 0.7), with_entropy=True, chunk_tokens=7)
    rows = score_tokens(model, ids, mask, T_MAX, micro_batch_size=4, **common)
    budget = score_tokens(model, ids, mask, T_MAX, token_budget=BUDGET, **common)
    plain_lp, plain_h = plain_scores(model, ids, 1.0)
    plain_lp07, _ = plain_scores(model, ids, 0.7)
    for got, row_batched, plain in ((budget["logps"][0], rows["logps"][0], plain_lp),
                                    (budget["logps"][1], rows["logps"][1], plain_lp07),
                                    (budget["entropy"], rows["entropy"], plain_h)):
        assert rel_err(got, plain, real) <= 1e-5
        assert rel_err(got, row_batched, real) <= 1e-5
    # the planner really chunked, and the chunks pay for less padding than the row micro-batches (themselves trimmed
    # to their own longest row: less than the batch's padded width, 12 x 36 = 432)
    assert budget["forwards"] >= 3 and budget["real"] == rows["real"] == int(mask.sum())
    assert budget["padded"] < 0.85 * rows["padded"] and rows["padded"] < 0.6 * ids.numel(), (
        budget["padded"], rows["padded"], ids.numel())

    # another rank with more chunks: this one runs filler forwards, its scores unchanged
    spread = score_tokens(model, ids, mask, T_MAX, token_budget=BUDGET, accelerator=TwoRanks(2), **common)
    assert spread["forwards"] == budget["forwards"] + 2
    for k in range(2):
        assert torch.equal(spread["logps"][k], budget["logps"][k])
    assert torch.equal(spread["entropy"], budget["entropy"])


def test_teacher_scoring_in_the_trainer_uses_the_budget(tiny_model, tmp_path, teacher_path):
    """The teacher scorer passes ``micro_batch_tokens``: the same teacher / student scores as the row micro-batches
    (``teacher_micro_batch_size``), fewer padded tokens logged."""
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "per_device_train_batch_size": 12,
                                                     "temperature": 0.7, "advantage": "uecr",
                                                     "teacher_model_name_or_path": teacher_path,
                                                     "teacher_micro_batch_size": 4, "micro_batch_tokens": BUDGET})
    tr = WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity], args=args,
                           train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
    ids, mask = long_tailed_rows()
    P = ids.size(1) - T_MAX
    output = {"prompt_ids": ids[:, :P], "prompt_mask": mask[:, :P], "completion_ids": ids[:, P:],
              "completion_mask": mask[:, P:]}
    metrics = tr._metrics["train"]
    got = tr.hook("teacher").scores(tr, output)
    tr.args.micro_batch_tokens = None
    try:
        want = tr.hook("teacher").scores(tr, output)
    finally:
        tr.args.micro_batch_tokens = BUDGET
    real = mask[:, P:].bool()
    for key in ("teacher_logps", "teacher_entropy", "old_logps_t1", "old_logps_sampling_t"):
        assert rel_err(got[key], want[key], real) <= 1e-5, key
    assert metrics["teacher/forwards"][0] >= 3
    # row micro-batches trimmed to their own longest row (248 of the batch's 432 padded positions), the budget less
    assert metrics["tokens/padded_teacher"][0] < metrics["tokens/padded_teacher"][1] < ids.numel()
    assert metrics["tokens/real_teacher"][0] == metrics["tokens/real_teacher"][1] == int(mask.sum())


def collapse_trainer(tiny_model, tmp_path, **overrides):
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "per_device_train_batch_size": 12,
                                                     "max_completion_length": T_MAX, "temperature": 0.7,
                                                     "collapse_detection": True, "collapse_num_samples": 8,
                                                     "collapse_micro_batch_size": 4, **overrides})
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity], args=args,
                             train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


def long_tailed_traces() -> BatchTraces:
    """12 traces over 4 prompts of different lengths, reasoning lengths long-tailed."""
    g = torch.Generator().manual_seed(5)
    contexts = [tuple(torch.randint(100, 20000, (n,), generator=g).tolist()) for n in (3, 12, 5, 9)]
    traces = [Trace(contexts[r % 4], tuple(torch.randint(100, 20000, (c,), generator=g).tolist()))
              for r, c in enumerate(COMPLETION_LENGTHS)]
    return BatchTraces(traces, [t.context for t in traces], False)


def test_collapse_cross_scores_and_mi_with_a_token_budget_equal_row_batches_and_plain_forwards(tiny_model, tmp_path,
                                                                                              monkeypatch):
    tr = collapse_trainer(tiny_model, tmp_path, micro_batch_tokens=BUDGET)
    detector, batch = tr.hook("collapse"), long_tailed_traces()
    forwards = []
    trl_forward = tr._get_per_token_logps_and_entropies

    def counted(*args, **kwargs):
        forwards.append(args[1].numel())  # input_ids of this forward
        return trl_forward(*args, **kwargs)

    tr._get_per_token_logps_and_entropies = counted
    metrics = tr._metrics["train"]

    # every (trace, context) pair, against one unpadded forward of the pair alone
    columns = list(dict.fromkeys(batch.contexts))
    sampled = [t for t in batch.traces]
    pairs = [(n, j) for n in range(len(sampled)) for j in range(len(columns))]
    sums, counts = detector._score(tr, sampled, columns, pairs)
    n_chunks, budget_tokens = len(forwards), sum(forwards)
    model = tr.accelerator.unwrap_model(tr.model)
    want = torch.zeros(len(pairs), dtype=torch.float64)
    for i, (n, j) in enumerate(pairs):
        x, z = columns[j], sampled[n].reasoning
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([list(x) + list(z)])).logits[0, len(x) - 1:-1].double() / 0.7
        want[i] = (logits - logits.logsumexp(-1, keepdim=True)).gather(1, torch.tensor(z)[:, None]).sum()
        assert counts[i] == len(z)
    assert float((sums - want).abs().max()) <= 1e-5 * float(want.abs().max())
    detector.token_budget = None  # the row micro-batches of collapse_micro_batch_size
    forwards.clear()
    row_sums, _ = detector._score(tr, sampled, columns, pairs)
    assert float((sums - row_sums).abs().max()) <= 1e-5 * float(row_sums.abs().max())
    # the planner really chunked, and the chunks pay for fewer padded tokens than the row micro-batches (already
    # length-sorted, so the gain is small here: 789 vs 916 tokens)
    assert n_chunks >= 3 and budget_tokens < sum(forwards), (n_chunks, budget_tokens, sum(forwards))

    # another rank with more chunks: this one runs filler forwards (the shortest pair), its scores and token counts
    # unchanged
    detector.token_budget, detector._tokens = BUDGET, [0, 0]
    detector._score(tr, sampled, columns, pairs)
    tokens = list(detector._tokens)
    monkeypatch.setattr(collapse_detector, "equal_forward_fillers", lambda acc, n, device: 2)
    forwards.clear()
    detector._tokens = [0, 0]
    spread, _ = detector._score(tr, sampled, columns, pairs)
    monkeypatch.undo()
    assert len(forwards) == n_chunks + 2 and forwards[-1] == forwards[-2] == min(forwards)
    assert torch.equal(spread, sums) and detector._tokens == tokens == [budget_tokens, tokens[1]]

    # the whole check: MI family equal, fewer padded tokens logged
    detector.token_budget = BUDGET
    got = detector.check(tr, batch, step=1)
    budget_padded = metrics["tokens/padded_collapse"][-1]
    detector.token_budget, detector._ema = None, {}
    want_m = detector.check(tr, batch, step=1)
    assert budget_padded < metrics["tokens/padded_collapse"][-1]
    assert metrics["tokens/real_collapse"][-1] == metrics["tokens/real_collapse"][-2]
    assert want_m["num_samples"] == 8 and abs(want_m["mi_estimate"]) > 1e-4
    for key in ("mi_estimate", "conditional_entropy", "reasoning_entropy", "marginal_std", "mi_zscore",
                "mi_estimate_seq", "conditional_entropy_seq", "mi_zscore_seq", "retrieval_accuracy"):
        assert got[key] == pytest.approx(want_m[key], rel=1e-5, abs=1e-9), key
