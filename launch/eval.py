"""Evaluate checkpoints: ``launch/eval.py`` runs ``winnow-eval`` (trainer/cli/eval.py) from a checkout.

    python launch/eval.py --config configs/eval/cpu-champ.yaml                 # the offline CPU run
    python launch/eval.py --config configs/eval/grpodropout.yaml \\
        --system qwen3-4b-grpodropout=outputs/grpodropout/qwen3-4b-dapo17k --backend vllm

Every flag: ``--help`` and trainer/cli/eval.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from trainer.cli.eval import console_main, main  # noqa: E402

__all__ = ["console_main", "main"]

if __name__ == "__main__":
    console_main()
