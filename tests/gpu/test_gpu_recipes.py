"""Issue 19 items 6, 7, 8, 11: static checks of the GPU recipes and launch configs (no GPU needed).

- every GPU recipe keeps a bounded number of checkpoints and waits long enough for a GPU server's first start;
- every server-mode recipe bounds the server's context explicitly (the launcher refuses to guess), and for the
  multi-turn environments the bound covers the longest first-turn prompt (measured with the Qwen tokenizer) plus the
  episode budget;
- DeepSpeed accumulates gradients in float32 (parsed by DeepSpeed's own config class).
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "launch"))
from trainer.server import launcher as vs  # noqa: E402

GPU_RECIPES = sorted(
    p for d in ("grpo", "grpodropout", "ragen", "uecr") for p in (REPO / "configs" / d).rglob("*.yaml")
)
ENV_TASKS = ("sokoban", "frozenlake")


def recipe(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_gpu_recipes_found():
    assert len(GPU_RECIPES) >= 90


# Runs whose every checkpoint an analysis reads keep them all: UECR-GRPO App. F.4 audits 17 checkpoints of the 1.7B
# ATOD run (tests/config/test_uecr_checkpoints.py); the count is still bounded by max_steps / save_steps, and the
# preflight's disk line prints the total.
KEEP_EVERY_CHECKPOINT = {"uecr/baselines/qwen3-1.7b-base-atod.yaml"}


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_gpu_recipe_bounds_checkpoints_and_server_wait(path):
    r = recipe(path)
    if str(path.relative_to(REPO / "configs")) in KEEP_EVERY_CHECKPOINT:
        assert "save_total_limit" not in r and r["max_steps"] > 0 and r["save_steps"] >= 1
    else:
        assert isinstance(r.get("save_total_limit"), int) and 1 <= r["save_total_limit"] <= 3, "save_total_limit"
    if r.get("use_vllm") and r.get("vllm_mode") == "server":
        assert r.get("vllm_server_timeout", 240) >= 900, (
            "vllm_server_timeout: a GPU server's first start takes minutes"
        )


@lru_cache(maxsize=None)
def longest_first_prompt(task: str, env_kwargs: str, settings: str, levels: int = 100) -> int:
    """Tokens of the longest first-turn prompt (system + first state, Qwen chat format) over ``levels`` levels."""
    from transformers import AutoTokenizer

    from envs import make_env
    from envs.episode import Episode, EpisodeSettings
    from trainer.tools.assets import TOKENIZER_DIRNAME, build_qwen3_tokenizer, cache_dir

    build_qwen3_tokenizer(cache_dir() / TOKENIZER_DIRNAME)
    tokenizer = AutoTokenizer.from_pretrained(str(cache_dir() / TOKENIZER_DIRNAME))
    worst = 0
    for seed in range(levels):
        episode = Episode(make_env(task, **json.loads(env_kwargs)), seed, EpisodeSettings(**json.loads(settings)))
        system, user = (m["content"] for m in episode.first_messages())
        text = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                "<|im_start|>assistant\n")
        worst = max(worst, len(tokenizer(text)["input_ids"]))
    return worst


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_server_context_is_bounded_explicitly(path):
    r = recipe(path)
    settings = vs.settings_from_recipe(str(path))
    assert "max_model_len" in settings, "no prompt bound: set max_prompt_tokens or vllm_max_model_length"
    if r["dataset_name"] in ENV_TASKS:
        episode = dict(max_turns=r["max_turns"], max_actions_per_turn=r["max_actions_per_turn"],
                       max_actions_per_episode=r["max_actions_per_episode"], format_penalty=r["format_penalty"],
                       max_tokens_hint=r["turn_max_tokens_hint"])
        prompt = longest_first_prompt(r["dataset_name"], json.dumps(r.get("env_kwargs") or {}, sort_keys=True),
                                      json.dumps(episode, sort_keys=True))
        margin = settings["max_model_len"] - prompt - r["max_completion_length"]
        assert margin >= 32, f"context {settings['max_model_len']} leaves {margin} tokens past the longest episode"
    else:
        assert r.get("max_prompt_tokens"), "single-turn prompts must be bounded (longer ones are dropped)"


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_timeouts_cover_one_generation_batch(path):
    """TRL sends a generation batch as one POST and the other ranks wait for it in broadcast_object_list, so
    vllm_request_timeout and ddp_timeout must cover the batch: rollouts x the server's context per sequence /
    (the preflight's assumed tokens/s per GPU x the recipe's server GPUs), computed here from the YAML by hand
    (TrainingArguments' ddp_timeout default 1800, ours for vllm_request_timeout 600); ddp_timeout above
    vllm_request_timeout, so a hung server is named by the request's error, not NCCL's watchdog."""
    from trainer.tools.preflight import GENERATION_TOKENS_PER_S_PER_GPU

    r = recipe(path)
    if not (r.get("use_vllm") and r.get("vllm_mode") == "server"):
        pytest.skip("not server mode")
    rollouts = r["per_device_train_batch_size"] * r["launch_processes"] * r["steps_per_generation"]
    tokens = vs.settings_from_recipe(str(path))["max_model_len"]
    gpus = r.get("vllm_server_tensor_parallel_size", 1)
    seconds = rollouts * tokens / (GENERATION_TOKENS_PER_S_PER_GPU * gpus)
    request, ddp = r.get("vllm_request_timeout", 600), r.get("ddp_timeout", 1800)
    assert request >= seconds, f"vllm_request_timeout {request} < {seconds:.0f} s for {rollouts} x {tokens} tokens"
    assert ddp >= seconds and ddp > request, f"ddp_timeout {ddp} vs {seconds:.0f} s and vllm_request_timeout"
    if gpus > 1:  # the size must split the model (config.json, else the published shape the preflight knows)
        from trainer.tools.preflight import model_config

        config, _ = model_config(r["model_name_or_path"])
        assert config and vs.tensor_parallel_problem(config, gpus) is None


def test_launcher_refuses_to_guess_the_context(tmp_path):
    (tmp_path / "model").mkdir()
    bad = tmp_path / "r.yaml"
    bad.write_text(f"model_name_or_path: {tmp_path / 'model'}\nmax_completion_length: 400\n")
    run = lambda *extra: subprocess.run([sys.executable, str(REPO / "launch" / "vllm_server.py"), "--config", str(bad),  # noqa: E731
                                         "--device", "cpu", "--python", sys.executable, "--dry-run", *extra],
                                        capture_output=True, text=True, timeout=120)
    out = run()
    assert out.returncode == 2 and "max_prompt_tokens" in out.stderr and "vllm_max_model_length" in out.stderr
    out = run("--max-model-len", "1024")
    assert out.returncode == 0 and "--max-model-len 1024" in out.stdout, out.stderr


@pytest.mark.parametrize("name", ["zero2.json", "zero3.json"])
def test_deepspeed_accumulates_gradients_in_fp32(name):
    """DeepSpeed's own parser: grad_accum_dtype resolves to float32 (its default is the model's bf16)."""
    from deepspeed.runtime.config import DeepSpeedConfig, DtypeEnum

    cfg = json.loads((REPO / "launch" / "deepspeed" / name).read_text())
    cfg.update({"bf16": {"enabled": True}, "fp16": {"enabled": False}, "gradient_accumulation_steps": 32,
                "gradient_clipping": 1.0, "train_batch_size": 128, "train_micro_batch_size_per_gpu": 4})
    cfg["zero_optimization"] = {k: (1e6 if v == "auto" else v) for k, v in cfg["zero_optimization"].items()}
    parsed = DeepSpeedConfig(cfg)
    assert parsed.grad_accum_dtype is not None and DtypeEnum(parsed.grad_accum_dtype).value is torch.float32


def test_zero3_overlaps_communication_with_compute():
    """DeepSpeed's own parser: zero3.json turns overlap_comm on (DeepSpeed's stage-3 default,
    deepspeed/runtime/zero/config.py:384-387; off, the parameter all-gathers and gradient reduce-scatters run on the
    compute stream, parameter_offload.py:195-196 and stage3.py:340-341, so ZeRO-3's prefetch overlaps nothing). The
    memory it costs is counted in trainer/tools/memory_estimate.py ``reduce_buckets``."""
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = json.loads((REPO / "launch" / "deepspeed" / "zero3.json").read_text())
    cfg.update({"bf16": {"enabled": True}, "fp16": {"enabled": False}, "gradient_accumulation_steps": 32,
                "gradient_clipping": 1.0, "train_batch_size": 128, "train_micro_batch_size_per_gpu": 4})
    cfg["zero_optimization"] = {k: (1e6 if v == "auto" else v) for k, v in cfg["zero_optimization"].items()}
    assert DeepSpeedConfig(cfg).zero_config.overlap_comm is True
