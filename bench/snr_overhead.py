"""RAGEN-2's costs as shares of a training step, measured inside real steps of one run.

WinnowGRPOTrainer trains the tiny Qwen3 with ``rollout_filter: snr`` (the defaults: population reward
variance, linear top-p 0.9) and the collapse detector at its defaults (step 1 and every 5 steps, up to 64
traces, 32,768-token cap, 32 sequences per forward pass). Timed around the code that does each part:

1. the SNR filter stage (scores, selection, telemetry) -- target <= 1 % of a step;
2. the whole stage pipeline (filter + the GRPO estimator TRL would run anyway), for scale;
3. one collapse check (gather, (X, Z) extraction, sampling, cross-scoring forward passes, metrics):
   seconds, teacher-forced sequences and tokens scored, and its cost in median steps.

Step time is TRL's ``step_time`` (generation, scoring, pipeline, loss, backward, optimizer) on the steps
without a collapse check.

    OMP_NUM_THREADS=1 .venv/bin/python bench/snr_overhead.py --steps 12
"""

from __future__ import annotations

import resource
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

from trainer.pipeline import stages  # noqa: E402
from trainer.methods.snr import stage as snr  # noqa: E402
# isort: on


def main() -> None:
    cli = training_bench_args(__doc__)

    filter_s, pipeline_s, check_s = [], [], []
    stage = stages.get_stage("rollout_filter", "snr")
    stages.register_stage("rollout_filter", "snr", needs=snr.snr_needs, group_level=True, metric_prefix="snr")(
        timed(stage.fn, filter_s)
    )
    original_pipeline = stages.run_pipeline
    stages.run_pipeline = timed(original_pipeline, pipeline_s)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            args = WinnowConfig(
                output_dir=tmp,
                **{**BASE_ARGS, "per_device_train_batch_size": cli.rows, "max_steps": cli.steps,
                   "rollout_filter": "snr", "collapse_detection": True, "logging_steps": 1},
            )
            tr = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity, reward_length],
                                   args=args, train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)
            detector = tr.hook("collapse")
            detector.check = timed(detector.check, check_s)
            torch.manual_seed(0)
            tr.train()
    finally:
        stages.run_pipeline = original_pipeline
        stages.register_stage("rollout_filter", "snr", needs=snr.snr_needs, group_level=True, metric_prefix="snr")(
            stage.fn
        )

    history = tr.state.log_history
    checked = {h["step"] for h in history if "collapse/tokens_scored" in h}
    steps = [h["step_time"] for h in history if "step_time" in h and h["step"] not in checked][cli.warmup:]
    step = statistics.median(steps)
    filt = statistics.median(filter_s[cli.warmup:])
    pipe = statistics.median(pipeline_s[cli.warmup:])
    print(f"{len(steps)} steps without a collapse check, median step {step * 1e3:.1f} ms ({cli.rows} rollouts)")
    print(f"  SNR filter stage:            {filt * 1e3:.3f} ms = {filt / step:.3%} of a step (target <= 1%)")
    print(f"  whole pipeline (+ estimator): {pipe * 1e3:.3f} ms = {pipe / step:.3%} of a step")
    kept = [h["snr/kept_ratio"] for h in history if "snr/kept_ratio" in h]
    print(f"  kept ratio of groups: min {min(kept):.3f}, mean {statistics.mean(kept):.3f}")
    checks = [h for h in history if "collapse/tokens_scored" in h]
    print(f"collapse checks at steps {sorted(checked)} (defaults: every {args.collapse_every}, "
          f"<= {args.collapse_num_samples} traces, <= {args.collapse_max_tokens} tokens)")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  process peak RSS over the run: {peak_mb:.0f} MB")
    summary = {"bench": "snr_overhead", "rows": cli.rows, "median_step_ms": step * 1e3, "filter_share": filt / step,
               "pipeline_share": pipe / step, "process_peak_rss_mb": peak_mb, "checks": []}
    for h, seconds in zip(checks, check_s):
        sequences = int(h["collapse/num_samples"] * h["collapse/num_prompts"])
        summary["checks"].append({"step": h["step"], "seconds": seconds, "steps_equivalent": seconds / step,
                                  "sequences": sequences, "tokens": int(h["collapse/tokens_scored"])})
        print(f"  step {h['step']}: {seconds:.2f} s = {seconds / step:.2f} median steps; {sequences} sequences "
              f"({int(h['collapse/num_samples'])} traces x {int(h['collapse/num_prompts'])} prompts), "
              f"{int(h['collapse/tokens_scored'])} tokens; retrieval {h['collapse/retrieval_accuracy']:.3f}, "
              f"MI {h['collapse/mi_estimate']:.4f}")
    if cli.json:
        write_json(cli.json, summary)


if __name__ == "__main__":
    main()
