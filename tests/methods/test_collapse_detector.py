"""The MI collapse detector: (X, Z) extraction, its schedule, and cross-scoring through the real trainer
(tiny Qwen3, CPU) checked against a direct, unpadded forward pass of the model."""

from __future__ import annotations

import math

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, one_step_loss_and_grads, prompt_dataset, reward_token_parity

from trainer import WinnowConfig, WinnowGRPOTrainer
from trainer.methods.collapse.hook import CollapseDetector, Trace, first_turn_traces

OPEN, CLOSE = 151667, 151668  # Qwen3's <think> and </think>
ROWS = 32  # 8 distinct prompts x 4


def test_first_turn_traces_think_spans():
    prompts = [[1, 2], [1, 2], [3], [3], [4, OPEN]]
    completions = [
        [OPEN, 10, 11, CLOSE, 12],  # span in the completion
        [9, OPEN, 13, CLOSE],  # tokens before the tag: X stays the canonical prompt + <think>
        [OPEN, 14, 15],  # truncated before </think>: no trace
        [OPEN, CLOSE, 16],  # empty reasoning: no trace
        [17, 18, CLOSE, 19],  # the template pre-filled <think>
    ]
    traces, contexts, whole = first_turn_traces(prompts, completions, OPEN, CLOSE)
    assert not whole
    assert traces == [
        Trace((1, 2, OPEN), (10, 11)),
        Trace((1, 2, OPEN), (13,)),
        None,
        None,
        Trace((4, OPEN), (17, 18)),
    ]
    assert contexts == [(1, 2, OPEN), (1, 2, OPEN), (3, OPEN), (3, OPEN), (4, OPEN)]


@pytest.mark.parametrize("open_id, close_id", [(OPEN, CLOSE), (None, None)])
def test_first_turn_traces_without_think_use_the_whole_completion(open_id, close_id):
    traces, contexts, whole = first_turn_traces([[1], [2]], [[5, 6], []], open_id, close_id)
    assert whole and traces == [Trace((1,), (5, 6)), None] and contexts == [(1,), (2,)]


def _detector(**overrides):
    from trainer.tools.assets import build_qwen3_tokenizer

    args = WinnowConfig(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to="none", collapse_detection=True,
                        **overrides)
    return CollapseDetector(args, build_qwen3_tokenizer())


def test_schedule_step_one_then_every_k_including_generations_spanning_steps():
    det = _detector(collapse_every=5)
    assert [s for s in range(1, 13) if det.due(s)] == [1, 5, 10]
    det = _detector(collapse_every=5)
    assert [s for s in range(1, 13, 2) if det.due(s)] == [1, 5, 11]  # one generation per 2 steps
    det = _detector(collapse_every=5)  # resumed at step 7: next check at 10 (first generation >= 10)
    assert [s for s in range(7, 13, 2) if det.due(s)] == [11]


def think_rollout_func(prompts, trainer):
    """The harness's deterministic rollouts wrapped in Qwen3 think tags; every 4th one never closes its span."""
    out = deterministic_rollout_func(prompts, trainer)
    for i, ids in enumerate(out["completion_ids"]):
        body = [OPEN] + ids + ([CLOSE, 42] if i % 4 else [])
        out["completion_ids"][i] = body
        out["logprobs"][i] = [-1.0] * len(body)
        out["env_mask"][i] = [1] * len(body)
    return out


def build(tiny_model, tmp_path, rollout_func=deterministic_rollout_func, **overrides):
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "per_device_train_batch_size": ROWS,
                                                     "max_completion_length": 16, "collapse_detection": True,
                                                     "collapse_every": 1, "collapse_num_samples": 6, **overrides})
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity], args=args,
                             train_dataset=prompt_dataset(), rollout_func=rollout_func)


def direct_log_prob(model, x: tuple, z: tuple, temperature: float) -> float:
    """Sum of log q(z_t | x, z_<t) from one unpadded forward pass."""
    ids = torch.tensor([list(x) + list(z)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(x) - 1 : -1].double() / temperature
    return float(logits.log_softmax(-1).gather(1, torch.tensor(z).view(-1, 1)).sum())


def test_cross_scores_match_a_direct_forward_and_metrics_are_logged(tiny_model, tmp_path):
    tr = build(tiny_model, tmp_path, temperature=0.7, collapse_micro_batch_size=5)
    one_step_loss_and_grads(tr)
    m = {k: v[-1] for k, v in tr._metrics["train"].items() if k.startswith("collapse/")}
    assert m["collapse/z_is_whole_completion"] == 1.0  # random token ids: no think span
    # 6 traces sampled from 8 prompts x 4: the columns are the sampled traces' prompts (RAGEN: the sample's groups)
    assert 2 <= m["collapse/num_prompts"] <= 6 and m["collapse/num_samples"] == 6
    assert 0.0 <= m["collapse/retrieval_accuracy"] <= 1.0
    assert m["collapse/mi_estimate"] <= math.log(8) + 1e-9
    assert m["collapse/reasoning_entropy"] == pytest.approx(
        m["collapse/mi_estimate"] + m["collapse/conditional_entropy"]
    )
    top_k = [f"retrieval_at_{k}" for k in (2, 4) if k < m["collapse/num_prompts"]]  # k >= P is always a hit
    for key in ("mi_estimate_seq", "mi_zscore", "mi_zscore_ema", "tokens_scored", *top_k):
        assert f"collapse/{key}" in m

    # the padded, length-sorted, chunked scoring equals unpadded forwards, pair by pair
    columns = [(1, 2, 3), (4, 5, 6, 7, 8), (9,)]
    sampled = [Trace(columns[0], (11, 12)), Trace(columns[1], (13, 14, 15, 16)), Trace(columns[2], (17,))]
    pairs = [(n, j) for n in range(3) for j in range(3)]
    sums, counts = tr.hook("collapse")._score(tr, sampled, columns, pairs)
    model = tr.accelerator.unwrap_model(tr.model)
    for i, (n, j) in enumerate(pairs):
        assert counts[i] == len(sampled[n].reasoning)
        assert float(sums[i]) == pytest.approx(direct_log_prob(model, columns[j], sampled[n].reasoning, 0.7), abs=1e-4)


def test_think_mode_through_trainer_and_token_cap(tiny_model, tmp_path):
    tr = build(tiny_model, tmp_path, rollout_func=think_rollout_func, collapse_max_tokens=400)
    one_step_loss_and_grads(tr)
    m = {k: v[-1] for k, v in tr._metrics["train"].items() if k.startswith("collapse/")}
    assert m["collapse/z_is_whole_completion"] == 0.0
    assert m["collapse/valid_thinking_rate"] == pytest.approx(0.75)
    assert m["collapse/tokens_scored"] <= 400
    assert 1 <= m["collapse/num_samples"] < 6, "the token cap must have cut the sample"


def test_multi_turn_pairs_give_every_turn_its_whole_context():
    """collapse_turns: all -- each run of model tokens is a turn; its context is the prompt + everything before it."""
    from trainer.methods.collapse.hook import _turns

    prompt, ids = [1, 2], [10, 11, 50, 51, 12, 13, 0, 0]
    mask = [1, 1, 0, 0, 1, 1, 0, 0]  # turn, environment reply, turn, padding
    assert _turns(prompt, ids, mask) == [([1, 2], [10, 11]), ([1, 2, 10, 11, 50, 51], [12, 13])]
    assert _turns(prompt, [5], [1]) == [([1, 2], [5])]
    assert _turns(prompt, [5, 6], [0, 0]) == []
