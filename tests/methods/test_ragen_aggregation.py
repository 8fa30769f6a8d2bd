"""The RAGEN recipes' loss against a hand computation of RAGEN's verl actor (issue 34 item 13).

RAGEN's actor (mll-lab-nu/RAGEN@20daedc ragen/workers/actor/dp_actor.py:283-300, 403-465) splits each mini-batch
into micro-batches of ``ppo_micro_batch_size_per_gpu`` = 1 sequence (config/base.yaml:12, 32; ``use_dynamic_bsz``
false: volcengine/verl@d62da49 verl/trainer/config/actor/actor.yaml:25). Per micro-batch it computes the dual-clip
policy loss per token (verl core_algos.py:812-884 ``compute_policy_loss``), aggregates it and the entropy with the
same ``agg_loss`` mode (core_algos.py:772-808; dp_actor.py:430-446), and backpropagates
``(pg_loss - entropy_coeff * entropy_loss) / gradient_accumulation``, gradient_accumulation = the mini-batch's rows
on that GPU (dp_actor.py:298, 464); FSDP averages over GPUs. The mode per algorithm is the main-table script's
(scripts/runs/run_main_table_diff_algo.sh:226-245): DAPO token-mean, GRPO seq-mean-token-mean, Dr. GRPO
seq-mean-token-sum. Everything below the model's forward is transcribed from those lines, not from TRL or winnow.

The loss settings come from the RAGEN recipe files themselves; the batch is non-trivial: completions of 1-12
tokens, one row without loss tokens, an env span, old log-probs far off-policy (ratios on both sides of the clip
range and of the dual-clip bound 3, advantages of both signs), the micro-batch one of two in its optimizer step,
and an entropy bonus (RAGEN's 0.001 enlarged to 0.05 so a mis-aggregated bonus lands far outside the tolerance).
Checked unchunked and under ``micro_batch_tokens``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from harness import BASE_ARGS, deterministic_rollout_func, grads_of, prompt_dataset, reward_token_parity
from verl_oracle import verl_dual_clip_token_loss

from trainer import WinnowConfig, WinnowGRPOTrainer
from trainer.config.core import ConfigError
from trainer.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]
# scripts/runs/run_main_table_diff_algo.sh:226-245: actor_rollout_ref.actor.loss_agg_mode per algorithm
VERL_MODES = {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "drgrpo": "seq-mean-token-sum"}
LOSS_FIELDS = ("loss_type", "dr_grpo_token_sum", "epsilon", "epsilon_high", "delta", "entropy_aggregation", "beta",
               "loss_variant")
COMPLETION_LENGTHS = [1, 2, 3, 4, 5, 7, 9, 12]
PROMPT_LENGTHS = [3, 8, 5, 4, 6, 3, 7, 5]
TRUNCATED = 3  # a row with no loss tokens (verl's seq_mask drops it from the sum, the accumulation still counts it)
T_MAX = 12
BUDGET = 24  # padded tokens per forward: the 12-token row and its prompt (17) fit, two long rows do not
ENTROPY_COEF = 0.05
ACCUMULATION = 2  # this micro-batch is one of the two of its optimizer step: verl divides by the 2 x B rows
# upstream's clip range (config/base.yaml:38-39) and dual-clip bound (dp_actor.py:420; verl actor.yaml:69)
CLIP_LOW, CLIP_HIGH, CLIP_RATIO_C = 0.2, 0.28, 3.0


def recipe_loss_settings(algo: str) -> dict:
    """The loss fields of the RAGEN Sokoban recipe for ``algo`` (the other tasks share them: tests/config)."""
    _, args, _ = parse_recipe(["--config", str(ROOT / f"configs/ragen/sokoban-{algo}-nofilter.yaml"),
                               "--bf16", "false", "--use_cpu", "true"])
    return {k: getattr(args, k) for k in LOSS_FIELDS}


# --- verl, transcribed ------------------------------------------------------------------------------------------

def masked_mean(values, mask):
    """verl/utils/torch_functional.py:171-185."""
    return (values * mask).sum() / (mask.sum() + 1e-8)


def agg_loss(loss_mat, loss_mask, loss_agg_mode):
    """verl/trainer/ppo/core_algos.py:772-808 (the three modes RAGEN's main table runs)."""
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        return masked_mean(seq_losses, seq_mask)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).float()
        return masked_mean(seq_losses, seq_mask)
    raise ValueError(loss_agg_mode)


def verl_update_loss(logp, entropy, old, A, mask, mode, eps_low, eps_high, clip_c, coef, gradient_accumulation):
    """dp_actor.py:403-465 with one-sequence micro-batches: the sum of each row's backpropagated loss."""
    total = 0.0
    for i in range(logp.size(0)):
        row = slice(i, i + 1)
        token_loss = verl_dual_clip_token_loss(logp[row], old[row], A[row], eps_low, eps_high, clip_c)
        pg_loss = agg_loss(token_loss, mask[row], mode)
        entropy_loss = agg_loss(entropy[row], mask[row], mode)
        policy_loss = pg_loss - entropy_loss * coef
        total = total + policy_loss / gradient_accumulation
    return total


# --- the batch --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def recipes() -> dict[str, dict]:
    """Each algorithm's recipe loss settings (parsed before the trainer exists: parsing builds TrainingArguments,
    which resets accelerate's shared state)."""
    return {algo: recipe_loss_settings(algo) for algo in VERL_MODES}


@pytest.fixture(scope="module")
def trainer(tiny_model, tmp_path_factory, recipes) -> WinnowGRPOTrainer:
    """One winnow trainer on the harness's tiny model (nothing generated); each test applies a recipe's loss
    settings to it with :func:`loss_settings`."""
    base = {**BASE_ARGS, "per_device_train_batch_size": len(COMPLETION_LENGTHS), "num_generations": 2,
            "max_completion_length": T_MAX, "gradient_accumulation_steps": ACCUMULATION}
    args = WinnowConfig(output_dir=str(tmp_path_factory.mktemp("ragen_aggregation")), **base,
                        entropy_coef=ENTROPY_COEF, **recipes["grpo"])
    return WinnowGRPOTrainer(model=tiny_model, reward_funcs=[reward_token_parity], args=args,
                             train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


@contextlib.contextmanager
def loss_settings(trainer, settings: dict, micro_batch_tokens=None):
    """The trainer with ``settings`` (a recipe's validated loss fields) and a token budget, restored after."""
    fields = {**settings, "micro_batch_tokens": micro_batch_tokens}
    attrs = {"loss_type": settings["loss_type"], "epsilon_low": settings["epsilon"],
             "epsilon_high": settings["epsilon_high"], "beta": settings["beta"]}  # TRL's copies of the args
    saved_args = {k: getattr(trainer.args, k) for k in fields}
    saved_attrs = {k: getattr(trainer, k) for k in attrs}
    for k, v in fields.items():
        setattr(trainer.args, k, v)
    for k, v in attrs.items():
        setattr(trainer, k, v)
    try:
        yield trainer
    finally:
        for k, v in saved_args.items():
            setattr(trainer.args, k, v)
        for k, v in saved_attrs.items():
            setattr(trainer, k, v)


@pytest.fixture(scope="module")
def batch(trainer) -> dict[str, torch.Tensor]:
    """The micro-batch every test uses (:func:`make_batch`)."""
    return make_batch(trainer)


def make_batch(trainer) -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded completions of long-tailed lengths, off-policy old log-probs."""
    g = torch.Generator().manual_seed(7)
    B, P = len(COMPLETION_LENGTHS), max(PROMPT_LENGTHS)
    pad = trainer.processing_class.pad_token_id
    prompt_ids, prompt_mask = torch.full((B, P), pad), torch.zeros(B, P, dtype=torch.long)
    completion_ids, completion_mask = torch.full((B, T_MAX), pad), torch.zeros(B, T_MAX, dtype=torch.long)
    for r, (p, c) in enumerate(zip(PROMPT_LENGTHS, COMPLETION_LENGTHS)):
        prompt_ids[r, P - p:] = torch.randint(100, 20000, (p,), generator=g)
        prompt_mask[r, P - p:] = 1
        completion_ids[r, :c] = torch.randint(100, 20000, (c,), generator=g)
        completion_mask[r, :c] = 0 if r == TRUNCATED else 1
    tool_mask = torch.ones_like(completion_mask)
    tool_mask[7, 3:6] = 0  # an environment reply inside a multi-turn row
    with torch.no_grad():
        logp = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1),
            T_MAX)[0]
    # advantages of alternating sign (both signs on short and long rows); log-ratios cycling along each row through
    # every region of the dual clip: below 1 - eps, inside the clip range, between 1 + eps and 3, beyond 3
    A = torch.rand(B, generator=g) + 0.5
    A[1::2] *= -1
    regions = torch.tensor([-2.5, -1.0, -0.1, 0.05, 0.6, 1.6, 2.4])
    cycle = (torch.arange(B).unsqueeze(1) + torch.arange(T_MAX).unsqueeze(0)) % len(regions)
    log_ratio = regions[cycle] + 0.05 * torch.randn(logp.shape, generator=g)
    return {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "tool_mask": tool_mask, "advantages": A,
        "old_per_token_logps": logp - log_ratio,
        "num_items_in_batch": (completion_mask * tool_mask).sum() * ACCUMULATION,
    }


def winnow_loss_and_grads(trainer, inputs):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = ACCUMULATION
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    trainer.accelerator.backward(loss)
    return float(loss.detach()), grads_of(trainer.model)


def verl_loss_and_grads(trainer, inputs, mode):
    trainer.model.zero_grad(set_to_none=True)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    # the model's forward (log-probs and entropies at the sampling temperature) is the one thing taken from TRL
    logp, entropy, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, T_MAX,
                                                                  compute_entropy=True)
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).float()  # verl's response_mask: sampled tokens only
    A = inputs["advantages"].unsqueeze(1).expand_as(logp)
    loss = verl_update_loss(logp, entropy, inputs["old_per_token_logps"], A, mask, mode, CLIP_LOW, CLIP_HIGH,
                            CLIP_RATIO_C, ENTROPY_COEF, ACCUMULATION * logp.size(0))
    loss.backward()
    return float(loss.detach()), grads_of(trainer.model)


def rel_diff(a: dict, b: dict) -> float:
    scale = max(float(v.abs().max()) for v in b.values())
    assert scale > 0
    return max(float((a[k] - b[k]).abs().max()) for k in b) / scale


@pytest.mark.parametrize("budget", [None, BUDGET], ids=["unchunked", "micro_batch_tokens"])
@pytest.mark.parametrize("algo", sorted(VERL_MODES))
def test_ragen_recipe_loss_is_verls_one_sequence_micro_batches(trainer, batch, recipes, algo, budget):
    settings = recipes[algo]
    assert settings["beta"] == 0.0 and settings["entropy_aggregation"] == "loss_type"  # RAGEN: no KL, agg'd bonus
    inputs = batch
    with loss_settings(trainer, settings, micro_batch_tokens=budget):
        loss, grads = winnow_loss_and_grads(trainer, inputs)
    if budget is not None:  # really chunked
        assert trainer._metrics["train"]["tokens/loss_chunks"][-1] >= 3
    ref_loss, ref_grads = verl_loss_and_grads(trainer, inputs, VERL_MODES[algo])
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert rel_diff(grads, ref_grads) <= 1e-5


def test_the_batch_exercises_every_branch(trainer, batch):
    """Unequal lengths (so the three modes differ), and off-policy ratios in every region of the dual clip for
    both advantage signs."""
    inputs = batch
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    lengths = mask.sum(-1)
    assert len(set(lengths.tolist())) > 5 and lengths.min() == 0
    with torch.no_grad():
        logp = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), T_MAX)[0]
    ratio = torch.exp(logp - inputs["old_per_token_logps"])
    for sign in (1, -1):
        rows = (inputs["advantages"] * sign > 0).unsqueeze(1) & mask
        low, high = 1 - CLIP_LOW, 1 + CLIP_HIGH
        assert (rows & (ratio > CLIP_RATIO_C)).any() and (rows & (ratio > high) & (ratio < CLIP_RATIO_C)).any()
        assert (rows & (ratio < low)).any() and (rows & (ratio > low) & (ratio < high)).any()


def test_trls_own_aggregations_are_not_verls(trainer, batch, recipes):
    """Negative controls: TRL's dr_grpo without the knob is verl's seq-mean-token-sum / max_completion_length, and
    TRL's dapo (a token mean over the optimizer step) is not verl's token-mean on one-sequence micro-batches. TRL's
    luspo at token-level importance sampling does aggregate as seq-mean-token-sum (docs/ragen-fidelity.md)."""
    inputs = batch
    with loss_settings(trainer, {**recipes["drgrpo"], "dr_grpo_token_sum": False}):
        loss, _ = winnow_loss_and_grads(trainer, inputs)
    ref_loss, _ = verl_loss_and_grads(trainer, inputs, "seq-mean-token-sum")
    assert loss == pytest.approx(ref_loss / T_MAX, rel=1e-5) and abs(loss - ref_loss) > 0.5 * abs(ref_loss)
    with loss_settings(trainer, {**recipes["drgrpo"], "loss_type": "luspo", "dr_grpo_token_sum": False}):
        loss, _ = winnow_loss_and_grads(trainer, inputs)
    assert trainer.args.importance_sampling_level == "token" and loss == pytest.approx(ref_loss, rel=1e-5)
    with loss_settings(trainer, {**recipes["dapo"], "loss_type": "dapo"}):
        loss, _ = winnow_loss_and_grads(trainer, inputs)
    ref_loss, _ = verl_loss_and_grads(trainer, inputs, "token-mean")
    assert abs(loss - ref_loss) > 1e-3 * abs(ref_loss)


@pytest.mark.parametrize("bad", [{"loss_type": "grpo"}, {"loss_type": "dr_grpo", "loss_variant": "clip_cov"}])
def test_token_sum_outside_trls_dr_grpo_is_refused(tmp_path, bad):
    with pytest.raises(ConfigError, match="dr_grpo_token_sum"):
        WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, dr_grpo_token_sum=True, **bad)
