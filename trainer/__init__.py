"""winnow-rl trainer: WinnowConfig, WinnowGRPOTrainer and the stage registries.

Exports resolve lazily (PEP 562), so ``python -m trainer.tools.assets`` or ``trainer.algorithms`` do not pay for
importing TRL and transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConfigError": ".config.errors",
    "WinnowConfig": ".config.core",
    "WinnowGRPOTrainer": ".grpo_trainer",
    "RewardFunctionError": ".guards.rewards",
    "RolloutBatch": ".pipeline.batch",
    "StageResult": ".pipeline.stages",
    "available": ".pipeline.stages",
    "register_stage": ".pipeline.stages",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
