"""Multi-process training scenarios, run by tests/distributed/test_distributed.py.

One launch runs several scenarios back to back (each launch costs ~15 s of start-up):

    accelerate launch --config_file launch/accelerate/multi_cpu_2.yaml tests/distributed/scenarios.py \
        --out DIR --suite ddp
    accelerate launch --config_file launch/accelerate/zero3_cpu_2.yaml tests/distributed/scenarios.py \
        --out DIR --suite zero3
    python tests/distributed/scenarios.py --out DIR --suite ddp --reference   # 1 process: every suite's scenarios

Results land in DIR/world2, DIR/world2-zero3 and DIR/reference.

Every scenario trains a few optimizer steps of WinnowGRPOTrainer on the tiny Qwen3 with a data-dependent
group filter and the deterministic rollout_func (what is "sampled" depends only on the prompt, so 1 and 2
processes see the same global batch while each rank holds different local rows). Each rank writes the
decisions its pipeline made and the rows it held; the main process writes the final parameters.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (harness)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from harness import (  # noqa: E402
    BASE_ARGS,
    DigestPolicy,
    deterministic_rollout_func,
    prompt_dataset,
    reward_length,
    reward_parity_constant_for_multiples_of,
    reward_parity_flat_at,
    reward_token_parity,
    tiny_model_path,
)

from trainer import StageResult, WinnowConfig, WinnowGRPOTrainer, register_stage  # noqa: E402
from trainer.algorithms.grpo import nanstd  # noqa: E402
from trainer.methods.cov_losses import loss as cov_losses  # noqa: E402
from trainer.methods.snr.stage import snr_filter, snr_needs  # noqa: E402

DECISIONS: list[dict[str, torch.Tensor]] = []
SELECTIONS: list[dict[str, torch.Tensor]] = []  # Clip-Cov / KL-Cov global token choices, one per micro-step
ENTROPY_MASKS: list[int] = []  # Beyond-80/20: tokens TRL's entropy mask kept on this rank, one per micro-step
cov_losses.add_selection_hook(SELECTIONS.append)


@register_stage("rollout_filter", "test_above_median_std", group_level=True, metric_prefix="test_filter")
def above_median_std(batch, args) -> StageResult:
    """Keep groups whose reward std is strictly above the batch median (data-dependent, global)."""
    std = nanstd(batch.groups(batch.R), dim=1, std="population")
    keep_groups = std > std.median()
    keep = keep_groups.repeat_interleave(batch.G)
    DECISIONS.append({"keep": keep.clone(), "R": batch.R.clone(), "completion_ids": batch.completion_ids.clone()})
    return StageResult(keep=keep, metrics={"kept_groups": float(keep_groups.sum())})


@register_stage("rollout_filter", "test_snr_recorded", needs=snr_needs, group_level=True, metric_prefix="snr")
def snr_recorded(batch, args) -> StageResult:
    """The real SNR filter, recording its decision like the stage above."""
    result = snr_filter(batch, args)
    DECISIONS.append(
        {"keep": result.keep.clone(), "R": batch.R.clone(), "completion_ids": batch.completion_ids.clone()}
    )
    return result


@register_stage("rollout_dropout", "test_keep_first_five")
def keep_first_five(batch, args) -> StageResult:
    """Keep global rows 0-4 only: with 2 processes every kept row starts on rank 0 (rank 1 keeps nothing), and
    5 rows do not split evenly, so compaction must add zero-weight rows."""
    keep = torch.zeros(batch.N, dtype=torch.bool)
    keep[:5] = True
    DECISIONS.append({"keep": keep.clone(), "R": batch.R.clone(), "completion_ids": batch.completion_ids.clone()})
    return StageResult(keep=keep)


# RAGEN-2 end to end: SNR filter + collapse checks on both ranks; step 2's rewards are flat, so the filter keeps
# nothing and that step must be skipped identically everywhere (under ZeRO-3 through DeepSpeed's own optimizer).
SNR_COLLAPSE = dict(rollout_filter="test_snr_recorded", snr_value=0.9, collapse_detection=True, collapse_every=1,
                    collapse_num_samples=8, reward_funcs=[reward_parity_flat_at(2)], weight_decay=0.1)

# UECR-GRPO with a frozen teacher of another size (a tiny Qwen3, seed 7): under ZeRO-3 the teacher is partitioned.
UECR = dict(loss_type="dapo", rollout_filter="none", advantage="uecr", teacher_micro_batch_size=3, beta=0.01)
# Token-budget micro-batches (trainer/pipeline/token_budget.py): each loss type trained unchunked ("tail_*") and in
# token-budget chunks ("budget_*") on long-tailed completions; the chunks must not change the update or the metrics.
TAIL_LENGTH = 24  # every fourth completion is stretched to this length (the rest keep 2-8 tokens)
BUDGET_TOKENS = 40  # a long row (prompt + 24) runs alone, short rows share chunks: several chunks per micro-step
# num_iterations=2: the second optimizer step reuses the batch off-policy (ratios != 1, some clipped). Plain SGD:
# the parameters move by lr x gradient, so a wrongly scaled chunk shows (Adam's first step is sign(g) x lr, and the
# entropy bonus's ~1e-9 gradients on every vocabulary row would turn fp32 noise into lr-sized steps there).
TAIL = dict(long_tail=True, max_completion_length=TAIL_LENGTH, entropy_coef=0.01, num_iterations=2, optim="sgd",
            learning_rate=0.1, epsilon=0.03)
TAIL_LOSSES = {
    "grpo_kl_accum": dict(loss_type="grpo", beta=0.04, gradient_accumulation_steps=2),
    "bnpo": dict(loss_type="bnpo"),
    "dr_grpo": dict(loss_type="dr_grpo", beta=0.04),
    "dapo": dict(loss_type="dapo"),
}
# "budget_*" keep the round-robin deal (balance_rank_tokens off), so the ranks' chunk counts differ; "balanced_*" deal
# the rows so each rank holds about as many tokens (trainer/algorithms/rank_balance.py), also when nothing is removed.
BUDGET = dict(micro_batch_tokens=BUDGET_TOKENS, balance_rank_tokens=False)
BUDGET_SCENARIOS = {
    f"{kind}_{name}": ({**TAIL, **loss, **(BUDGET if kind == "budget" else {})}, 2)
    for name, loss in TAIL_LOSSES.items()
    for kind in ("tail", "budget")
}
BALANCED_SCENARIOS = {
    "balanced_grpo_kl_accum": ({**TAIL, **TAIL_LOSSES["grpo_kl_accum"], "micro_batch_tokens": BUDGET_TOKENS}, 2),
    "balanced_dapo_all_kept": ({**TAIL, **TAIL_LOSSES["dapo"], "micro_batch_tokens": BUDGET_TOKENS,
                                "rollout_filter": "none"}, 2),
}


def long_tail_rollout_func(prompts: list, trainer) -> dict[str, list]:
    """:func:`deterministic_rollout_func` with every fourth completion stretched to ``TAIL_LENGTH`` tokens
    (extra tokens before the last one, so an EOS stays last): long-tailed lengths, still process-independent."""
    out = deterministic_rollout_func(prompts, trainer)
    for i, ids in enumerate(out["completion_ids"]):
        if ids[0] % 4:
            continue
        extra = [100 + (7 * ids[0] + 13 * k) % 19000 for k in range(TAIL_LENGTH - len(ids))]
        out["completion_ids"][i] = ids[:-1] + extra + ids[-1:]
        out["logprobs"][i] = out["logprobs"][i][:-1] + [-1.0 - (k % 5) / 5 for k in range(len(extra))] + \
            out["logprobs"][i][-1:]
        out["env_mask"][i] = out["env_mask"][i][:-1] + [1] * len(extra) + out["env_mask"][i][-1:]
    return out


FIXED_IDS = torch.arange(1000, 1000 + 2 * 12).view(2, 12)  # a fixed batch every run scores with its teacher


def teacher_path() -> str:
    from trainer.tools.assets import make_tiny_qwen3

    return str(make_tiny_qwen3(seed=7, hidden_size=32, intermediate_size=64))
# PPO composed with RAGEN-2's filter chain: the SNR filter and collapse checks, step 2 empty (the critic skips with
# the policy: under ZeRO-3 its own engine through the ZeRO overflow path) and token-budget chunks on long-tailed rows
# (the critic runs the policy's chunks, filler forwards included).
PPO_COLLAPSE_BUDGET = {**SNR_COLLAPSE, "loss_type": "dapo", "advantage": "gae", "critic_learning_rate": 1e-2,
                       "long_tail": True, "max_completion_length": TAIL_LENGTH, "micro_batch_tokens": BUDGET_TOKENS,
                       "balance_rank_tokens": False}

# name -> (WinnowConfig overrides, optimizer steps). Global batch: 16 rollouts = 4 prompt groups of 4.
SUITES = {
    "ddp": {
        "filter_dapo": (dict(loss_type="dapo"), 2),
        "filter_grpo_kl_accum": (dict(loss_type="grpo", beta=0.04, gradient_accumulation_steps=2), 2),
        "off_dr_grpo": (dict(loss_type="dr_grpo", rollout_filter="none"), 2),
        # GRPODropout after the filter: old-policy log-probs come from each rank's own forward, then are gathered
        "filter_grpodropout": (dict(loss_type="grpo", rollout_dropout="grpodropout"), 2),
        # the authors' GRPODropout (configs/grpodropout): balance_neg, recomputed advantages, verl's mini-batch of 16
        # rollouts divided by 16 whatever it holds (the compacted micro-batches are 8 rows on one process, 4 or fewer
        # on two). One optimizer step per generation batch: with more, TRL's own shuffle deals rows to steps
        # differently on 1 and 2 processes, so no trainer could match there. lr 1e-3: the recomputed advantages of
        # 2-row groups are O(1), and at 1e-2 Adam amplified fp32 noise in near-zero gradients to ~1e-5.
        "authors_grpodropout": (dict(loss_type="grpo", rollout_filter="none", rollout_dropout="grpodropout",
                                     dropout_selector="balanced_push_neg", dropout_zero_push_groups="random_min_keep",
                                     dropout_restandardize=True, advantage_eps=1e-6, filtered_updates="verl_minibatch",
                                     gradient_accumulation_steps=2, learning_rate=1e-3), 2),
        "snr_collapse_empty_step": (SNR_COLLAPSE, 3),
        # batch compaction (the default) vs the masked formulation, incl. a rank that keeps no rollout
        "filter_dapo_masked": (dict(loss_type="dapo", compact_batch=False), 2),
        "filter_grpo_kl_accum_masked": (dict(loss_type="grpo", beta=0.04, gradient_accumulation_steps=2,
                                             compact_batch=False), 2),
        "rank_keeps_none": (dict(loss_type="grpo", beta=0.04, gradient_accumulation_steps=2, rollout_filter="none",
                                 rollout_dropout="test_keep_first_five"), 2),
        "rank_keeps_none_masked": (dict(loss_type="grpo", beta=0.04, gradient_accumulation_steps=2,
                                        rollout_filter="none", rollout_dropout="test_keep_first_five",
                                        compact_batch=False), 2),
        # entropy/sampling baselines (issue: DAPO, Clip-Cov, KL-Cov, Beyond 80/20). num_iterations=2: the second
        # optimizer step reuses the batch off-policy, where clipping and KL-Cov's |log-ratio| penalty act.
        "clip_cov": (dict(loss_type="dapo", loss_variant="clip_cov", clip_cov_ratio=0.05, clip_cov_lb=-1e9,
                          clip_cov_ub=1e9, num_iterations=2), 2),
        "kl_cov": (dict(loss_type="dapo", loss_variant="kl_cov", kl_cov_ratio=0.05, num_iterations=2), 2),
        "beyond8020": (dict(loss_type="dapo", rollout_filter="none", top_entropy_quantile=0.2), 2),
        "uecr": (UECR, 2),
        "dynamic_sampling": (dict(loss_type="dapo", dynamic_sampling=True, unique_prompts=True,
                                  reward_funcs=[reward_parity_constant_for_multiples_of(3)]), 2),
        # multi-turn environment episodes (env_mask -> tool_mask through filter and compaction)
        "env_rollout": (dict(loss_type="grpo", env_rollout=True, max_completion_length=300, learning_rate=1e-3), 2),
        # PPO with a learned critic behind the group filter (RAGEN-2's PPO rows filter too): the critic's old values
        # on each rank's rows, GAE over the gathered kept rows, the value loss under DDP; num_iterations 2 so the
        # second update runs off the old values (value clipping at work, cliprange 1e-3)
        "ppo": (dict(loss_type="dapo", advantage="gae", critic_learning_rate=1e-2, cliprange_value=1e-3,
                     num_iterations=2), 2),
        **BUDGET_SCENARIOS,
        **BALANCED_SCENARIOS,
        # generation overlapped with training (max_staleness 1) on an HTTP emulator of vLLM: each rank's prompts
        # read ahead from its own dataloader, gathered, generated once, broadcast and sliced (lr 1e-3: at 1e-2 Adam
        # turned fp32 reduction noise in small gradients into 1.2e-5)
        "overlap": (dict(loss_type="dapo", rollout_filter="none", max_staleness=1, emulated_server=True,
                         learning_rate=1e-3), 3),
        # and with dynamic sampling: the main process scores every rank's rows on arrival and generates the refill
        # rounds from its global refill stream; each rank's own refill stream must hand over the same prompts
        "overlap_dynamic_sampling": (dict(loss_type="dapo", dynamic_sampling=True, unique_prompts=True,
                                          reward_funcs=[reward_parity_constant_for_multiples_of(3)], max_staleness=1,
                                          emulated_server=True, learning_rate=1e-3), 3),
    },
    # Same scenario as ddp's filter_dapo, so the 1-process reference of the ddp suite serves both.
    "zero3": {
        "filter_dapo": (dict(loss_type="dapo"), 2),
        "snr_collapse_empty_step": (SNR_COLLAPSE, 3),
        "uecr": (UECR, 2),
        # ZeRO-3 with token-budget chunks: filler chunks keep the ranks' forwards and backwards in lockstep
        "budget_grpo_kl_accum": BUDGET_SCENARIOS["budget_grpo_kl_accum"],
        "budget_dapo": BUDGET_SCENARIOS["budget_dapo"],
        "balanced_grpo_kl_accum": BALANCED_SCENARIOS["balanced_grpo_kl_accum"],
        # the teacher's and the collapse detector's scoring in token-budget chunks (forward counts kept equal)
        "budget_uecr": ({**UECR, "micro_batch_tokens": BUDGET_TOKENS}, 2),
        "budget_snr_collapse": ({**SNR_COLLAPSE, "micro_batch_tokens": BUDGET_TOKENS}, 3),
        # PPO: the critic is a DeepSpeed engine of its own, partitioned like the policy (value clipping at work in
        # the ddp suite's "ppo"; here the SNR filter, collapse checks, an empty step and token-budget chunks)
        "ppo_collapse_budget": (PPO_COLLAPSE_BUDGET, 3),
        # overlapped generation (max_staleness 1, the HTTP emulator in the main process) under ZeRO-3: each sync
        # gathers the partitioned weights on the trainer's thread between two requests; the teacher (partitioned
        # too) scores each batch when it trains, in token-budget chunks
        "overlap_uecr_budget": ({**UECR, "micro_batch_tokens": BUDGET_TOKENS, "max_staleness": 1,
                                 "emulated_server": True, "learning_rate": 1e-3}, 3),
        # resume under ZeRO-3: both engines' shards (policy and critic, weights and optimizer) from the checkpoint
        "ppo_resume": (dict(loss_type="dapo", advantage="gae", critic_learning_rate=1e-2, resume_check=True), 2),
    },
}
# The one-process reference runs every scenario of every suite once (a name means the same scenario in each suite).
REFERENCE = {name: scenario for suite in SUITES.values() for name, scenario in suite.items()}
GLOBAL_BATCH = 16


def sokoban_rollout():
    """(levels, the multi-turn rollout with DigestPolicy as its generator, [env_return])."""
    from transformers import AutoTokenizer

    import rewards
    from envs.episode import EpisodeSettings
    from trainer.data.envs import level_dataset
    from trainer.rollout.multi_turn import ChatTokens, MultiTurnRollout, training_chat_template

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    rollout = MultiTurnRollout("sokoban", {"observation_format": "grid"}, EpisodeSettings(max_turns=2), 24, 0.5,
                               ChatTokens(tok, training_chat_template(tok)))
    rollout.backend = DigestPolicy(tok)
    return level_dataset("sokoban", 64, 10_000), rollout, [rewards.get_reward("env_return")]


@functools.cache
def policy_tokenizer():
    """The tiny model's tokenizer, loaded as TRL's GRPOTrainer loads it from the model path (left padding and
    truncation), once per process: a launch runs every scenario back to back and a load takes ~1 s. No trainer
    changes it (TRL only sets a missing pad token, and this tokenizer has one)."""
    from transformers import AutoProcessor

    tok = AutoProcessor.from_pretrained(tiny_model_path(), truncation_side="left", padding_side="left")
    assert tok.pad_token is not None
    return tok


def run_scenario(name: str, overrides: dict, steps: int, out: Path, world: int, deepspeed: bool) -> None:
    """Train ``steps`` optimizer steps and write this rank's decisions and the final parameters."""
    DECISIONS.clear()
    SELECTIONS.clear()
    ENTROPY_MASKS.clear()
    overrides = dict(overrides)
    accum = overrides.pop("gradient_accumulation_steps", 1)
    unique_prompts = overrides.pop("unique_prompts", False)  # refills may repeat a text within one batch
    if overrides.get("advantage") == "uecr":
        overrides["teacher_model_name_or_path"] = teacher_path()
    reward_funcs = overrides.pop("reward_funcs", [reward_token_parity, reward_length])
    train_dataset, rollout_func = prompt_dataset(64, unique=unique_prompts), deterministic_rollout_func
    if overrides.pop("long_tail", False):
        rollout_func = long_tail_rollout_func
    if overrides.pop("env_rollout", False):  # Sokoban episodes through the multi-turn rollout, deterministic policy
        train_dataset, rollout_func, reward_funcs = sokoban_rollout()
    emulated = None
    if overrides.pop("emulated_server", False):  # generation on an HTTP emulator of vLLM in the main process
        emulated, rollout_func = start_emulated_server(), None
        overrides.update(use_vllm=True, vllm_mode="server", vllm_server_base_url=emulated[1], weight_sync="disk",
                         vllm_importance_sampling_correction=False, vllm_server_timeout=60)
    resume_check = overrides.pop("resume_check", False)  # a checkpoint at step 1, and a second run resumed from it
    if resume_check:
        overrides.update(save_strategy="steps", save_steps=1)
    cpu_args = dict(use_cpu=False, ddp_backend="gloo") if deepspeed else {}
    config = {
        **BASE_ARGS,
        **cpu_args,
        "rollout_filter": "test_above_median_std",
        "per_device_train_batch_size": GLOBAL_BATCH // (world * accum),
        "gradient_accumulation_steps": accum,
        "max_steps": steps,
        "learning_rate": 1e-2,
        **overrides,
    }
    args = WinnowConfig(output_dir=str(out / f"{name}-run"), **config)
    build = functools.partial(WinnowGRPOTrainer, model=tiny_model_path(), processing_class=policy_tokenizer(),
                              reward_funcs=reward_funcs, train_dataset=train_dataset, rollout_func=rollout_func)
    trainer = build(args=args)
    teacher_calls: list[int] = []  # (local completion width) per teacher forward on this rank
    if trainer.hook("teacher") is not None:
        from trainer.methods.uecr.teacher import _core

        core = _core(trainer.hook("teacher").model)
        core.base_model.register_forward_pre_hook(
            lambda mod, a, kw: teacher_calls.append(int(kw["input_ids"].shape[1])), with_kwargs=True
        )
    policy_forwards: list[int] = []  # completion width of every policy forward on this rank (loss and no-grad passes)
    trainer.model.register_forward_pre_hook(
        lambda mod, a, kw: policy_forwards.append(int(kw["input_ids"].shape[1])), with_kwargs=True)
    if args.top_entropy_quantile < 1.0:
        original = trainer.get_high_entropy_mask

        def recorded(entropies, mask, threshold):
            out = original(entropies, mask, threshold)
            ENTROPY_MASKS.append(int(out.sum()))
            return out

        trainer.get_high_entropy_mask = recorded
    trainer.train()
    acc = trainer.accelerator
    rank = acc.process_index
    state = trained_state(trainer, deepspeed)
    record = {
        "decisions": DECISIONS,
        "selections": SELECTIONS,
        "entropy_mask_tokens": ENTROPY_MASKS,
        # this rank's own rows
        "local_completion_ids": trainer.generation_buffer.micro_batches[0]["completion_ids"].clone(),
        "log_history": trainer.state.log_history,
        "policy_forwards": policy_forwards,
        "world": world,
        # the last generation batch's rows on this rank (zero-weight fillers included): real tokens, longest row
        "dealt_tokens": sum(int(b["prompt_mask"].sum() + b["completion_mask"].sum())
                            for b in trainer.generation_buffer.micro_batches),
        "longest_row": max(int((b["prompt_mask"].sum(1) + b["completion_mask"].sum(1)).max())
                           for b in trainer.generation_buffer.micro_batches),
    }
    if trainer.hook("teacher") is not None:
        from trainer.methods.uecr.teacher import _core, score_tokens

        record["teacher_calls"] = list(teacher_calls)
        fixed = score_tokens(
            trainer.hook("teacher").model, FIXED_IDS, torch.ones_like(FIXED_IDS), 6, with_entropy=True, accelerator=acc
        )
        record["teacher_fixed_scores"] = (fixed["logps"][0], fixed["entropy"])
        teacher_params = _core(trainer.hook("teacher").model).parameters()
        record["teacher_partitioned"] = [int(p.ds_tensor.numel()) < int(p.ds_numel)
                                         for p in teacher_params if hasattr(p, "ds_tensor")]
    if deepspeed:
        params = list(acc.unwrap_model(trainer.model).parameters())
        record["partitioned"] = [int(p.ds_tensor.numel()) < int(p.ds_numel) for p in params if hasattr(p, "ds_tensor")]
        record["ds_skipped_steps"] = int(trainer.deepspeed.skipped_steps)
        if trainer.hook("ppo_critic") is not None:
            record["critic_skipped_steps"] = int(trainer.hook("ppo_critic").critic.model.skipped_steps)
    if trainer.hook("ppo_critic") is not None:
        critic = trainer.hook("ppo_critic").critic
        if deepspeed:
            record["critic_partitioned"] = [int(p.ds_tensor.numel()) < int(p.ds_numel)
                                            for p in critic.model.module.parameters() if hasattr(p, "ds_tensor")]
    if emulated is not None:
        if emulated[0] is not None:  # which weights generated each request, in the server's order
            record["generations"] = [e[1:] for e in emulated[0].log if e[0] == "generate"]
            record["overlaps"] = emulated[0].overlaps
        acc.wait_for_everyone()
        if emulated[0] is not None:
            emulated[0].stop()
    torch.save(record, out / f"{name}.rank{rank}.pt")
    if acc.is_main_process:
        torch.save({k: v.detach().float().cpu().clone() for k, v in state.items()}, out / f"{name}.params.pt")
    acc.wait_for_everyone()
    if resume_check:  # the same run resumed from its step-1 checkpoint (under ZeRO-3 each rank's shards)
        resumed = build(args=WinnowConfig(output_dir=str(out / f"{name}-resumed"), **config))
        resumed.train(resume_from_checkpoint=str(out / f"{name}-run" / "checkpoint-1"))
        state = trained_state(resumed, deepspeed)
        if acc.is_main_process:
            torch.save({k: v.detach().float().cpu().clone() for k, v in state.items()},
                       out / f"{name}.resumed.params.pt")
        acc.wait_for_everyone()


def start_emulated_server():
    """(the server on the main process, else None; its URL on every process): tests/server/emulated_vllm.py, whose
    completions depend only on the prompt and the weights it last loaded, so 1 and 2 processes are served alike."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
    from emulated_vllm import EmulatedVLLM

    state = PartialState()
    server = EmulatedVLLM(generation_s=0.05).start() if state.is_main_process else None
    url = [server.url if server is not None else None]
    if state.num_processes > 1:
        broadcast_object_list(url, from_process=0)
    return server, url[0]


def trained_state(trainer, deepspeed: bool) -> dict:
    """The policy's weights and, in a PPO run, the critic's (``critic.*``); collective under ZeRO-3 (the partitioned
    weights gathered), complete on the main process only."""
    acc = trainer.accelerator
    state = acc.get_state_dict(trainer.deepspeed if deepspeed else trainer.model_wrapped)
    if trainer.hook("ppo_critic") is not None:  # the critic's weights are part of the update too
        critic = trainer.hook("ppo_critic").critic
        critic_state = acc.get_state_dict(critic.model) if deepspeed else acc.unwrap_model(critic.model).state_dict()
        if acc.is_main_process:
            state = {**state, **{f"critic.{k}": v for k, v in critic_state.items()}}
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the per-rank results")
    parser.add_argument("--suite", choices=sorted(SUITES), required=True, help="which scenarios to run")
    parser.add_argument("--reference", action="store_true", help="single-process reference run (no launcher)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these scenarios of the suite (development)")
    cli = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    out = cli.out / ("reference" if cli.reference else f"world{world}" + ("-zero3" if deepspeed else ""))
    out.mkdir(parents=True, exist_ok=True)
    for name, (overrides, steps) in (REFERENCE if cli.reference else SUITES[cli.suite]).items():
        if cli.only is not None and name not in cli.only:
            continue
        run_scenario(name, overrides, steps, out, world, deepspeed)


if __name__ == "__main__":
    main()
