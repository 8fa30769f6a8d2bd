"""Loss-phase cost of removed rollouts: batch compaction vs masking, at keep ratios 1.0 / 0.75 / 0.5 / 0.25.

A stage keeps the first ``r·G`` rollouts of every group. For each keep ratio and each formulation
(``compact_batch`` True / False) one generation batch of the tiny Qwen3 is prepared through the real trainer,
then the loss phase -- forward + backward of every micro-batch TRL would train on -- is timed, the
configurations interleaved rep by rep in this one process. Target: time proportional to the kept rows
(<= 0.6x of keep-all at 50 % kept) with compaction; masking pays for every row.

    OMP_NUM_THREADS=1 .venv/bin/python bench/compaction_speed.py --reps 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

# isort: off
from benchlib import write_json  # first: puts the repo and tests/ on sys.path, sets the environment
import torch  # noqa: E402
from harness import (  # noqa: E402
    BASE_ARGS,
    deterministic_rollout_func,
    prompt_dataset,
    reward_length,
    reward_token_parity,
    tiny_model_path,
)

from trainer import StageResult, WinnowConfig, WinnowGRPOTrainer, register_stage  # noqa: E402
# isort: on

KEEP_RATIOS = (1.0, 0.75, 0.5, 0.25)


@register_stage("rollout_dropout", "bench_keep_ratio")
def keep_ratio(batch, args) -> StageResult:
    """Keep the first round(r * G) rollouts of each group, r from the environment (set per configuration)."""
    r = float(os.environ["BENCH_KEEP_RATIO"])
    position = torch.arange(batch.N) % batch.G
    return StageResult(keep=position < round(r * batch.G))


def prepared_batch(ratio: float, compact: bool, rows: int, out: str) -> tuple[WinnowGRPOTrainer, list[dict]]:
    os.environ["BENCH_KEEP_RATIO"] = str(ratio)
    args = WinnowConfig(
        output_dir=out,
        **{
            **BASE_ARGS,
            "per_device_train_batch_size": rows,
            "max_completion_length": 32,
            "rollout_dropout": "bench_keep_ratio",
            "compact_batch": compact,
        },
    )
    tr = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity, reward_length], args=args,
                           train_dataset=prompt_dataset(rows), rollout_func=deterministic_rollout_func)
    tr.model.train()
    torch.manual_seed(0)
    tr._prepare_inputs(next(iter(tr.get_train_dataloader())))
    return tr, list(tr.generation_buffer.micro_batches)


def loss_phase_seconds(tr: WinnowGRPOTrainer, micro_batches: list[dict]) -> float:
    tr.current_gradient_accumulation_steps = tr.args.gradient_accumulation_steps
    t0 = time.perf_counter()
    for inputs in micro_batches:
        tr.model.zero_grad(set_to_none=True)
        tr.compute_loss(tr.model, inputs).backward()
    return time.perf_counter() - t0


def run(reps: int = 5, rows: int = 64) -> dict:
    """Median loss-phase seconds per (keep ratio, formulation) and the ratios; JSON-serialisable."""
    times: dict[tuple[float, bool], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        configs = {(r, c): prepared_batch(r, c, rows, f"{tmp}/{r}-{c}") for r in KEEP_RATIOS for c in (True, False)}
        for key, (tr, mbs) in configs.items():
            loss_phase_seconds(tr, mbs)  # warm-up
        for _ in range(reps):
            for key, (tr, mbs) in configs.items():
                times.setdefault(key, []).append(loss_phase_seconds(tr, mbs))
        trained_rows = {
            key: sum(int(mb["completion_ids"].shape[0]) for mb in mbs) for key, (_, mbs) in configs.items()
        }
    med = {key: statistics.median(v) for key, v in times.items()}
    base = med[(1.0, True)]
    return {
        "rows_per_generation": rows,
        "reps": reps,
        "by_keep_ratio": [
            {"keep_ratio": r, "compacted_s": med[(r, True)], "masked_s": med[(r, False)],
             "compacted_rows": trained_rows[(r, True)], "masked_rows": trained_rows[(r, False)],
             "compacted_vs_keep_all": med[(r, True)] / base, "compacted_vs_masked": med[(r, True)] / med[(r, False)]}
            for r in KEEP_RATIOS
        ],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per configuration (default 5)")
    p.add_argument("--rows", type=int, default=64, help="rollouts per generation batch (default 64 = 16 groups x 4)")
    p.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    cli = p.parse_args()
    result = {"bench": "compaction_speed", **run(cli.reps, cli.rows)}
    if cli.json:
        write_json(cli.json, result)
    print(f"loss phase (forward + backward), {result['rows_per_generation']} rollouts per generation batch, "
          f"median of {result['reps']}:")
    for row in result["by_keep_ratio"]:
        print(
            f"  keep {row['keep_ratio']:.2f}: compacted {row['compacted_s'] * 1e3:7.1f} ms "
            f"({row['compacted_rows']} rows) "
            f"= {row['compacted_vs_keep_all']:.2f}x keep-all; masked {row['masked_s'] * 1e3:7.1f} ms "
            f"({row['masked_rows']} rows); compacted/masked {row['compacted_vs_masked']:.2f}"
        )


if __name__ == "__main__":
    main()
