"""winnow-rl trainer: WinnowConfig, WinnowGRPOTrainer and the stage registries."""

from .config import ConfigError, WinnowConfig
from .grpo_trainer import WinnowGRPOTrainer
from .reward_guard import RewardFunctionError
from .rollout_batch import RolloutBatch
from .stages import StageResult, available, register_stage

__all__ = [
    "ConfigError",
    "RewardFunctionError",
    "RolloutBatch",
    "StageResult",
    "WinnowConfig",
    "WinnowGRPOTrainer",
    "available",
    "register_stage",
]
