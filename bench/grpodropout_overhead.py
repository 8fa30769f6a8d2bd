"""GRPODropout's cost as shares of a training step, measured inside real steps of one run.

Two parts, each timed around the code that does it while WinnowGRPOTrainer trains with
``rollout_dropout: grpodropout``:

1. the selection + recentering algebra (the whole stage pipeline: surprisal, eq. 4/7 selection, eq. 9
   recentering, telemetry) -- target <= 2 % of a step;
2. the old-policy forward pass the stage needs when TRL does not already compute old log-probs
   (``old_logps_source: policy``); with ``old_logps_source: sampler`` (log-probs from the generator, here
   the deterministic rollout_func that stands in for vLLM) it must vanish.

Step time is TRL's own ``step_time`` metric (generation, scoring, pipeline, loss, backward, optimizer).
Both configurations run in this one process, alternating step by step through ``--steps`` steps each.

    OMP_NUM_THREADS=1 .venv/bin/python bench/grpodropout_overhead.py --steps 12
"""

from __future__ import annotations

import statistics
import tempfile

# isort: off
from benchlib import (  # first: puts the repo and tests/ on sys.path, sets the environment
    timed,
    training_bench_args,
    write_json,
)
import torch  # noqa: E402
from harness import (  # noqa: E402
    BASE_ARGS,
    deterministic_rollout_func,
    prompt_dataset,
    reward_length,
    reward_token_parity,
    tiny_model_path,
)

from trainer import WinnowConfig, WinnowGRPOTrainer  # noqa: E402
from trainer import grpo_trainer as trainer_module  # noqa: E402
# isort: on


def build(source: str, out: str, rows: int, steps: int):
    args = WinnowConfig(
        output_dir=out,
        **{**BASE_ARGS, "per_device_train_batch_size": rows, "max_steps": steps, "rollout_dropout": "grpodropout",
           "old_logps_source": source, "logging_steps": 1},
    )
    tr = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity, reward_length], args=args,
                           train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
    algebra, forward = [], []  # seconds per call
    tr._old_policy_logps = timed(tr._old_policy_logps, forward)
    return tr, algebra, forward


def main() -> None:
    cli = training_bench_args(__doc__)

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for source in ("policy", "sampler"):
            tr, algebra, forward = build(source, f"{tmp}/{source}", cli.rows, cli.steps)
            run_pipeline = trainer_module.stages.run_pipeline
            trainer_module.stages.run_pipeline = timed(run_pipeline, algebra)
            try:
                torch.manual_seed(0)
                tr.train()
            finally:
                trainer_module.stages.run_pipeline = run_pipeline
            steps = [h["step_time"] for h in tr.state.log_history if "step_time" in h][cli.warmup:]
            kept = [h["dropout/kept_ratio"] for h in tr.state.log_history if "dropout/kept_ratio" in h]
            results[source] = (steps, algebra[cli.warmup:], forward[cli.warmup:], kept)

    summary = {"bench": "grpodropout_overhead", "rows": cli.rows}
    for source, (steps, algebra, forward, kept) in results.items():
        step = statistics.median(steps)
        alg = statistics.median(algebra)
        fwd = statistics.median(forward) if forward else 0.0
        summary[source] = {"median_step_ms": step * 1e3, "algebra_share": alg / step, "forward_share": fwd / step,
                           "kept_ratio_mean": statistics.mean(kept)}
        print(f"old_logps_source={source}: {len(steps)} steps, median step {step * 1e3:.1f} ms")
        print(f"  selection + recentering algebra: {alg * 1e3:.2f} ms = {alg / step:.2%} of a step (target <= 2%)")
        print(f"  old-policy forward pass:         {fwd * 1e3:.2f} ms = {fwd / step:.2%} of a step")
        print(f"  kept ratio: min {min(kept):.3f}, mean {statistics.mean(kept):.3f}")
    if cli.json:
        write_json(cli.json, summary)


if __name__ == "__main__":
    main()
