"""UECR-GRPO App. F.4: the fixed-rollout alpha sweep with a bootstrap clustered by question.

    python launch/alpha_sweep.py --eval_dir outputs/eval/amc23-ckpts --teacher outputs/grpo/qwen3-4b   # score + sweep
    python launch/alpha_sweep.py --results outputs/eval/amc23-ckpts/teacher_scored.jsonl            # already scored

``--eval_dir`` + ``--teacher``: run launch/score_teacher.py on a launch/eval.py output folder (one system per
checkpoint) first. ``--results``: JSON lines with one scored response each -- launch/eval.py's results.jsonl
rows (``system`` = checkpoint, ``benchmark``/``id`` = question, ``correct`` = task reward) plus
``teacher_score`` (the response's length-normalised teacher-minus-checkpoint log-ratio,
trainer/eval/teacher_scoring.py). Prints the sweep and writes everything to ``--out``. Formulas:
trainer/eval/alpha_sweep.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # launch/score_teacher.py

from trainer.eval.alpha_sweep import (  # noqa: E402
    DEFAULT_ALPHAS,
    alpha_star_summary,
    clustered_bootstrap,
    load_groups,
    refinement_grid,
    sweep,
)


def main(argv: list[str] | None = None) -> dict:
    """Run the sweep, print a table, write the JSON report; returns the report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--results", help="JSON lines of scored responses (see above)")
    src.add_argument("--eval_dir", help="a launch/eval.py output folder to teacher-score first (needs --teacher)")
    p.add_argument("--teacher", default=None, help="with --eval_dir: the frozen teacher (see launch/score_teacher.py)")
    p.add_argument("--out", default=None, help="where to write the JSON report (default: next to --results)")
    p.add_argument("--alphas", type=float, nargs="*", default=None,
                   help="alpha grid (default: 0, 0.25, 0.5, 1, 2, 4 and 0..8 in steps of 0.1)")
    p.add_argument("--replicates", type=int, default=2000, help="bootstrap replicates (F.4: 2000)")
    p.add_argument("--seed", type=int, default=42, help="bootstrap seed (F.4: 42)")
    p.add_argument("--reward_key", default="correct")
    p.add_argument("--score_key", default="teacher_score")
    p.add_argument("--question_key", default="id")
    p.add_argument("--checkpoint_key", default="system")
    a = p.parse_args(argv)
    if a.eval_dir:
        if not a.teacher:
            p.error("--eval_dir needs --teacher (the frozen teacher that scores the responses)")
        from score_teacher import main as score_teacher  # heavy: TRL and transformers, only for --eval_dir

        a.results = str(score_teacher(["--eval_dir", a.eval_dir, "--teacher", a.teacher]))
    elif a.teacher:
        p.error("--teacher goes with --eval_dir; --results files are already scored")
    groups = load_groups(a.results, reward_key=a.reward_key, score_key=a.score_key, question_key=a.question_key,
                         checkpoint_key=a.checkpoint_key)
    alphas = sorted(set(a.alphas)) if a.alphas else list(DEFAULT_ALPHAS)
    alphas = sorted(set(alphas) | set(refinement_grid(groups, alphas)))
    rows = sweep(groups, alphas)
    cis = {c["alpha"]: c for c in clustered_bootstrap(groups, alphas, replicates=a.replicates, seed=a.seed)}
    for r in rows:
        r.update({k: v for k, v in cis[r["alpha"]].items() if k != "alpha"})
    report = {"alpha_star": alpha_star_summary(groups), "sweep": rows,
              "checkpoints": sorted({g.checkpoint for g in groups}), "questions": len({g.question for g in groups})}
    out = Path(a.out) if a.out else Path(a.results).with_name("alpha_sweep.json")
    out.write_text(json.dumps(report, indent=1))
    print(f"alpha*: {report['alpha_star']}")
    print(f"{'alpha':>6} {'conflict':>9} {'95% CI':>17} {'any-inv':>8} {'pairs-inv':>9} {'sign-flip':>9}")
    for r in rows:
        ci = r["conflict_rate_ci"]
        print(f"{r['alpha']:6.3f} {r['conflict_rate']:9.4f} [{ci[0]:.4f}, {ci[1]:.4f}] {r['any_inversion_rate']:8.4f} "
              f"{r['pair_inversion_rate']:9.4f} {r['sign_flip_rate']:9.4f}")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
