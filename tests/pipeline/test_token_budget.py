"""``micro_batch_tokens``: the token-budget chunked loss equals TRL 1.16's own unchunked micro-batch loss.

The reference is TRL's ``GRPOTrainer._compute_loss`` on the whole micro-batch (TRL's trainer, not ours). The batch
is built to make every weighting visible: long-tailed completion lengths (1 .. 24 tokens) and left-padded prompts of
different lengths, truncated rows (no loss tokens at all), env spans (tool_mask 0), off-policy old log-probs (ratios
!= 1, some clipped), a drifted reference (KL != 0), temperature 0.7, per-row and per-token advantages, and an
entropy bonus. A budget that splits the 16 rows into several chunks -- one row alone over the budget -- must give
TRL's loss, parameter gradient and logged metrics, relative 1e-5, for every TRL loss type.
"""

from __future__ import annotations

import math

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, grads_of, prompt_dataset, reward_token_parity
from trl import GRPOConfig, GRPOTrainer

from trainer import ConfigError, WinnowConfig, WinnowGRPOTrainer
from trainer.methods.uecr.baselines import TEACHER_DELTA_KEY
from trainer.pipeline.token_budget import plan_chunks, plan_trimmed, row_extents

# TRL 1.16's loss types; the four the recipes use run by default, the rest (same weighting classes) under -m slow
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"] + [
    pytest.param(t, marks=pytest.mark.slow) for t in ("sapo", "luspo", "cispo", "vespo")]
COMPLETION_LENGTHS = [1, 1, 2, 2, 3, 3, 4, 5, 7, 10, 16, 24]  # long tail: p50 ~3.5, max 24
PROMPT_LENGTHS = [3, 9, 5, 4, 12, 6, 3, 7, 5, 10, 4, 5]
TRUNCATED = (3, 11)  # rows with no loss tokens (TRL's mask_truncated_completions zeroes them)
T_MAX = 24
BUDGET = 48  # the 16-token row plus its prompt (21) fits, two such rows do not: several chunks
ARGS = {**BASE_ARGS, "per_device_train_batch_size": 12, "max_completion_length": T_MAX, "beta": 0.04,
        "entropy_coef": 0.5, "epsilon_high": 0.28, "temperature": 0.7}  # a bonus large enough to see its weight
METRICS = ("kl", "entropy", "policy_loss", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
           "clip_ratio/low_min", "clip_ratio/high_max", "cispo_clip_ratio", "vespo/phi_seq_mean")


def _batch(trainer) -> dict[str, torch.Tensor]:
    """The long-tailed micro-batch (prompts left-padded, completions right-padded, as TRL lays them out)."""
    g = torch.Generator().manual_seed(11)
    B, P = len(COMPLETION_LENGTHS), max(PROMPT_LENGTHS)
    pad = trainer.processing_class.pad_token_id
    prompt_ids = torch.full((B, P), pad)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    completion_ids = torch.full((B, T_MAX), pad)
    completion_mask = torch.zeros(B, T_MAX, dtype=torch.long)
    for r, (p, c) in enumerate(zip(PROMPT_LENGTHS, COMPLETION_LENGTHS)):
        prompt_ids[r, P - p:] = torch.randint(100, 20000, (p,), generator=g)
        prompt_mask[r, P - p:] = 1
        completion_ids[r, :c] = torch.randint(100, 20000, (c,), generator=g)
        completion_mask[r, :c] = 0 if r in TRUNCATED else 1
    tool_mask = torch.ones_like(completion_mask)
    tool_mask[10, 2:5] = 0  # an env span inside a long row
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logp = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, T_MAX)[0]
    mask = completion_mask * tool_mask
    return {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "tool_mask": tool_mask,
        "advantages": torch.randn(B, generator=g),
        "old_per_token_logps": logp + 0.3 * torch.randn(logp.shape, generator=g),  # ratio != 1, some clipped
        "ref_per_token_logps": logp + 0.5 * torch.randn(logp.shape, generator=g),  # drifted reference
        "num_items_in_batch": mask.sum() * 2,  # dapo's normaliser spans the generation batch (2 micro-batches)
        TEACHER_DELTA_KEY: torch.randn(logp.shape, generator=g),
    }


@pytest.fixture(scope="module")
def pair(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("token_budget")
    kw = dict(
        reward_funcs=[reward_token_parity], train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func
    )
    trl = GRPOTrainer(
        model=tiny_model, args=GRPOConfig(output_dir=str(out / "trl"), steps_per_generation=2, **ARGS), **kw
    )
    win = WinnowGRPOTrainer(model=tiny_model, args=WinnowConfig(output_dir=str(out / "win"), steps_per_generation=2,
                                                                 micro_batch_tokens=BUDGET, **ARGS), **kw)
    win.model.load_state_dict(trl.model.state_dict())
    return trl, win, _batch(trl)


def _loss_grads_metrics(trainer, inputs):
    """One micro-batch as the training loop runs it (compute_loss, then one backward), with the metrics it logged."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.zero_grad(set_to_none=True)
    for values in trainer._metrics["train"].values():
        values.clear()
    loss = trainer.compute_loss(trainer.model, inputs)
    trainer.accelerator.backward(loss)
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if v}
    return loss.detach(), grads_of(trainer.model), metrics


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    scale = max(float(v.abs().max()) for v in a.values())
    return max(float((a[k] - b[k]).abs().max()) for k in a) / scale


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= rel * abs(b) + 1e-9


def _run(trl, win, inputs, loss_type, per_token_advantages=False, reference=True, **win_args):
    if per_token_advantages:
        g = torch.Generator().manual_seed(5)
        inputs = {**inputs, "advantages": torch.randn(inputs["completion_ids"].shape, generator=g)}
    trl.loss_type = win.loss_type = loss_type
    saved = {k: getattr(win.args, k) for k in win_args}
    for k, v in win_args.items():
        setattr(win.args, k, v)
    try:
        ref = _loss_grads_metrics(trl, inputs) if reference else (None, None, None)
        got = _loss_grads_metrics(win, inputs)
    finally:
        for k, v in saved.items():
            setattr(win.args, k, v)
    return ref, got


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_chunked_loss_equals_trl_unchunked(pair, loss_type):
    trl, win, inputs = pair
    (ref_loss, ref_grads, ref_m), (loss, grads, m) = _run(trl, win, inputs, loss_type)
    assert m["tokens/loss_chunks"] >= 3 and m["tokens/over_budget_rows"] == 0  # really chunked
    assert m["tokens/padded_loss"] < 12 * (max(PROMPT_LENGTHS) + T_MAX)  # and trimmed
    assert _close(float(loss), float(ref_loss)), (loss, ref_loss)
    assert _rel(ref_grads, grads) <= 1e-5
    assert ref_m["kl"] > 1e-3  # the KL term is really there
    for key in METRICS:
        if key in ref_m:
            assert _close(m[key], ref_m[key]), (key, m[key], ref_m[key])


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo"])
def test_chunked_loss_per_token_advantages_and_aggregated_entropy(pair, loss_type):
    """Per-token advantages (UECR's kind), and RAGEN's entropy bonus aggregated like the policy term."""
    trl, win, inputs = pair
    (ref_loss, ref_grads, _), (loss, grads, _) = _run(trl, win, inputs, loss_type, per_token_advantages=True)
    assert _close(float(loss), float(ref_loss)) and _rel(ref_grads, grads) <= 1e-5
    # entropy_aggregation loss_type: the unchunked winnow path is the reference (itself tested against RAGEN's rule)
    saved = win.args.micro_batch_tokens
    try:
        win.args.micro_batch_tokens = None
        _, (full_loss, full_grads, _) = _run(trl, win, inputs, loss_type, reference=False,
                                             entropy_aggregation="loss_type")
    finally:
        win.args.micro_batch_tokens = saved
    _, (loss, grads, _) = _run(trl, win, inputs, loss_type, reference=False, entropy_aggregation="loss_type")
    assert _close(float(loss), float(full_loss)) and _rel(full_grads, grads) <= 1e-5


def test_chunked_naive_hybrid_with_zero_opd_equals_trl(pair):
    """The surrogate-replacing variants (trainer/methods/surrogate.py) chunk too: naive_hybrid with opd_coef 0 is
    TRL's surrogate, KL and token-mean entropy bonus."""
    trl, win, inputs = pair
    (ref_loss, ref_grads, ref_m), (loss, grads, m) = _run(trl, win, inputs, "grpo", loss_variant="naive_hybrid",
                                                          opd_coef=0.0)
    assert _close(float(loss), float(ref_loss)) and _rel(ref_grads, grads) <= 1e-5
    assert _close(m["kl"], ref_m["kl"]) and _close(m["entropy"], ref_m["entropy"])


@pytest.mark.parametrize("loss_type, per_token_advantages", [("dapo", True), ("cispo", False)])
def test_chunked_metrics_at_sequence_level_importance_sampling(pair, loss_type, per_token_advantages):
    """Sequence-level importance sampling: TRL averages a clip ratio (cispo's too) over rows where the advantages
    are per row, over loss tokens where they are per token (the clip indicator broadcasts to one value per token).
    The chunked step logs TRL's unchunked values."""
    trl, win, inputs = pair
    for t in (trl, win):
        t.importance_sampling_level = "sequence"
    try:
        (ref_loss, ref_grads, ref_m), (loss, grads, m) = _run(trl, win, inputs, loss_type, per_token_advantages,
                                                              importance_sampling_level="sequence")
    finally:
        for t in (trl, win):
            t.importance_sampling_level = "token"
    assert m["tokens/loss_chunks"] >= 3
    assert _close(float(loss), float(ref_loss)) and _rel(ref_grads, grads) <= 1e-5
    clip = "cispo_clip_ratio" if loss_type == "cispo" else "clip_ratio/low_mean"
    assert 0 < ref_m[clip] < 1  # some rows or tokens clipped, not all
    for key in METRICS:
        if key in ref_m:
            assert _close(m[key], ref_m[key]), (key, m[key], ref_m[key])


def test_single_row_over_budget_runs_alone(pair):
    """Rows over the budget run alone. Rows 0 and 11 (one completion token, and none: truncated) share a chunk of one
    real completion column; it keeps two, since TRL reads a one-column tensor as one value per row and would average
    that chunk's kl, entropy and clip ratios over both rows, the one without loss tokens included."""
    trl, win, inputs = pair
    saved = win.args.micro_batch_tokens
    win.args.micro_batch_tokens = 12  # below the longest real rows' prompt + completion (21, 20)
    plan, _ = plan_trimmed(*row_extents(inputs["prompt_mask"], inputs["completion_mask"]), 12)
    assert ([0, 11], 1) in [(rows, c) for rows, _, c in plan]
    try:
        (ref_loss, ref_grads, ref_m), (loss, grads, m) = _run(trl, win, inputs, "dr_grpo")
    finally:
        win.args.micro_batch_tokens = saved
    assert m["tokens/over_budget_rows"] >= 2
    assert _close(float(loss), float(ref_loss)) and _rel(ref_grads, grads) <= 1e-5
    for key in METRICS:
        if key in ref_m:
            assert _close(m[key], ref_m[key]), (key, m[key], ref_m[key])


def test_no_grad_logps_passes_chunked_equal_trl(pair):
    """The old-policy / reference passes (TRL calls them with batch_size, under no_grad) over token-budget chunks
    equal TRL's row-sliced pass on every real completion token."""
    trl, win, inputs = pair
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    win._metrics["train"]["tokens/padded_old_logps"].clear()
    with torch.no_grad():
        ref_lp, ref_ent, _ = trl._get_per_token_logps_and_entropies(trl.model, ids, attn, T_MAX, batch_size=4,
                                                                   compute_entropy=True)
        lp, ent, _ = win._get_per_token_logps_and_entropies(win.model, ids, attn, T_MAX, batch_size=4,
                                                            compute_entropy=True)
    real = inputs["completion_mask"].bool()
    assert float((lp - ref_lp)[real].abs().max()) <= 1e-5 * float(ref_lp[real].abs().max())
    assert float((ent - ref_ent)[real].abs().max()) <= 1e-5 * float(ref_ent[real].abs().max())
    assert win._metrics["train"]["tokens/padded_old_logps"][-1] < ids.numel()


def test_plan_chunks_first_fit_decreasing():
    """Hand-checked plan: rows by length, first chunk with room; padded cost = rows x (max prompt + max completion)."""
    p = [2, 2, 2, 2, 2]
    c = [10, 1, 4, 30, 3]
    assert plan_chunks(p, c, budget=24) == [[3], [0, 2], [1, 4]]  # 32 alone (over), 2 x 12, 2 x 5
    assert plan_chunks(p, c, budget=1000) == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize(
    "overrides",
    [
        {"micro_batch_tokens": 0},
        {"micro_batch_tokens": 64, "top_entropy_quantile": 0.2},
        {"micro_batch_tokens": 64, "use_adaptive_entropy": True},
        {"micro_batch_tokens": 64, "loss_variant": "kl_cov"},
    ],
)
def test_bad_budget_settings_name_the_field(tmp_path, overrides):
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, **overrides})


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_chunked_with_vllm_importance_sampling_correction(pair, loss_type, level):
    """TRL's vLLM importance-sampling correction on (a user's choice): every row's ratio -- per token (B, T) or per
    sequence (B, 1), TRL's two shapes -- multiplies its own per-token loss in whichever chunk the row lands, so the
    chunked loss, gradient and merged metrics are TRL's unchunked ones."""
    trl, win, inputs = pair
    g = torch.Generator().manual_seed(3)
    B, T = inputs["completion_ids"].shape
    ratio = 0.5 + torch.rand((B, T) if level == "token" else (B, 1), generator=g)  # far from 1, one per row/token
    inputs = {**inputs, "importance_sampling_ratio": ratio}
    for t in (trl, win):
        t.use_vllm, t.vllm_importance_sampling_correction = True, True
    try:
        (ref_loss, ref_grads, ref_m), (loss, grads, m) = _run(trl, win, inputs, loss_type)
    finally:
        for t in (trl, win):
            t.use_vllm, t.vllm_importance_sampling_correction = False, False
    uncorrected = _loss_grads_metrics(trl, inputs)[0]  # the same batch with the correction off
    assert abs(float(uncorrected - ref_loss)) > 1e-3 * abs(float(ref_loss))  # the ratios really weigh the loss
    assert m["tokens/loss_chunks"] >= 3
    assert _close(float(loss), float(ref_loss)) and _rel(ref_grads, grads) <= 1e-5
    for key in METRICS:
        if key in ref_m:
            assert _close(m[key], ref_m[key]), (key, m[key], ref_m[key])
