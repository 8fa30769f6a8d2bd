"""Start (or stop) the vLLM generation server for ``vllm_mode: server``: ``launch/vllm_server.py`` runs the launcher
(trainer/server/launcher.py) from a checkout.

    python launch/vllm_server.py --config configs/grpo/qwen3-4b-dapo17k.yaml            # GPU, foreground
    python launch/vllm_server.py --model DIR --device cpu --python .venv-vllm/bin/python --detach --pid-file s.pid
    python launch/vllm_server.py --stop-pid-file s.pid
    python launch/vllm_server.py --config RECIPE.yaml --dry-run -- --enable-prefix-caching   # print, start nothing

Every flag: ``--help`` and trainer/server/launcher.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from trainer.server.launcher import console_main, main  # noqa: E402

__all__ = ["console_main", "main"]

if __name__ == "__main__":
    console_main()
