"""Recipe truth test: every recipe parses (no model is loaded), and every recipe that claims a paper's
experiment resolves to the values the paper states -- so a recipe cannot silently drift.

The table below is written from the papers (sources in each entry), not from the recipes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]
# training recipes; configs/eval/ holds evaluation configs (tests/eval/test_eval_configs.py)
RECIPES = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if p.relative_to(ROOT / "configs").parts[0] != "eval")

# GRPODropout paper, Appendix B.1, and the authors' code (hexuandeng/GRPODropout@4ad3b3b, "A:" below): the GRPO
# baseline, A:verl/examples/grpo_dropout/train.sh with configs/variants/base.env.
AUTHORS_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
GRPODROPOUT_GRPO_BASELINE = {
    "rollouts_per_generation_batch": 128 * 8,  # 128 prompts x 8 rollouts
    "prompts_per_generation_batch": 128,
    "optimizer_steps_per_generation": 2,  # mini-batch of 64 prompts
    "rollouts_per_optimizer_step": 64 * 8,
    "num_generations": 8,
    "learning_rate": 1e-6,
    "lr_scheduler_type": "constant",
    "weight_decay": 0.01,
    # A:verl/verl/workers/actor/dp_actor.py update_policy: loss_agg_mode token-mean on micro-batches of one sequence
    # (ppo_micro_batch_size_per_gpu 1, use_dynamic_bsz false), each divided by the accumulation count = the
    # per-sequence token mean averaged over sequences (TRL's grpo, not dapo's batch-wide token mean)
    "loss_type": "grpo",
    "epsilon": 0.2,
    "epsilon_high": 0.2,  # symmetric clip (no clip-higher in the baseline)
    # A:verl/verl/trainer/config/actor/actor.yaml clip_ratio_c 3.0, applied by the vanilla loss dp_actor.py calls
    "delta": 3.0,
    "beta": 0.0,  # no KL (use_kl_loss False), so no KL form to pin
    "entropy_coef": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,  # disabled (verl's -1)
    "max_completion_length": 8192,
    "max_prompt_tokens": 2048,
    "num_train_epochs": 1,
    # one epoch (App. B.1; train.sh TOTAL_EPOCHS 1) of 14,116 prompts = 110 batches of 128 (verl drops the last
    # partial one) x 2 optimizer steps
    "max_steps": (14116 // 128) * 2,
    "num_iterations": 1,  # ppo_epochs 1
    "enable_thinking": True,
    "dataset_name": "dapo_math_17k",
    # A:data/prepare_dapo17k_for_verl.py: the English view of open-r1's Processed DAPO-Math-17k (their train parquet
    # has question ids 0..14115, A:data/dapo17k/dapo17k_verl_train_view.json); raw problem under a system prompt
    "dataset_path": "open-r1/DAPO-Math-17k-Processed",
    "dataset_config": "en",
    "dataset_expected_rows": 14116,
    # verl's filter_overlong_prompts counts characters of the chat-templated prompt (A:verl/verl/utils/dataset/
    # rl_dataset.py:177, tokenize=False at :144) <= 2048; Qwen3's template adds 80 to system + user
    "dataset_max_prompt_chars": 1968,
    "prompt_template": "{problem}",
    "system_prompt": AUTHORS_SYSTEM_PROMPT,
    "use_vllm": True,
    # the authors' verl recomputes the old log-probs on the trainer (A:verl/verl/trainer/ppo/ray_trainer.py fit,
    # actor_rollout_wg.compute_log_prob) and has no sampler-ratio correction: TRL 1.16's default (on) is turned off
    "vllm_importance_sampling_correction": False,
    "filtered_updates": "fixed",  # nothing is removed without a dropout stage: always 2 optimizer steps
    "advantage": "grpo",
    "advantage_std": "unbiased",  # the authors ran verl: torch.std (ddof 1) + 1e-6
    "advantage_eps": 1e-6,
    # the rule-based correctness reward alone (0/1, A:verl/examples/grpo_dropout/reward.py), grading the whole
    # response, an unfinished <think> included (reward.py:140, :92-98, :147-149)
    "reward_funcs": ["math_accuracy_full_text"],
    "reward_weights": [1.0],
    "overlong_penalty": None,  # no overlong shaping in the GRPO setup (reward = compute_score_gt_math's 0/1 alone)
    # none of the Table 1 baselines' mechanisms (each row below adds exactly its own):
    "loss_variant": "none",  # TRL's clipped surrogate (no Clip-Cov / KL-Cov)
    "dynamic_sampling": False,
    "top_entropy_quantile": 1.0,  # every token in the loss
}

NO_DROPOUT = {"rollout_dropout": "none"}


def grpodropout_row(pos: bool, neg: bool, center: bool, p_wt: bool) -> dict:
    """A Table 2 row's marks (Pos., Neg., Center, P-wt.) as stage settings (paper §4.2): deleting positive
    candidates = restoring A <= 0 (eq. 7); Center x = no recentering; Center + P-wt = eq. 9. The advantages are
    recomputed over the kept rows wherever the row recenters: A:verl/examples/grpo_dropout/train.sh defaults
    RECOMPUTE_ADV_AFTER_SELECT to True for every selector, and the one variant without recentering,
    A:verl/examples/grpo_dropout/configs/variants/balance_neg_no_readv.env ("no advantage recompute / no
    re-centering"), sets it False with ADV_P_CENTER_MODE none -- the paper's Center x row, which collapses (§4.2)."""
    delete = {(True, False): "positive", (False, True): "negative", (True, True): "both"}[(pos, neg)]
    recenter = "prob_weighted" if center and p_wt else ("mean" if center else "none")
    return {**GRPODROPOUT_GRPO_BASELINE, **VERL_STEPS, "rollout_dropout": "grpodropout", "dropout_selector": "paper",
            "dropout_delete": delete, "dropout_recenter": recenter, "dropout_surprisal_basis": "mean",
            "dropout_zero_push_groups": "keep_all", "dropout_restandardize": center}


# A:verl/verl/workers/actor/dp_actor.py update_policy: the kept rows split into mini-batches of 512 (data.split), every
# micro-batch loss divided by the fixed accumulation count -> ceil(kept / 512) updates, a partial one smaller
VERL_STEPS = {"filtered_updates": "verl_minibatch"}
# A:verl/examples/grpo_dropout/configs/variants/balance.env ("main method": SELECT_METHOD balanced_push_zero,
# ADV_P_CENTER_MODE weighted_center) with train.sh's RECOMPUTE_ADV_AFTER_SELECT True and ENTROPY_LOGPROB_BASIS avg;
# selector_methods.py select_balanced_push_zero: an all-zero-push group keeps a random max(1, G // 4)
AUTHORS_BALANCE = {**GRPODROPOUT_GRPO_BASELINE, **VERL_STEPS, "rollout_dropout": "grpodropout",
                   "dropout_selector": "balanced_push", "dropout_zero_push_groups": "random_min_keep",
                   "dropout_restandardize": True, "dropout_recenter": "prob_weighted",
                   "dropout_surprisal_basis": "mean"}
PAPER_RECIPES = {
    **{f"configs/grpo/qwen3-{m}-dapo17k.yaml": ({**GRPODROPOUT_GRPO_BASELINE, **NO_DROPOUT}, f"Qwen/Qwen3-{M}")
       for m, M in (("1.7b", "1.7B"), ("4b", "4B"), ("8b", "8B"))},
    **{f"configs/grpodropout/qwen3-{m}-dapo17k.yaml": (AUTHORS_BALANCE, f"Qwen/Qwen3-{M}")
       for m, M in (("1.7b", "1.7B"), ("4b", "4B"), ("8b", "8B"))},
    # A:verl/examples/grpo_dropout/configs/variants/balance_neg.env:
    # SELECT_METHOD balanced_push_zero_add_negpush_negadv
    "configs/grpodropout/variants/qwen3-4b-dapo17k-balance_neg.yaml": (
        {**AUTHORS_BALANCE, "dropout_selector": "balanced_push_neg"}, "Qwen/Qwen3-4B"),
}
# Table 2 (§4.2): (model, Pos., Neg., Center, P-wt.) for every row with a deletion; the rows without deletion
# are the GRPO baselines above.
TABLE2 = [
    ("1.7b", True, True, True, True), ("1.7b", True, False, False, False), ("1.7b", True, False, True, False),
    ("1.7b", True, False, True, True),
    ("4b", True, True, True, True), ("4b", False, True, True, True), ("4b", True, False, False, False),
    ("4b", True, False, True, False), ("4b", True, False, True, True),
]
for m, pos, neg, center, p_wt in TABLE2:
    name = {(True, False): "pos", (False, True): "neg", (True, True): "both"}[(pos, neg)]
    c = "pwt" if center and p_wt else ("mean" if center else "none")
    PAPER_RECIPES[f"configs/grpodropout/table2/qwen3-{m}-del_{name}-center_{c}.yaml"] = (
        grpodropout_row(pos, neg, center, p_wt), f"Qwen/Qwen3-{m.upper()}")

# Table 1 baseline rows other than GRPO and GRPODropout, as the GRPODropout authors ran them (A: above): the GRPO
# baseline (ENABLE_SELECTOR=False, no rollout deleted) plus exactly the method's settings.
# TOTAL_TRAINING_STEPS of A:verl/examples/dapo/qwen3-*/run_dapo17k_base*.sh
DAPO_STEPS = {"1.7b": 110, "4b": 110, "8b": 220}
TABLE1_METHODS = {
    # full DAPO: A:verl/examples/dapo/qwen3-{1.7b,8b}/run_dapo17k_base.sh, qwen3-4b/run_dapo17k_base_bk.sh
    "dapo": {
        "epsilon": 0.2,  # clip_ratio_low
        "epsilon_high": 0.28,  # clip_ratio_high
        "delta": 10.0,  # clip_ratio_c 10 (dual-clip for A < 0; TRL's cap on the unclipped ratio)
        "loss_type": "grpo",  # token-mean on one-sequence micro-batches, as the GRPO row
        "dynamic_sampling": True,  # filter_groups.enable
        "dynamic_sampling_metric": "math_accuracy_full_text",  # filter_groups.metric acc: 0 < #correct < G
        "max_num_gen_batches": 3 * 10,  # 10 rounds of gen_batch_size 384 = 3 x 128 prompts; our round = 128 prompts
        "reward_funcs": ["math_accuracy_full_text", "overlong_penalty"],  # reward_manager dapo: task + overlong
        "reward_weights": [1.0, 1.0],
        "overlong_buffer_len": 4096,
        # penalty_factor 1.0 added to compute_score_gt_math's 0/1 score (A:verl/examples/grpo_dropout/reward.py:
        # score = float(acc)) -- the same 0/1 scale as math_accuracy
        "overlong_penalty_factor": 1.0,
        "overlong_penalty": (4096, 1.0),  # the shaping is live: (buffer, factor) with overlong_penalty in reward_funcs
        "beta": 0.0,  # no KL
        "entropy_coef": 0.0,  # no entropy bonus
    },
    # loss_mode=clip_cov, clip_cov_ratio 2e-4, clip_cov_lb 1.0, clip_cov_ub 5.0 (the GRPO setup's clip 0.2); verl's
    # clip_cov loss has no dual-clip
    "clip_cov": {"loss_variant": "clip_cov", "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0,
                 "clip_cov_ub": 5.0, "delta": None},
    # loss_mode=kl_cov with the repository's env files: kl_cov_ratio 0.002, ppo_kl_coef 1; no clipping at all
    "kl_cov": {"loss_variant": "kl_cov", "kl_cov_ratio": 0.002, "kl_cov_coef": 1.0, "delta": None},
    # A:verl/examples/grpo_dropout/configs/variants/high_entropy.env: loss_mode=high_entropy, top_entropy_quantile 0.2
    # on the GRPO setup (clip 0.2, the vanilla dual-clip 3 of A:verl/verl/trainer/ppo/high_entropy_policy_loss.py)
    "beyond8020": {"top_entropy_quantile": 0.2},
}
for method, changes in TABLE1_METHODS.items():
    for m, M in (("1.7b", "1.7B"), ("4b", "4B"), ("8b", "8B")):
        steps = {"max_steps": DAPO_STEPS[m] * 2} if method == "dapo" else {}
        PAPER_RECIPES[f"configs/grpodropout/table1/qwen3-{m}-{method}.yaml"] = (
            {**GRPODROPOUT_GRPO_BASELINE, **NO_DROPOUT, **changes, **steps}, f"Qwen/Qwen3-{M}")
# Beyond 80/20's second launcher, A:verl/examples/high_entropy/run_qwen3-4b.sh: the 4B DAPO script + the loss
PAPER_RECIPES["configs/grpodropout/table1/qwen3-4b-beyond8020-dapo.yaml"] = (
    {**GRPODROPOUT_GRPO_BASELINE, **NO_DROPOUT, **TABLE1_METHODS["dapo"], "top_entropy_quantile": 0.2,
     "max_steps": 110 * 2}, "Qwen/Qwen3-4B")
GRPODROPOUT_FAMILY = sorted(k for k in PAPER_RECIPES if k.startswith(("configs/grpo/", "configs/grpodropout/")))


# RAGEN-2 (arXiv:2604.06268 §4.4; mll-lab-nu/RAGEN@20daedc config/base.yaml): the main-table settings, and the
# filter exactly as scripts/runs/run_main_table_diff_algo.sh ran it (softmax top-p, include_zero, the
# released code's std score), with rho 0.9 (filter) vs 1.0 (no filter).
RAGEN_MAIN = {
    # RAGEN recomputes the old log-probs on the trainer (agent_trainer.py:1300-1311, compute_log_prob; the sampler's
    # rollout_log_probs feed only debug metrics there): no sampler-ratio correction, TRL 1.16's default (on) is off
    "vllm_importance_sampling_correction": False,
    "rollouts_per_generation_batch": 8 * 16,  # K = 128: P = 8 groups x G = 16
    "prompts_per_generation_batch": 8,
    "num_generations": 16,
    "rollouts_per_optimizer_step": 32,  # ppo_mini_batch_size 32
    "optimizer_steps_per_generation": 4,
    "max_steps": 400 * 4,  # 400 rollout-update iterations
    "learning_rate": 1e-6,
    "lr_scheduler_type": "constant",  # verl's actor default (no warm-up)
    "entropy_coef": 0.001,
    "beta": 0.0,  # no KL: base.yaml use_kl_loss False, kl_loss_coef 0; the main-table script keeps it off
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    # dual-clip: clip_ratio_c 3.0 (dp_actor.py:420 default; volcengine/verl@d62da49 actor/actor.yaml:69), which
    # bounds the ratio of negative-advantage tokens as TRL's delta does (tests/methods/test_grpodropout_fidelity.py)
    "delta": 3.0,
    "temperature": 1.0,
    "entropy_aggregation": "loss_type",  # dp_actor.py:442-446: agg_loss(entropy, mask, loss_agg_mode)
    "think_prefill": True,
    "reward_variance_stop_steps": 10,  # agent_trainer.py:1210-1241 (always on upstream)
    # ctx_manager.py:1259-1263: the generation prompt ends with <think> (enable_think True)
    "reward_variance_stop_ratio": 0.1,
    # agent_trainer.py:1482-1499: 5 validations in a row with val-env success < 0.01 stop the run (always on
    # upstream); the environment rows below run it, the single-turn ones have no validation set
    "low_success_stop_steps": 0,
    "low_success_stop_threshold": 0.01,
    "max_completion_length": 400,
    "rollout_filter": "snr",
    "snr_metric": "reward_std",
    "snr_strategy": "top_p",
    "snr_top_p_mode": "softmax",
    "snr_include_zero": True,
    "collapse_detection": True,
    "collapse_num_samples": 64,
    "collapse_every": 5 * 4,  # every 5 iterations
    "collapse_turns": "all",  # base.yaml:151-152: first_turn_enabled and multi_turn_enabled, both in every check
}
# scripts/runs/run_main_table_diff_algo.sh:226-245: GRPO = std-normalised, seq-mean-token-mean; DAPO = token-mean +
# clip-higher; Dr.GRPO = no std, seq-mean-token-sum. verl runs them on micro-batches of 1 sequence
# (config/base.yaml:12, use_dynamic_bsz false): token-mean and seq-mean-token-mean are both the per-sequence token mean
# averaged over the update's sequences (TRL's grpo); seq-mean-token-sum is TRL's dr_grpo x max_completion_length
# (dr_grpo_token_sum).
# Checked against verl's agg_loss by hand in tests/methods/test_ragen_aggregation.py.
# PPO and DAPO (run_main_table_diff_algo.sh get_algo_overrides; run_main_table_diff_size.sh / _model.sh for the
# model tables): algorithm.adv_estimator=gae, a critic from model_path (config/base.yaml critic.model.path), critic
# lr 1e-5 (critic.optim.lr), gamma = lam = 1 (algorithm.gamma / lam); verl's critic cliprange_value 0.5, grad_clip 1.0
RAGEN_PPO = {"advantage": "gae", "critic_model_name_or_path": None, "critic_learning_rate": 1e-5, "gae_gamma": 1.0,
             "gae_lambda": 1.0, "cliprange_value": 0.5, "critic_max_grad_norm": 1.0}
RAGEN_ALGOS = {
    "grpo": {"loss_type": "grpo", "dr_grpo_token_sum": False, "scale_rewards": "group"},
    "dapo": {"loss_type": "grpo", "dr_grpo_token_sum": False, **RAGEN_PPO},
    "ppo": {"loss_type": "grpo", "dr_grpo_token_sum": False, **RAGEN_PPO},
    "drgrpo": {"loss_type": "dr_grpo", "dr_grpo_token_sum": True, "scale_rewards": "none"},
}
RAGEN_TASKS = {"countdown": ("countdown", ["ragen_countdown"]),  # malformed = -0.1 only (es_manager.py:224-237)
               "metamathqa": ("metamathqa", ["math_accuracy", "answer_format_penalty"])}
RAGEN_RECIPES = {}
for task, (dataset, rewards) in RAGEN_TASKS.items():
    for algo, algo_settings in RAGEN_ALGOS.items():
        for filt, rho in (("nofilter", 1.0), ("topp0.9", 0.9)):
            row = {**RAGEN_MAIN, **algo_settings, "snr_value": rho, "dataset_name": dataset, "reward_funcs": rewards}
            RAGEN_RECIPES[f"configs/ragen/{task}-{algo}-{filt}.yaml"] = (row, "Qwen/Qwen2.5-3B")
            if algo == "ppo":  # the model-size and model-type tables are PPO runs
                for size in ("0.5B", "1.5B", "7B", "3B-Instruct"):
                    rel = f"configs/ragen/variants/qwen2.5-{size.lower()}-{task}-ppo-{filt}.yaml"
                    RAGEN_RECIPES[rel] = (row, f"Qwen/Qwen2.5-{size}")
# Sokoban and FrozenLake (§4.4 "max 5 turns, 2 actions per turn, 10 per trajectory"; reference §3-5): the same
# optimisation, the episode settings, and a completion budget that holds 5 turns of <= 400 sampled tokens.
RAGEN_EPISODE = {"max_turns": 5, "max_actions_per_turn": 2, "max_actions_per_episode": 10, "format_penalty": -0.1,
                 "turn_max_tokens": 400, "turn_max_tokens_hint": 120, "env_eval_levels": 512,
                 "env_eval_temperature": 0.5, "max_completion_length": 3072, "reward_funcs": ["env_return"],
                 "num_generations_eval": 1, "val_before_train": True, "low_success_stop_steps": 5}
RAGEN_ENVS = {
    "sokoban": {"dim_room": [6, 6], "num_boxes": 1, "search_depth": 300, "max_steps": 100,
                "observation_format": "grid_coord"},
    # RAGEN's FrozenLakeEnvConfig p 0.9 (config.py:9); deterministic as _3_frozen_lake.yaml:23 and the main-table
    # script
    "frozenlake": {"size": 4, "p": 0.9, "success_rate": 1.0, "max_steps": 100, "observation_format": "grid_coord"},
}
for env, env_kwargs in RAGEN_ENVS.items():
    for algo, algo_settings in RAGEN_ALGOS.items():
        for filt, rho in (("nofilter", 1.0), ("topp0.9", 0.9)):
            row = {**RAGEN_MAIN, **algo_settings, **RAGEN_EPISODE, "snr_value": rho, "dataset_name": env,
                   "env_kwargs": env_kwargs}
            RAGEN_RECIPES[f"configs/ragen/{env}-{algo}-{filt}.yaml"] = (row, "Qwen/Qwen2.5-3B")
            if algo == "ppo":
                RAGEN_RECIPES[f"configs/ragen/variants/qwen2.5-3b-instruct-{env}-ppo-{filt}.yaml"] = (
                    row, "Qwen/Qwen2.5-3B-Instruct")
                if env == "frozenlake":
                    # the slippery sweep as A:scripts/runs/run_frozen_lake_slipper_rate_sweep.sh (RAGEN@af6882d) ran
                    # it, at slip 20 % (success_rate = 1 - rate): the PPO row with entropy_coeff=0, token-mean on
                    # actor and critic micro-batches of 4 (ppo_micro_batch_size_per_gpu=4: TRL's bnpo on 4 rows per
                    # process), include_zero False in filter mode and True without the filter
                    RAGEN_RECIPES[f"configs/ragen/variants/qwen2.5-3b-frozenlake-slippery0.8-ppo-{filt}.yaml"] = (
                        {**row, "env_kwargs": {**env_kwargs, "success_rate": 0.8}, "entropy_coef": 0.0,
                         "loss_type": "bnpo", "micro_batch_rows": 4, "snr_include_zero": filt == "nofilter"},
                        "Qwen/Qwen2.5-3B")
PAPER_RECIPES.update(RAGEN_RECIPES)


# UECR-GRPO ("When and Where to Trust the Teacher", §5.1, F.4, F.6; [proposed] / [reconstructed] where the paper is
# silent): within a scale every row shares the data, decoding,
# optimizer, clipping and reference-KL settings (§5.1), so each row is this setup plus exactly its method.
UECR_SETUP = {
    "vllm_importance_sampling_correction": False,  # §5.1 names no sampler-ratio correction (verl-style recompute)
    "rollouts_per_generation_batch": 126 * 8,  # global prompt batch 126, G = 8
    "prompts_per_generation_batch": 126,
    "num_generations": 8,
    # [proposed] 1 PPO epoch over one mini-batch = the whole batch (the paper states no mini-batch size)
    "optimizer_steps_per_generation": 1,
    "rollouts_per_optimizer_step": 126 * 8,
    "num_iterations": 1,  # 1 PPO epoch
    "learning_rate": 1e-6,
    "lr_scheduler_type": "constant",  # [proposed] verl's actor default (no warm-up)
    "loss_type": "dapo",  # [proposed] token-mean (reference §1.6: the paper's actor-loss appendix is missing)
    "epsilon": 0.2,
    "epsilon_high": 0.2,  # symmetric clip 0.2
    "delta": None,
    "beta": 0.001,  # actor-loss reference KL low_var_kl (k3, TRL's estimator) 0.001; no reward KL
    "entropy_coef": 0.0,
    "temperature": 0.7,
    "top_p": 0.95,
    "top_k": 20,
    "max_prompt_tokens": 2048,
    "max_completion_length": 16384,
    "enable_thinking": False,  # non-thinking mode in training and evaluation
    "dataset_name": "deepmath_103k",
    # §5.1: DeepMath-103K (its public release), difficulty bounds per scale (UECR_SCALES); the paper states no row
    # count for either scale (the 4B's "sampled subset" has no stated size), so no row guard is pinned
    "dataset_path": "zwhe99/DeepMath-103K",
    "dataset_config": None,
    "dataset_expected_rows": None,
    # [proposed] the paper states only that the verifier reads the extracted \boxed{} answer (F.3): the loader's
    # step-by-step + \boxed{} instruction after the problem, no system prompt
    "prompt_template": "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
    "system_prompt": None,
    "use_vllm": True,
    "reward_funcs": ["math_accuracy"],  # rule-based verifier on the extracted \boxed{} answer
    "reward_weights": [1.0],
    "overlong_penalty": None,  # no length shaping: the verifier's 0/1 alone (F.3, F.6)
    # F.4: population std + 1e-6; the teacher baselines' group-relative part uses PUU's normalisation (reference §1.6)
    "advantage_std": "population",
    "advantage_eps": 1e-6,
    "rollout_filter": "none",
    "rollout_dropout": "none",
    "dynamic_sampling": False,
    "top_entropy_quantile": 1.0,
}
# F.6 / §5.1: student, teacher, DeepMath-103K difficulty range, steps, main recipe. The paper's teachers
# (Qwen3-4B-GRPO, Qwen3-8B-Math-GRPO) are the authors' GRPO-trained checkpoints, not public: the recipes name the
# public base model of each as a stand-in (their headers say so), and these entries pin that stand-in.
UECR_SCALES = {
    "qwen3-1.7b-base": ("Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-4B", (5, 7), 515,
                        "qwen3-1.7b-base-deepmath-teacher-qwen3-4b"),
    "qwen3-4b": ("Qwen/Qwen3-4B", "Qwen/Qwen3-8B", (6, 8), 160, "qwen3-4b-deepmath-teacher-qwen3-8b"),
}
UECR_PUU = {"advantage": "puu", "loss_variant": "none", "uecr_alpha": 1.0,  # alpha 1.0 in all runs (§5.3)
            "uecr_normalization": "joint", "uecr_eps": 1e-6}  # joint utility, population std + 1e-6 (F.4)
UECR_FULL = {
    **UECR_PUU,
    "advantage": "uecr",
    "uecr_rho": 0.5, "uecr_tau_delta": 1.0, "uecr_tau_h": 2.0,  # [proposed] reference §1.6 (no paper values, F.7)
    # [reconstructed] the ECR form of reference §1.5
    "uecr_direction": "tanh", "uecr_confidence": "exp", "uecr_projection_norm": "one_plus_mean",
    "uecr_use_entropy": True, "uecr_use_projection": True, "uecr_weight_full_advantage": False,
    "uecr_signed_gap": True,
}
# Table 2's baselines (§5.1 "Baselines"; reference §2.6-2.9) and Table 3's "+ PUU" (ECR off)
UECR_BASELINES = {
    "grpo": {"advantage": "grpo", "loss_variant": "none"},
    "pg_opd": {"advantage": "pg_opd", "loss_variant": "none", "opd_coef": 1.0},  # [proposed] tinker-cookbook's 1.0
    "naive_hybrid": {"advantage": "grpo", "loss_variant": "naive_hybrid", "opd_coef": 1.0},  # [reconstructed] 1 + 1
    "distilled_rl": {"advantage": "distilled_rl", "loss_variant": "none", "distilled_rl_kappa": 2.0},  # [proposed]
    "atod": {"advantage": "atod", "loss_variant": "none", "atod_lambda_start": 1.0, "atod_lambda_end": 0.1,
             "atod_anneal_steps": 0, "atod_kappa_omega": 1.0},  # [proposed]; anneal 0 = over the whole run
    "puu": UECR_PUU,
}
# Table 3 and F.7 (Qwen3-1.7B-Base student only; "Task only" = the GRPO baseline), each one change to PUU or UECR
UECR_ABLATIONS = {
    "separate_norm": {**UECR_PUU, "uecr_normalization": "separate"},  # Table 3 "Separate norm." (ECR off)
    "rho0": {**UECR_FULL, "uecr_rho": 0.0},  # F.7 (1): recovers PUU
    "no_entropy": {**UECR_FULL, "uecr_use_entropy": False},  # F.7 (2): c = 1, projection kept
    "no_projection": {**UECR_FULL, "uecr_use_projection": False},  # F.7 (3): mu^c = 0
    "weight_full": {**UECR_FULL, "uecr_weight_full_advantage": True},  # F.7 (4): w on the full A_U
    "alpha0": {**UECR_FULL, "uecr_alpha": 0.0},  # F.7 (5): alpha = 0 with ECR
    "no_signed_gap": {**UECR_FULL, "uecr_signed_gap": False},  # F.7 (6): no signed gap
}
UECR_RECIPES = {}
for pair, (student, teacher, (lo, hi), steps, main) in UECR_SCALES.items():
    scale = {**UECR_SETUP, "max_steps": steps, "dataset_kwargs": {"min_difficulty": lo, "max_difficulty": hi}}
    scored = {**scale, "teacher_model_name_or_path": teacher}  # the same frozen scorer for every teacher row
    UECR_RECIPES[f"configs/uecr/{main}.yaml"] = ({**scored, **UECR_FULL}, student)
    for name, method in UECR_BASELINES.items():
        setup = {**scale, "teacher_model_name_or_path": None} if name == "grpo" else scored  # GRPO loads no teacher
        UECR_RECIPES[f"configs/uecr/baselines/{pair}-{name}.yaml"] = ({**setup, **method}, student)
    if pair == "qwen3-1.7b-base":
        for name, method in UECR_ABLATIONS.items():
            UECR_RECIPES[f"configs/uecr/ablations/{pair}-{name}.yaml"] = ({**scored, **method}, student)
PAPER_RECIPES.update(UECR_RECIPES)

UECR_FIELDS = ("teacher_model_name_or_path", "uecr_alpha", "uecr_rho", "uecr_tau_delta", "uecr_tau_h", "uecr_eps",
               "uecr_normalization", "uecr_use_entropy", "uecr_use_projection", "uecr_weight_full_advantage",
               "uecr_signed_gap", "uecr_direction", "uecr_confidence", "uecr_projection_norm", "opd_coef",
               "distilled_rl_kappa", "atod_lambda_start", "atod_lambda_end", "atod_anneal_steps", "atod_kappa_omega")


def parse_here(path: Path, *extra: str):
    """Parse a recipe on this CPU machine: GPU recipes say bf16, which TrainingArguments rejects without a
    GPU, so precision is overridden (it is not among the values a paper row checks)."""
    import yaml

    cpu = ["--bf16", "false", "--use_cpu", "true"] if yaml.safe_load(path.read_text()).get("bf16") else []
    return parse_recipe(["--config", str(path), *cpu, *extra])


def loader_kwargs(task) -> dict:
    """The keyword arguments the recipe's dataset loader runs with: its signature defaults + dataset_kwargs."""
    import inspect

    from trainer.data.common import _REGISTRY
    from trainer.data.math_hub import DAPO_PROCESSED_HUB_ID

    params = inspect.signature(_REGISTRY[task.dataset_name]).parameters
    kw = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
    kw.update(task.dataset_kwargs or {})
    if kw.get("config") is None and kw.get("path") == DAPO_PROCESSED_HUB_ID:
        kw["config"] = "en"  # the loader's choice for that repo (tests/data/test_data.py checks it does)
    return kw


def resolved(path: Path, *extra: str) -> dict:
    """The values a paper states, computed from the parsed recipe (defaults included)."""
    task, args, model = parse_here(path, *extra)
    data = loader_kwargs(task)
    procs = task.launch_processes or 1
    per_micro_step = args.per_device_train_batch_size * procs
    rollouts_per_generation = per_micro_step * args.steps_per_generation
    return {
        "model": model.model_name_or_path,
        "rollouts_per_generation_batch": rollouts_per_generation,
        "prompts_per_generation_batch": rollouts_per_generation // args.num_generations,
        "optimizer_steps_per_generation": args.steps_per_generation * args.num_iterations
                                          / args.gradient_accumulation_steps,
        "rollouts_per_optimizer_step": per_micro_step * args.gradient_accumulation_steps,
        "micro_batch_rows": args.per_device_train_batch_size,  # a process's micro-batch: what bnpo's token mean spans
        "num_generations": args.num_generations,
        "learning_rate": args.learning_rate,
        "lr_scheduler_type": str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)),
        "weight_decay": args.weight_decay,
        "loss_type": args.loss_type,
        "epsilon": args.epsilon,
        "epsilon_high": args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        "beta": args.beta,
        "entropy_coef": args.entropy_coef,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k or 0,
        "max_completion_length": args.max_completion_length,
        "max_prompt_tokens": task.max_prompt_tokens,
        "num_train_epochs": args.num_train_epochs,
        "num_iterations": args.num_iterations,
        "enable_thinking": (args.chat_template_kwargs or {}).get("enable_thinking"),
        "dataset_name": task.dataset_name,
        "use_vllm": args.use_vllm,
        "warmup_steps": args.warmup_steps,
        "advantage": args.advantage,
        "advantage_std": args.advantage_std,
        "advantage_eps": args.advantage_eps,
        "rollout_dropout": args.rollout_dropout,
        "dropout_selector": args.dropout_selector,
        "dropout_delete": args.dropout_delete,
        "dropout_recenter": args.dropout_recenter,
        "dropout_surprisal_basis": args.dropout_surprisal_basis,
        "dropout_zero_push_groups": args.dropout_zero_push_groups,
        "dropout_restandardize": args.dropout_restandardize,
        "filtered_updates": args.filtered_updates,
        "vllm_importance_sampling_correction": args.vllm_importance_sampling_correction,
        "max_steps": args.max_steps,
        "scale_rewards": args.scale_rewards,
        "reward_funcs": list(task.reward_funcs),
        # TRL: reward_weights None = 1.0 for every reward function
        "reward_weights": list(args.reward_weights) if args.reward_weights is not None
                          else [1.0] * len(task.reward_funcs),
        "overlong_buffer_len": task.overlong_buffer_len,
        "overlong_penalty_factor": task.overlong_penalty_factor,
        # the penalty that is applied: (buffer, factor) when the overlong_penalty reward is in use, else None (the
        # two fields above have defaults that are inert without that reward)
        "overlong_penalty": ((task.overlong_buffer_len, task.overlong_penalty_factor)
                             if "overlong_penalty" in task.reward_funcs else None),
        "dataset_kwargs": task.dataset_kwargs,
        "dataset_path": data.get("path"),
        "dataset_config": data.get("config"),
        "dataset_expected_rows": data.get("expected_rows"),
        "dataset_max_prompt_chars": data.get("max_prompt_chars"),
        "prompt_template": data.get("prompt_template"),
        "system_prompt": data.get("system_prompt"),
        "num_generations_eval": args.num_generations_eval,
        **{k: getattr(task, k) for k in ("env_kwargs", "max_turns", "max_actions_per_turn", "max_actions_per_episode",
                                          "format_penalty", "turn_max_tokens", "turn_max_tokens_hint",
                                          "env_eval_levels", "env_eval_temperature")},
        **{k: getattr(args, k) for k in UECR_FIELDS},
        **{k: getattr(args, k) for k in ("loss_variant", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
                                          "kl_cov_ratio", "kl_cov_coef", "top_entropy_quantile", "delta",
                                          "dynamic_sampling", "dynamic_sampling_metric", "max_num_gen_batches")},
        **{k: getattr(args, k) for k in ("rollout_filter", "snr_metric", "snr_strategy", "snr_top_p_mode",
                                          "snr_include_zero", "snr_value", "collapse_detection",
                                          "collapse_num_samples", "collapse_every", "collapse_turns", "think_prefill",
                                          "entropy_aggregation", "reward_variance_stop_steps",
                                          "reward_variance_stop_ratio", "val_before_train", "dr_grpo_token_sum",
                                          "low_success_stop_steps", "low_success_stop_threshold")},
        **{k: getattr(args, k) for k in ("critic_model_name_or_path", "critic_learning_rate", "critic_weight_decay",
                                          "critic_max_grad_norm", "cliprange_value", "vf_coef", "gae_gamma",
                                          "gae_lambda")},
    }


def test_there_are_recipes():
    assert len(RECIPES) >= 4
    on_disk = {str(p.relative_to(ROOT)) for p in RECIPES}
    missing = set(PAPER_RECIPES) - on_disk
    assert not missing, f"paper rows without a recipe: {sorted(missing)}"


@pytest.mark.parametrize(
    "path", RECIPES, ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_recipe_parses(path):
    task, args, model = parse_here(path)
    assert args.output_dir and model.model_name_or_path


def _same(got, expected) -> bool:
    """Numbers up to float noise; anything approx cannot compare (mappings holding lists) exactly."""
    try:
        return got == pytest.approx(expected)
    except TypeError:
        return got == expected


@pytest.mark.parametrize("rel", sorted(PAPER_RECIPES))
def test_paper_recipe_matches_paper(rel):
    expected, model = PAPER_RECIPES[rel]
    got = resolved(ROOT / rel)
    assert got["model"] == model
    mismatches = {k: (got[k], v) for k, v in expected.items() if not _same(got[k], v)}
    assert not mismatches, f"{rel} drifted from the paper (got, paper): {mismatches}"
    assert got["warmup_steps"] == 0  # constant schedule without warm-up


@pytest.mark.parametrize("rel", sorted(UECR_RECIPES))
def test_uecr_recipes_bound_each_forward_by_tokens(rel):
    """The UECR rows score 16k-token responses with a frozen teacher: a token budget makes the teacher's forwards
    length-sorted and trimmed instead of teacher_micro_batch_size rows padded to the batch's longest (issue 32, C.8).
    The budget is exactly the per_device_train_batch_size rows of prompt + completion bound a micro-step held, so the
    policy backward's memory bound does not move."""
    task, args, _ = parse_here(ROOT / rel)
    assert args.micro_batch_tokens == args.per_device_train_batch_size * (
        task.max_prompt_tokens + args.max_completion_length) == 2 * 18432


def test_readme_names_every_recipe():
    """configs/README.md maps the papers' tables to recipe files: every YAML under configs/ must appear in it."""
    import re

    readme = (ROOT / "configs" / "README.md").read_text()
    named = set(re.findall(r"(?<![\w/.-])configs/[\w./-]+?\.yaml\b", readme))
    every = {str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml")}
    assert not every - named, f"configs/README.md does not name: {sorted(every - named)}"
    assert not named - every, f"configs/README.md names files that do not exist: {sorted(named - every)}"


def test_cli_overrides_beat_the_recipe():
    task, args, _ = parse_here(ROOT / sorted(PAPER_RECIPES)[0], "--learning_rate", "3e-6")
    assert args.learning_rate == 3e-6


def test_unknown_recipe_key_is_an_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "model_name_or_path: offline:tiny-qwen3\noutput_dir: out\nuse_cpu: true\nbf16: false\nlearning_rat: 1e-6\n"
    )
    with pytest.raises(ValueError, match="learning_rat"):
        parse_recipe(["--config", str(bad)])


@pytest.mark.parametrize("key, value", [
    ("snr_value", "[0.9, 1.0]"), ("learning_rate", "fast"), ("max_turns", "{a: 1}"),
    ("collapse_detection", "maybe"), ("reward_funcs", "3"), ("num_generations", "2.5")])
def test_wrong_value_type_is_an_error_naming_the_key(tmp_path, key, value):
    """TRL's parser passes YAML lists, mappings and numbers to argparse as defaults, unconverted: the recipe
    type check (trainer/config/yaml_types.py) names the key instead of an unrelated error later or silent
    acceptance."""
    from trainer.config.core import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"model_name_or_path: offline:tiny-qwen3\noutput_dir: out\nuse_cpu: true\nbf16: false\n{key}: {value}\n"
    )
    with pytest.raises(ConfigError, match=key):
        parse_recipe(["--config", str(bad)])


def test_yaml_numbers_written_as_strings_still_parse(tmp_path):
    ok = tmp_path / "ok.yaml"  # YAML 1.1 reads 1e-6 as a string; argparse converts it, so it stays legal
    ok.write_text(
        "model_name_or_path: offline:tiny-qwen3\noutput_dir: out\nuse_cpu: true\nbf16: false\nlearning_rate: 1e-6\n"
    )
    _, args, _ = parse_recipe(["--config", str(ok)])
    assert args.learning_rate == 1e-6


# The reference-KL form each paper's authors trained with, per recipe family (written from their code/papers):
# "none" = no KL term (beta 0; TRL then computes no KL and use_bias_correction_kl has no effect);
# "low_var_kl" = verl's k3 estimator exp(ref - logp) - (ref - logp) - 1 with no importance-ratio factor, i.e.
# TRL's use_bias_correction_kl=False (TRL 1.16 defaults to True: k3 x ratio, a different gradient even on-policy).
KL_FORMS = {
    "configs/grpo/": ("none", 0.0),  # GRPODropout App. B.1: no KL
    "configs/grpodropout/": ("none", 0.0),  # the authors' scripts: kl_coef 0, kl_loss_coef 0
    # mll-lab-nu/RAGEN@2468d7c:scripts/runs/run_main_table_diff_algo.sh: use_kl_loss=False for every row
    "configs/ragen/": ("none", 0.0),
    "configs/uecr/": ("low_var_kl", 0.001),  # UECR-GRPO App. F.6: actor-loss low_var_kl 0.001, reward KL off
}


@pytest.mark.parametrize("rel", sorted(PAPER_RECIPES))
def test_paper_recipe_uses_its_authors_kl_form(rel):
    """One KL definition: the recipe's beta and use_bias_correction_kl give exactly the KL its authors used."""
    (form, beta), = [v for prefix, v in KL_FORMS.items() if rel.startswith(prefix)]
    _, args, _ = parse_here(ROOT / rel)
    assert args.beta == beta, f"{rel}: beta {args.beta}, the authors' KL coefficient is {beta}"
    if form == "low_var_kl":
        assert args.use_bias_correction_kl is False, f"{rel}: verl's low_var_kl has no ratio factor"


@pytest.mark.parametrize("rel", sorted(RAGEN_RECIPES))
def test_ragen_recipe_updates_and_empty_stop_follow_upstream(rel):
    """RAGEN takes ceil(kept rollouts / ppo_mini_batch_size 32) optimizer steps per iteration
    (mll-lab-nu/RAGEN@20daedc:ragen/trainer/agent_trainer.py:1190-1200) and stops after
    rollout_filter_empty_stop_steps = 5 empty iterations (config/base.yaml:66)."""
    _, args, _ = parse_here(ROOT / rel)
    assert args.filtered_updates == "proportional"
    assert args.empty_batch_stop_steps == 5
    assert resolved(ROOT / rel)["rollouts_per_optimizer_step"] == 32


@pytest.mark.parametrize("rel", sorted(RAGEN_RECIPES))
def test_ragen_low_success_stop_reads_upstreams_validation_schedule(rel):
    """RAGEN validates every test_freq = 10 iterations (config/base.yaml:119) and stops after 5 validations in a row
    with success < 0.01 (agent_trainer.py:1475-1499): the environment recipes evaluate every 10 x 4 optimizer steps, so
    their stop counts the same validations; the single-turn ones have no validation set and keep it off."""
    _, args, _ = parse_here(ROOT / rel)
    if args.low_success_stop_steps:
        assert str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "steps" and args.eval_steps == 40
    else:
        assert str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "no"


@pytest.mark.parametrize("rel", sorted(RAGEN_RECIPES))
def test_ragen_recipe_collapse_budget_scores_the_whole_trajectory_sample(rel):
    """RAGEN scores all 64 trajectory-uniform draws under all 64 drawn contexts (collapse_metrics.py:168-180, no
    token cap): the budget must hold 64 x 64 pairs of the longest sequence the recipe can produce (the server's
    context, or the prompt cap + the completion), so the sample is never cut."""
    task, args, _ = parse_here(ROOT / rel)
    longest = args.vllm_max_model_length or task.max_prompt_tokens + args.max_completion_length
    assert args.collapse_max_tokens >= args.collapse_num_samples ** 2 * longest, (
        f"{rel}: collapse_max_tokens {args.collapse_max_tokens} < 64 x 64 x {longest}")


def test_grpodropout_recipes_render_the_authors_training_prompt(tmp_path):
    """Each GRPODropout-family recipe's loader settings, run on a local copy in the Processed schema, give the
    authors' training messages byte for byte (their row 5, hexuandeng/GRPODropout@4ad3b3b:
    data/dapo17k/dapo17k_verl_train_view.json), and the row-count guard trips on any other view."""
    from harness import write_rows

    from trainer.data import load_task_dataset

    problem = "For which $n$ is $n^4 + 6n^3 + 11n^2 + 3n + 31$ a perfect square?"
    authors = [
        {"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
        {"role": "user", "content": problem},
    ]
    local = write_rows([{"prompt": problem, "solution": "10"}], tmp_path / "en.parquet")
    seen = {}
    for rel in GRPODROPOUT_FAMILY:
        task, _, _ = parse_here(ROOT / rel)
        kw = {k: v for k, v in (task.dataset_kwargs or {}).items()}
        key = repr(sorted(kw.items()))
        if key not in seen:
            rows = kw.pop("expected_rows", None)
            ds = load_task_dataset(task.dataset_name, path=local, cache_dir=str(tmp_path / "c"), **kw)
            with pytest.raises(ValueError, match="expected_rows"):
                load_task_dataset(
                    task.dataset_name, path=local, cache_dir=str(tmp_path / "c"), expected_rows=rows, **kw
                )
            seen[key] = ds["prompt"][0]
        assert seen[key] == authors, rel


PAPER_FOLDERS = ("grpo", "grpodropout", "ragen", "uecr")


@pytest.mark.parametrize("path", [p for p in RECIPES if p.relative_to(ROOT / "configs").parts[0] in PAPER_FOLDERS],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_paper_recipes_train_without_trls_importance_sampling_correction(path):
    """TRL 1.16 turns vllm_importance_sampling_correction on by default; none of the papers' code has it (verl
    recomputes the old log-probs on the trainer). Every paper recipe turns it off in its own file and says why in its
    header (issue 34, A.1), and the parsed run has it off."""
    import yaml

    text = path.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    assert yaml.safe_load(text)["vllm_importance_sampling_correction"] is False
    assert "vllm_importance_sampling_correction on by default" in header and "recomputes the old log-probs" in header
    _, args, _ = parse_here(path)
    assert args.use_vllm and args.vllm_importance_sampling_correction is False


@pytest.mark.parametrize("sampler,named", [({"top_k": 2}, "top_k=2"), ({"top_p": 0.95}, "top_p=0.95"),
                                           ({"min_p": 0.05}, "min_p=0.05")])
def test_correction_under_a_truncating_sampler_is_refused_naming_both_fields(tmp_path, sampler, named):
    """Under top-k / top-p / min-p, vLLM's processed log-probs are of the truncated distribution, the trainer's of the
    full softmax: TRL's correction would shrink every sequence's weight exponentially in its length (issue 34, A.2).
    Refused before anything loads; with the correction off, or an untruncated sampler, the same recipe parses."""
    from trainer.config.core import ConfigError

    recipe = ROOT / "configs/demo/tiny-sokoban-vllm-server.yaml"
    flags = [arg for key, value in sampler.items() for arg in (f"--{key}", str(value))]
    with pytest.raises(ConfigError) as refused:
        parse_here(recipe, "--output_dir", str(tmp_path), "--vllm_importance_sampling_correction", "true", *flags)
    message = str(refused.value)
    assert "vllm_importance_sampling_correction: is on" in message and named in message
    assert "\n" not in message
    _, args, _ = parse_here(recipe, "--output_dir", str(tmp_path), "--vllm_importance_sampling_correction", "false",
                            *flags)
    assert args.vllm_importance_sampling_correction is False
    _, args, _ = parse_here(recipe, "--output_dir", str(tmp_path), "--vllm_importance_sampling_correction", "true")
    assert args.vllm_importance_sampling_correction is True  # TRL's default stays where the sampler keeps the softmax
