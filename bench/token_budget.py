"""Token-budget micro-batches (``micro_batch_tokens``) against TRL's fixed row micro-batches, side by side on the
same long-tailed rows: the loss phase (forward + backward over a generation batch) and the old-policy log-prob
pass (no grad).

Completion lengths are lognormal with p99/p50 = ``--tail`` (sigma = ln(tail) / 2.326), median ``--median`` tokens,
capped at ``--cap``; prompts are ``--prompt`` tokens. TRL pads the whole generation batch to its longest
completion and splits it into micro-batches of ``--rows-per-micro`` rows; the budgeted run takes the generation
batch as one micro-batch and chunks it with ``micro_batch_tokens = rows-per-micro x (prompt + longest completion)``
-- exactly the padded size of each of TRL's micro-batches, so both bound a forward by the same token count.
Each (mode, pass) runs in a fresh process: its peak resident set size
(RSS, ``ru_maxrss``; CPU -- tracemalloc does not see torch's allocator) after the timed repetitions minus the peak
before them is that pass's own peak. Times are medians of ``--reps`` after one warm-up.

    .venv/bin/python bench/token_budget.py --json bench/results/token_budget.json
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


def lengths(n: int, median: int, tail: float, cap: int, seed: int = 0) -> list[int]:
    """Lognormal completion lengths with p99/p50 = tail, capped, at least 1."""
    import torch

    sigma = math.log(tail) / Z99
    g = torch.Generator().manual_seed(seed)
    raw = torch.exp(math.log(median) + sigma * torch.randn(n, generator=g))
    return [max(1, min(cap, int(round(float(x))))) for x in raw]


def budget_tokens(args, lens: list[int]) -> int:
    """The padded size of one of TRL's micro-batches here: rows-per-micro x (prompt + longest completion)."""
    return args.rows_per_micro * (args.prompt + max(lens))


def build(args):
    """A WinnowGRPOTrainer on the tiny Qwen3 and the long-tailed generation batch (TRL's padded layout)."""
    import torch
    from harness import BASE_ARGS, deterministic_rollout_func, prompt_dataset, reward_token_parity

    from trainer import WinnowConfig, WinnowGRPOTrainer
    from trainer.tools.assets import make_tiny_qwen3

    lens = lengths(args.rows, args.median, args.tail, args.cap)
    budget = budget_tokens(args, lens) if args.mode == "budget" else None
    config = WinnowConfig(output_dir=tempfile.mkdtemp(), **{**BASE_ARGS, "per_device_train_batch_size": args.rows,
                                                             "max_completion_length": args.cap, "loss_type": "dapo"},
                          micro_batch_tokens=budget)
    trainer = WinnowGRPOTrainer(model=str(make_tiny_qwen3()), reward_funcs=[reward_token_parity], args=config,
                                train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
    g = torch.Generator().manual_seed(1)
    W = max(lens)  # TRL pads the generation batch to its longest completion
    completion_ids = torch.randint(100, 20000, (args.rows, W), generator=g)
    completion_mask = (torch.arange(W).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)).long()
    inputs = {"prompt_ids": torch.randint(100, 20000, (args.rows, args.prompt), generator=g),
              "prompt_mask": torch.ones(args.rows, args.prompt, dtype=torch.long),
              "completion_ids": completion_ids, "completion_mask": completion_mask,
              "advantages": torch.randn(args.rows, generator=g), "num_items_in_batch": completion_mask.sum()}
    return trainer, inputs, lens


def run_loss(trainer, inputs, args):
    """One generation batch through the loss: TRL's fixed row micro-batches, or one budgeted micro-batch."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    if args.mode == "budget":
        parts = [inputs]
    else:
        m = args.rows_per_micro
        parts = [{k: (v[i:i + m] if v.dim() else v) for k, v in inputs.items()} for i in range(0, args.rows, m)]
    for part in parts:
        loss = trainer.compute_loss(trainer.model, part)
        trainer.accelerator.backward(loss)
    trainer.model.zero_grad(set_to_none=True)


def run_old_logps(trainer, inputs, args):
    """The old-policy pass as TRL calls it (no grad, batch_size = rows per micro-batch)."""
    import torch

    trainer.model.train()  # TRL runs it in training mode (and logs its tokens there)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, inputs["completion_ids"].size(1),
                                                   batch_size=args.rows_per_micro)


def child(args) -> dict:
    """One (mode, pass) measurement in this process."""
    trainer, inputs, lens = build(args)
    fn = run_loss if args.pass_ == "loss" else run_old_logps
    metrics = trainer._metrics["train"]
    small = {k: (v[:2, :8] if v.dim() == 2 else v[:2] if v.dim() else v) for k, v in inputs.items()}
    fn(trainer, small, argparse.Namespace(**{**vars(args), "rows": 2}))  # warm kernels on a tiny slice
    metrics.clear()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(args.reps + 1):
        t0 = time.perf_counter()
        fn(trainer, inputs, args)
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    name = "loss" if args.pass_ == "loss" else "old_logps"
    padded = metrics[f"tokens/padded_{name}"]
    real = metrics[f"tokens/real_{name}"]
    return {"mode": args.mode, "pass": name, "seconds": statistics.median(times[1:]),
            "peak_rss_mb": (peak - before) / 1024, "padded_tokens": sum(padded) / (args.reps + 1),
            "real_tokens": sum(real) / (args.reps + 1), "p50": statistics.median(lens),
            "p99": sorted(lens)[max(0, math.ceil(0.99 * len(lens)) - 1)], "max": max(lens)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32, help="rows of the generation batch (default 32)")
    p.add_argument("--rows-per-micro", type=int, default=4, help="TRL's per_device_train_batch_size (default 4)")
    p.add_argument("--median", type=int, default=16, help="median completion length (default 16)")
    p.add_argument("--tail", type=float, default=8.0, help="p99 / p50 of the lengths (default 8)")
    p.add_argument("--cap", type=int, default=128, help="max_completion_length (default 128)")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens per row (default 16)")
    p.add_argument("--reps", type=int, default=2, help="timed repetitions after one warm-up (default 2)")
    p.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    p.add_argument("--child", nargs=2, metavar=("MODE", "PASS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.mode, args.pass_ = args.child
        print(json.dumps(child(args)))
        return
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("json", "child")]
    runs = {}
    for pass_ in ("loss", "old_logps"):
        for mode in ("fixed", "budget"):
            out = subprocess.run([sys.executable, __file__, *flags, "--child", mode, pass_], check=True,
                                 capture_output=True, text=True).stdout
            runs[(mode, pass_)] = json.loads(out.strip().splitlines()[-1])
            print(json.dumps(runs[(mode, pass_)]), file=sys.stderr, flush=True)
    result = {"setup": {k: v for k, v in vars(args).items() if k not in ("json", "child")},
              "budget_tokens": budget_tokens(args, lengths(args.rows, args.median, args.tail, args.cap)),
              "peak_memory": "peak RSS increase of a fresh process over the timed passes (ru_maxrss)"}
    for pass_ in ("loss", "old_logps"):
        fixed, budget = runs[("fixed", pass_)], runs[("budget", pass_)]
        result[pass_] = {
            "fixed": fixed, "budget": budget,
            "time_ratio": budget["seconds"] / fixed["seconds"],
            "padding_share_fixed": 1 - fixed["real_tokens"] / fixed["padded_tokens"],
            "padding_share_budget": 1 - budget["real_tokens"] / budget["padded_tokens"],
            "peak_memory_ratio": budget["peak_rss_mb"] / max(fixed["peak_rss_mb"], 1e-9),
        }
    result["lengths"] = {k: runs[("fixed", "loss")][k] for k in ("p50", "p99", "max")}
    print(json.dumps(result, indent=2))
    if args.json:
        benchlib.write_json(args.json, result)


if __name__ == "__main__":
    main()
