"""Teacher scores for UECR-GRPO's App. F.4 alpha audit: score every response of an evaluation run with the
frozen teacher against the checkpoint that generated it, and write one JSON-lines file for launch/alpha_sweep.py.

    python launch/eval.py --config amc23-checkpoints.yaml             # systems = checkpoints, k = 24 samples
    python launch/score_teacher.py --eval_dir outputs/eval/amc23-ckpts --teacher outputs/grpo/qwen3-4b
    python launch/alpha_sweep.py --results outputs/eval/amc23-ckpts/teacher_scored.jsonl

Each system folder gets ``teacher_scores.jsonl``; all of them are concatenated into ``--out`` (default
``<eval_dir>/teacher_scored.jsonl``). Formula and inputs: trainer/eval/teacher_scoring.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from trainer.eval.teacher_scoring import F4_MAX_TOKENS, check_system, load_scoring_model, score_system  # noqa: E402


def main(argv: list[str] | None = None) -> Path:
    """Score the chosen systems of ``--eval_dir``; returns the path of the combined file."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eval_dir", required=True, type=Path, help="launch/eval.py output_dir (one folder per system)")
    p.add_argument(
        "--teacher", required=True, help="frozen teacher: path, hub id or offline: alias (F.4: Qwen3-4B-GRPO)"
    )
    p.add_argument(
        "--systems",
        nargs="*",
        default=None,
        help="system folders to score (default: every folder holding results.jsonl, oracle controls excepted)",
    )
    p.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="SYSTEM=PATH",
        help="score SYSTEM against PATH instead of the model its config.json names (a moved checkpoint)",
    )
    p.add_argument(
        "--max_tokens", type=int, default=F4_MAX_TOKENS, help="score each response's first N tokens (F.4: 8192)"
    )
    p.add_argument("--dtype", default="auto", help="weights dtype of both models (auto = the checkpoint's)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--micro_batch_size", type=int, default=4, help="responses per forward")
    p.add_argument("--micro_batch_tokens", type=int, default=None,
                   help="token budget per forward instead: length-sorted responses, at most this many tokens "
                   "(prompt + response, padded) per forward (a longer response runs alone)")
    p.add_argument("--out", type=Path, default=None, help="combined output (default <eval_dir>/teacher_scored.jsonl)")
    a = p.parse_args(argv)
    overrides = {}
    for entry in a.checkpoint:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            p.error(f"--checkpoint expects SYSTEM=PATH, got {entry!r}")
        overrides[name] = path
    if a.systems is None:
        a.systems = sorted(
            d.name
            for d in a.eval_dir.iterdir()
            if (d / "results.jsonl").exists()
            and not json.loads((d / "config.json").read_text())["system"]["backend"].startswith("oracle")
        )
    missing = [s for s in a.systems if not (a.eval_dir / s / "results.jsonl").exists()]
    if missing:
        p.error(f"--systems: no results.jsonl for {missing} under {a.eval_dir}")
    for name in a.systems:  # every folder and the teacher's vocabulary, before any weights load
        check_system(a.eval_dir / name, a.teacher, overrides.get(name))
    teacher = load_scoring_model(a.teacher, a.dtype, a.device)  # once for every checkpoint
    records = []
    for name in a.systems:
        records += score_system(a.eval_dir / name, a.teacher, teacher=teacher, checkpoint_path=overrides.get(name),
                                max_tokens=a.max_tokens, dtype=a.dtype, device=a.device,
                                micro_batch_size=a.micro_batch_size, micro_batch_tokens=a.micro_batch_tokens)
        print(f"{name}: scored")
    out = a.out or a.eval_dir / "teacher_scored.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"wrote {out} ({len(records)} responses, {len(a.systems)} checkpoints)")
    return out


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    main()
