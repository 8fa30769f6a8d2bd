"""Verifiable reward functions, looked up by name from YAML recipes.

A reward function follows TRL's contract: ``f(prompts, completions, completion_ids, **columns) -> list[float | None]``
(None = unscorable). Register one with :func:`register_reward`; recipes name it in ``reward_funcs``.
"""

import sys

# Importing these modules registers their reward functions.
from . import countdown as countdown_rewards  # noqa: F401  ("countdown", "ragen_countdown")
from . import env as env_rewards  # noqa: F401  ("env_return", "env_success")
from . import foreign as foreign_rewards  # noqa: F401  (TRL's "accuracy_reward", ...; open-r1's "accuracy", "format")
from . import format as format_rewards  # noqa: F401  ("answer_format_penalty")
from . import math_rewards  # noqa: F401  ("math_accuracy", "think_format", "dapo_accuracy", ...)
from . import overlong as overlong_rewards  # noqa: F401  ("overlong_penalty")
from .registry import available, get_reward, register_reward

# Compatibility: the module was rewards/math.py, a name that shadows the stdlib's ``math`` for any script run from
# this folder; ``rewards.math`` (import and attribute) still reaches it.
sys.modules[f"{__name__}.math"] = math_rewards
math = math_rewards

__all__ = ["available", "get_reward", "register_reward"]
