"""Peak memory of teacher scoring (per-token log-prob + full-vocabulary entropy at T = 1, float32) vs sequence
length at Qwen3's vocabulary V = 151,936: the chunked scorer (trainer/methods/uecr/teacher.py: LM head over chunks of
positions) against the naive one (the model's full (1, L, V) logits, then log-softmax and entropy).

Each measurement runs in a fresh process: its peak resident set size after scoring minus the peak before
(model loaded, inputs built) is the scoring's own peak. The model is the tiny Qwen3 (hidden 16), so the LM head's
logits dominate exactly as they do for a real model's scoring; backbone activations of a real model add to both
columns alike. Naive scoring stops at ``--naive-max`` tokens (it needs ~3 x L x V x 4 bytes); beyond it the
table extrapolates linearly from the measured points.

    .venv/bin/python bench/teacher_scoring_memory.py --json bench/results/teacher_scoring_memory.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import benchlib  # noqa: F401  (paths, offline env)

VOCAB = 151_936


def measure(kind: str, length: int, chunk_tokens: int) -> dict:
    """One scoring of a length-``length`` sequence in this process; returns the peak RSS increase in MB."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from trainer.methods.uecr.teacher import score_tokens
    from trainer.tools.assets import make_tiny_qwen3

    model = AutoModelForCausalLM.from_pretrained(str(make_tiny_qwen3())).eval()
    ids = torch.randint(100, 20000, (1, length + 1), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():  # warm the kernels on a short input so one-off allocations are not counted
        model(input_ids=ids[:, :8], attention_mask=mask[:, :8])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with torch.no_grad():
        if kind == "chunked":
            out = score_tokens(model, ids, mask, length, with_entropy=True, chunk_tokens=chunk_tokens)
            value = float(out["logps"][0].sum() + out["entropy"].sum())
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            lsm = torch.log_softmax(logits, dim=-1)
            logps = lsm.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            entropy = -(lsm.exp() * lsm).sum(-1)
            value = float(logps.sum() + entropy.sum())
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"kind": kind, "length": length, "peak_mb": (peak - before) / 1024, "seconds": seconds, "checksum": value}


def run_child(kind: str, length: int, chunk_tokens: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, str(length), "--chunk-tokens", str(chunk_tokens)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--naive-max", type=int, default=4096, help="longest sequence scored naively (default 4096)")
    p.add_argument("--chunk-tokens", type=int, default=512)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.chunk_tokens)))
        return
    rows = []
    for length in args.lengths:
        chunked = run_child("chunked", length, args.chunk_tokens)
        naive = run_child("naive", length, args.chunk_tokens) if length <= args.naive_max else None
        rows.append({"length": length, "chunked": chunked, "naive": naive})
    measured = [(r["length"], r["naive"]["peak_mb"]) for r in rows if r["naive"]]
    slope = (measured[-1][1] - measured[0][1]) / (measured[-1][0] - measured[0][0]) if len(measured) > 1 else None
    print(f"teacher scoring peak memory, V = {VOCAB}, chunk {args.chunk_tokens} positions")
    print(f"{'tokens':>7} {'chunked MB':>11} {'naive MB':>10} {'naive / chunked':>16}")
    for r in rows:
        if r["naive"]:
            naive, note = r["naive"]["peak_mb"], ""
        else:
            naive, note = measured[-1][1] + slope * (r["length"] - measured[-1][0]), " (extrapolated)"
        r["naive_mb"], r["naive_extrapolated"] = naive, r["naive"] is None
        # the checksums must agree where both ran: the two scorers compute the same numbers
        if r["naive"]:
            assert abs(r["naive"]["checksum"] - r["chunked"]["checksum"]) <= 1e-3 * max(
                1.0, abs(r["naive"]["checksum"])
            )
        print(
            f"{r['length']:>7} {r['chunked']['peak_mb']:>11.0f} {naive:>10.0f}{note} "
            f"{naive / max(r['chunked']['peak_mb'], 1):>8.1f}x"
        )
    if args.json:
        benchlib.write_json(args.json, {"vocab": VOCAB, "chunk_tokens": args.chunk_tokens, "rows": rows})


if __name__ == "__main__":
    main()
