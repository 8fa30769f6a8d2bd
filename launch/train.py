"""Train from a YAML recipe: ``launch/train.py`` runs ``winnow-train`` (trainer/cli/train.py) from a checkout.

    accelerate launch launch/train.py --config configs/demo/smollm2-arithmetic.yaml
    accelerate launch --config_file launch/accelerate/zero3_gpu_4.yaml launch/train.py \\
        --config configs/grpo/qwen3-4b-dapo17k.yaml --vllm_server_base_url http://10.0.0.2:8000
    python launch/train.py --config ... --resume_from_checkpoint auto      # latest checkpoint if any, else fresh
    python launch/train.py --config configs/grpo/qwen3-8b-dapo17k.yaml --dry-run   # preflight, loads nothing

Every flag and what the run folder receives: ``--help`` and trainer/cli/train.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from trainer.cli.train import console_main, main, set_allocator_conf  # noqa: E402

__all__ = ["console_main", "main", "set_allocator_conf"]

if __name__ == "__main__":
    console_main()
