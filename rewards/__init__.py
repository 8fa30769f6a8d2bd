"""Verifiable reward functions, looked up by name from YAML recipes.

A reward function follows TRL's contract: ``f(prompts, completions, completion_ids, **columns) -> list[float | None]``
(None = unscorable). Register one with :func:`register_reward`; recipes name it in ``reward_funcs``.
"""

from .registry import available, get_reward, register_reward

# Importing these modules registers their reward functions ("math_accuracy", "think_format", "dapo_accuracy").
from . import math as math_rewards  # noqa: E402,F401  (imported for its registrations)
from . import countdown as countdown_rewards  # noqa: E402,F401  ("countdown")
from . import format as format_rewards  # noqa: E402,F401  ("answer_format_penalty")
from . import overlong as overlong_rewards  # noqa: E402,F401  ("overlong_penalty")
from . import env as env_rewards  # noqa: E402,F401  ("env_return", "env_success")

__all__ = ["available", "get_reward", "register_reward"]
