"""Token-budget micro-batches (``micro_batch_tokens``) against TRL's fixed row micro-batches, side by side on the
same rows: the loss phase (forward + backward over a generation batch) and the old-policy log-prob pass (no grad).

Two sections, each one generation batch of rows in TRL's padded layout (prompts left-padded, completions
right-padded to the batch's longest completion):

- ``synthetic``: the tiny Qwen3 (vocabulary 151,936, so the LM head dominates as in real scoring) on ``--rows``
  rows whose completion lengths are lognormal with p99/p50 = ``--tail`` (sigma = ln(tail) / 2.326), median
  ``--median`` tokens, capped at ``--cap``; prompts are ``--prompt`` tokens.
- ``demo``: the CPU demo's own model and length distribution -- ``configs/demo/smollm2-arithmetic.yaml``
  (SmolLM2-135M-Instruct, its dataset, chat template, sampling settings and ``max_completion_length``): the
  demo's trainer generates ``--demo-rows`` completions for the recipe's first prompts (``num_generations`` each),
  and those rows, with their real advantages, are what both modes train on.

TRL's side splits the generation batch into micro-batches of ``--rows-per-micro`` rows (its
``per_device_train_batch_size``); the budgeted side takes the whole generation batch as one micro-batch and chunks
it under ``micro_batch_tokens``. Two budgets run in the same invocation: the *equal-memory* budget, ``rows-per-micro
x (prompt width + completion width)`` -- exactly the padded size of each of TRL's micro-batches, so both bound a
forward by the same token count -- and ``--budget`` (default: half of it), a tighter memory bound.

Each (section, mode, budget, pass) runs in a fresh process: its peak resident set size (RSS, ``ru_maxrss``; CPU --
tracemalloc does not see torch's allocator) after the timed repetitions minus the peak before them is that pass's
own peak. Times are medians of ``--reps`` (``--demo-reps``) after one full-size warm-up pass. Padded and real
tokens are what the trainer logs (``tokens/padded_<pass>``, ``tokens/real_<pass>``).

    .venv/bin/python bench/token_budget.py --json bench/results/token_budget.json
    .venv/bin/python bench/token_budget.py --sections demo --demo-budget 600 800
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

Z99 = 2.326  # standard normal 99th percentile
DEMO_RECIPE = benchlib.REPO / "configs" / "demo" / "smollm2-arithmetic.yaml"
PASSES = ("loss", "old_logps")
LOSS_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch")


# ---- pure helpers (tested in tests/pipeline/test_bench_token_budget.py) ----

def length_stats(lens: list[int]) -> dict:
    """p50 (median), p99 (nearest rank) and max of the completion lengths."""
    ordered = sorted(lens)
    return {"p50": statistics.median(ordered), "p99": ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)],
            "max": ordered[-1]}


def equal_memory_budget(rows_per_micro: int, prompt_width: int, completion_width: int) -> int:
    """The padded size of one of TRL's micro-batches: rows x (padded prompt width + padded completion width)."""
    return rows_per_micro * (prompt_width + completion_width)


def padding_share(run: dict) -> float:
    """Share of the tokens a pass paid for that were padding."""
    return 1 - run["real_tokens"] / run["padded_tokens"]


def compare(fixed: dict, budgeted: dict) -> dict:
    """A budgeted run against TRL's fixed micro-batches: time ratio, its padded share, peak-RSS ratio."""
    return {"time_ratio": budgeted["seconds"] / fixed["seconds"], "padding_share": padding_share(budgeted),
            "peak_memory_ratio": budgeted["peak_rss_mb"] / max(fixed["peak_rss_mb"], 1e-9)}


def fixed_parts(inputs: dict, rows_per_micro: int) -> list[dict]:
    """TRL's micro-batches: consecutive slices of ``rows_per_micro`` rows, every one at the batch's padded width;
    scalars (``num_items_in_batch``) pass through."""
    rows = inputs["completion_ids"].size(0)
    return [{k: (v[i:i + rows_per_micro] if v.dim() else v) for k, v in inputs.items()}
            for i in range(0, rows, rows_per_micro)]


def lengths(n: int, median: int, tail: float, cap: int, seed: int = 0) -> list[int]:
    """Lognormal completion lengths with p99/p50 = tail, capped, at least 1."""
    import torch

    sigma = math.log(tail) / Z99
    g = torch.Generator().manual_seed(seed)
    raw = torch.exp(math.log(median) + sigma * torch.randn(n, generator=g))
    return [max(1, min(cap, int(round(float(x))))) for x in raw]


def synthetic_inputs(lens: list[int], prompt: int, seed: int = 1) -> dict:
    """Rows in TRL's layout: ``prompt`` real prompt tokens each, completions right-padded to the longest."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rows, width = len(lens), max(lens)
    completion_mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)).long()
    return {"prompt_ids": torch.randint(100, 20000, (rows, prompt), generator=g),
            "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
            "completion_ids": torch.randint(100, 20000, (rows, width), generator=g),
            "completion_mask": completion_mask, "advantages": torch.randn(rows, generator=g),
            "num_items_in_batch": completion_mask.sum()}


# ---- the trainers and passes (child processes) ----

def synthetic_trainer(rows: int, cap: int, budget: int | None):
    """A WinnowGRPOTrainer on the tiny Qwen3, ``dapo`` loss, one micro-batch of ``rows`` rows."""
    from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity

    from trainer import WinnowConfig, WinnowGRPOTrainer
    from trainer.tools.assets import make_tiny_qwen3

    config = WinnowConfig(output_dir=tempfile.mkdtemp(), **{**BASE_ARGS, "per_device_train_batch_size": rows,
                                                             "max_completion_length": cap, "loss_type": "dapo"},
                          micro_batch_tokens=budget)
    return WinnowGRPOTrainer(model=str(make_tiny_qwen3()), reward_funcs=[reward_token_parity], args=config,
                             train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


def demo_trainer(rows: int, budget: int | None):
    """The demo recipe's trainer (its model, data, rewards, sampling and loss settings), with a generation batch
    of ``rows`` rows as one micro-batch and ``micro_batch_tokens = budget``."""
    from trainer.build import build_trainer, prepare_run
    from trainer.recipe import parse_recipe

    argv = ["--config", str(DEMO_RECIPE), "--output_dir", tempfile.mkdtemp(), "--per_device_train_batch_size",
            str(rows), "--save_strategy", "no"]
    if budget is not None:
        argv += ["--micro_batch_tokens", str(budget)]
    task, args, model_args = parse_recipe(argv)
    return build_trainer(task, args, model_args, prepare_run(task, args, model_args))


def generate_demo_rows(rows: int, path: Path, seed: int) -> dict:
    """The demo's trainer generates and scores completions for the recipe's first ``rows / num_generations``
    prompts (TRL's own sampling path and settings); the loss inputs go to ``path``. Returns their shape."""
    import torch

    trainer = demo_trainer(rows, None)
    G = trainer.num_generations
    if rows % G:
        raise SystemExit(f"--demo-rows must be a multiple of the demo's num_generations ({G}); got {rows}")
    batch = [row for row in trainer.train_dataset.select(range(rows // G)) for _ in range(G)]
    torch.manual_seed(seed)
    trainer.model.train()
    t0 = time.perf_counter()
    output = trainer._generate_and_score_completions(batch)
    seconds = time.perf_counter() - t0
    inputs = {k: output[k].detach().cpu() for k in LOSS_KEYS}
    torch.save(inputs, path)
    return {"generation_seconds": seconds, "prompt_width": inputs["prompt_ids"].size(1),
            "completion_width": inputs["completion_ids"].size(1),
            "completion_lengths": inputs["completion_mask"].sum(1).tolist(),
            "prompt_lengths": inputs["prompt_mask"].sum(1).tolist(), "num_generations": G,
            "max_completion_length": trainer.args.max_completion_length,
            "temperature": trainer.args.temperature, "loss_type": trainer.loss_type}


def run_loss(trainer, inputs: dict, rows_per_micro: int, budgeted: bool) -> None:
    """One generation batch through the loss: TRL's fixed row micro-batches, or one budgeted micro-batch."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    for part in [inputs] if budgeted else fixed_parts(inputs, rows_per_micro):
        loss = trainer.compute_loss(trainer.model, part)
        trainer.accelerator.backward(loss)
    trainer.model.zero_grad(set_to_none=True)


def run_old_logps(trainer, inputs: dict, rows_per_micro: int, budgeted: bool) -> None:
    """The old-policy pass as TRL calls it (no grad, ``batch_size`` = rows per micro-batch; with a budget the
    trainer chunks it by tokens instead)."""
    import torch

    trainer.model.train()  # TRL runs it in training mode (and logs its tokens there)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, inputs["completion_ids"].size(1),
                                                   batch_size=rows_per_micro)


def measure(trainer, inputs: dict, pass_: str, rows_per_micro: int, budget: int | None, reps: int) -> dict:
    """Warm kernels on a small slice, then one full warm-up and ``reps`` timed passes; the pass's peak RSS
    increase and the padded / real tokens the trainer logged (per pass)."""
    from trainer.pipeline.token_budget import slice_rows

    fn = run_loss if pass_ == "loss" else run_old_logps
    budgeted = budget is not None
    metrics = trainer._metrics["train"]
    P, T = inputs["prompt_ids"].size(1), inputs["completion_ids"].size(1)
    fn(trainer, slice_rows(inputs, [0, 1], min(P, 8), min(T, 8)), 2, budgeted)
    metrics.clear()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        fn(trainer, inputs, rows_per_micro, budgeted)
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": "budget" if budgeted else "fixed", "budget": budget, "pass": pass_,
            "seconds": statistics.median(times[1:]), "peak_rss_mb": (peak - before) / 1024,
            "padded_tokens": sum(metrics[f"tokens/padded_{pass_}"]) / (reps + 1),
            "real_tokens": sum(metrics[f"tokens/real_{pass_}"]) / (reps + 1)}


def child(args) -> dict:
    """One measurement (or the demo's generation) in this process."""
    import torch

    budget = args.child_budget or None
    if args.child == "generate":
        return generate_demo_rows(args.demo_rows, args.rows_file, args.seed)
    if args.child_section == "synthetic":
        inputs = synthetic_inputs(lengths(args.rows, args.median, args.tail, args.cap, args.seed), args.prompt)
        trainer, reps = synthetic_trainer(args.rows, args.cap, budget), args.reps
    else:
        inputs = torch.load(args.rows_file)
        trainer, reps = demo_trainer(inputs["completion_ids"].size(0), budget), args.demo_reps
    return measure(trainer, inputs, args.child, args.rows_per_micro, budget, reps)


# ---- the parent: every run side by side ----

def spawn(args, *extra: str) -> dict:
    """Run this file as a child with the parent's options plus ``extra``; its last stdout line is JSON."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
             if k in ("rows", "rows_per_micro", "median", "tail", "cap", "prompt", "reps", "demo_rows",
                      "demo_reps", "seed")]
    proc = subprocess.run([sys.executable, __file__, *flags, *extra], capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"child {' '.join(extra)} failed (exit {proc.returncode})")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}), file=sys.stderr, flush=True)
    return result


def section(args, name: str, shape: dict, budgets: list[int] | None, rows_file: Path | None) -> dict:
    """Fixed micro-batches and every budget, for both passes, each in its own process."""
    equal = equal_memory_budget(args.rows_per_micro, shape["prompt_width"], shape["completion_width"])
    budgets = [equal, *(budgets or [equal // 2])]
    extra = ["--rows-file", str(rows_file)] if rows_file else []
    out = {"rows": len(shape["completion_lengths"]), "rows_per_micro": args.rows_per_micro,
           "prompt_width": shape["prompt_width"], "completion_width": shape["completion_width"],
           "lengths": length_stats(shape["completion_lengths"]), "equal_memory_budget": equal}
    for pass_ in PASSES:
        fixed = spawn(args, "--child", pass_, "--child-section", name, *extra)
        runs = []
        for b in budgets:
            run = spawn(args, "--child", pass_, "--child-section", name, "--child-budget", str(b), *extra)
            runs.append({"budget": b, "equal_memory": b == equal, **compare(fixed, run), "run": run})
        out[pass_] = {"fixed": fixed, "padding_share_fixed": padding_share(fixed), "budgets": runs}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", nargs="+", choices=("synthetic", "demo"), default=["synthetic", "demo"],
                   help="which sections to run (default both)")
    p.add_argument("--rows", type=int, default=32, help="synthetic: rows of the generation batch (default 32)")
    p.add_argument("--rows-per-micro", type=int, default=4,
                   help="TRL's per_device_train_batch_size, both sections (default 4)")
    p.add_argument("--median", type=int, default=16, help="synthetic: median completion length (default 16)")
    p.add_argument("--tail", type=float, default=8.0, help="synthetic: p99 / p50 of the lengths (default 8)")
    p.add_argument("--cap", type=int, default=128, help="synthetic: max_completion_length (default 128)")
    p.add_argument("--prompt", type=int, default=16, help="synthetic: prompt tokens per row (default 16)")
    p.add_argument("--budget", type=int, nargs="+", default=None,
                   help="synthetic: micro_batch_tokens to compare besides the equal-memory budget (default: half "
                        "of it)")
    p.add_argument("--reps", type=int, default=2, help="synthetic: timed repetitions after one warm-up (default 2)")
    p.add_argument("--demo-rows", type=int, default=32,
                   help="demo: completions generated (a multiple of the recipe's num_generations; default 32)")
    p.add_argument("--demo-budget", type=int, nargs="+", default=None,
                   help="demo: micro_batch_tokens to compare besides the equal-memory budget (default: half of it)")
    p.add_argument("--demo-reps", type=int, default=1, help="demo: timed repetitions after one warm-up (default 1)")
    p.add_argument("--seed", type=int, default=0, help="lengths (synthetic) and sampling (demo) seed (default 0)")
    p.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    p.add_argument("--child", choices=(*PASSES, "generate"), help=argparse.SUPPRESS)
    p.add_argument("--child-section", help=argparse.SUPPRESS)
    p.add_argument("--child-budget", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--rows-file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    for name in ("rows", "rows_per_micro", "median", "cap", "prompt", "reps", "demo_rows", "demo_reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.child:
        print(json.dumps(child(args)))
        return
    result = {"setup": {k: v for k, v in vars(args).items() if not k.startswith(("child", "rows_file", "json"))},
              "peak_memory": "peak RSS increase of a fresh process over the timed passes (ru_maxrss)"}
    if "synthetic" in args.sections:
        lens = lengths(args.rows, args.median, args.tail, args.cap, args.seed)
        shape = {"prompt_width": args.prompt, "completion_width": max(lens), "completion_lengths": lens}
        result["synthetic"] = section(args, "synthetic", shape, args.budget, None)
    if "demo" in args.sections:
        with tempfile.TemporaryDirectory() as tmp:
            rows_file = Path(tmp) / "demo_rows.pt"
            shape = spawn(args, "--child", "generate", "--rows-file", str(rows_file))
            demo = section(args, "demo", shape, args.demo_budget, rows_file)
        demo.update(recipe=str(DEMO_RECIPE.relative_to(benchlib.REPO)), generation_seconds=shape["generation_seconds"],
                    prompt_lengths=length_stats(shape["prompt_lengths"]),
                    **{k: shape[k] for k in ("num_generations", "max_completion_length", "temperature", "loss_type")})
        result["demo"] = demo
    print(json.dumps(result, indent=2))
    if args.json:
        benchlib.write_json(args.json, result)


if __name__ == "__main__":
    main()
