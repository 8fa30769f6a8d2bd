"""Name -> reward function registry (recipes refer to reward functions by name).

A reward may be registered with a ``factory`` that builds a configured copy (e.g. another verifier time
limit); :func:`get_reward` passes the options the factory accepts and ignores the others, so a recipe's
``reward_timeout`` reaches the math rewards and leaves a format reward alone.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

RewardFunc = Callable[..., list]
_REWARDS: dict[str, tuple[RewardFunc, Callable[..., RewardFunc] | None]] = {}


def register_reward(name: str, factory: Callable[..., RewardFunc] | None = None) -> Callable[[RewardFunc], RewardFunc]:
    """Decorator registering a TRL-style reward function under ``name`` (optionally with its factory)."""

    def decorator(fn: RewardFunc) -> RewardFunc:
        if name in _REWARDS and _REWARDS[name][0] is not fn:
            raise ValueError(f"reward {name!r} is already registered by {_REWARDS[name][0].__module__}")
        _REWARDS[name] = (fn, factory)
        return fn

    return decorator


def available() -> list[str]:
    """Registered reward names, sorted."""
    return sorted(_REWARDS)


def get_reward(name: str, **options: Any) -> RewardFunc:
    """The reward function registered as ``name``; with ``options`` its factory builds a configured copy.
    KeyError lists the registered names."""
    try:
        fn, factory = _REWARDS[name]
    except KeyError:
        raise KeyError(f"no reward function named {name!r}; registered: {available()}") from None
    if factory is None or not options:
        return fn
    accepted = inspect.signature(factory).parameters
    usable = {k: v for k, v in options.items() if k in accepted}
    return factory(**usable) if usable else fn
