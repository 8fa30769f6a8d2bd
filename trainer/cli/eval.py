"""Evaluate checkpoints (or base models) on benchmark sets and write the papers' tables and plots (``winnow-eval``).

    python launch/eval.py --config configs/eval/cpu-champ.yaml                 # the offline CPU run
    python launch/eval.py --config configs/eval/grpodropout.yaml \\
        --system qwen3-4b-grpodropout=outputs/grpodropout/qwen3-4b-dapo17k --backend vllm
    python launch/eval.py --config configs/eval/uecr.yaml --system base=Qwen/Qwen3-4B \\
        --backend server --base_url http://127.0.0.1:8000                      # a running `vllm serve`

The YAML holds decoding (a paper's preset), benchmarks (name -> k samples per question, loader options) and
systems (name, model, backend: local | vllm | server | oracle_gold | oracle_shuffled). ``--system NAME=MODEL``
(repeatable) replaces the YAML's systems. Rerunning the same command resumes: completed questions are read
back from ``<output_dir>/<system>/results.jsonl``, not generated again. Outputs: see trainer/eval/runner.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import yaml

from trainer.eval.runner import EvalConfig, run


def main(argv: list[str] | None = None) -> dict:
    """Parse the config and flags, run every system, print the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path, help="eval YAML (configs/eval/*.yaml)")
    p.add_argument("--system", action="append", default=[], metavar="NAME=MODEL",
                   help="evaluate MODEL (path, hub id or offline: alias) as NAME; replaces the YAML's systems")
    p.add_argument("--backend", default=None, help="backend of the --system entries (default local)")
    p.add_argument("--base_url", default=None, help="server backend: URL of an OpenAI-compatible vLLM server")
    p.add_argument("--output_dir", default=None, help="override the YAML's output_dir")
    p.add_argument("--max_tokens", type=int, default=None, help="override decoding.max_tokens")
    cli = p.parse_args(argv)
    raw = yaml.safe_load(cli.config.read_text())
    if cli.system:
        raw["systems"] = []
        for entry in cli.system:
            name, sep, model = entry.partition("=")
            if not sep or not name or not model:
                p.error(f"--system expects NAME=MODEL, got {entry!r}")
            raw["systems"].append({"name": name, "model": model, "backend": cli.backend or "local",
                                   **({"base_url": cli.base_url} if cli.base_url else {})})
    if cli.output_dir:
        raw["output_dir"] = cli.output_dir
    if cli.max_tokens:
        raw.setdefault("decoding", {})["max_tokens"] = cli.max_tokens
    summary = run(EvalConfig.from_dict(raw))
    out = Path(raw["output_dir"])
    print((out / "table.md").read_text())
    print(f"summary: {out / 'summary.json'}; plot: {out / 'benchmarks.png'}")
    return summary


def console_main() -> None:
    """The ``winnow-eval`` console script and ``launch/eval.py``: INFO logging on, then :func:`main`."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    main()
    sys.exit(0)


if __name__ == "__main__":
    console_main()
