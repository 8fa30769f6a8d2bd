"""Name -> reward function registry (recipes refer to reward functions by name)."""

from __future__ import annotations

from typing import Callable

RewardFunc = Callable[..., list]
_REWARDS: dict[str, RewardFunc] = {}


def register_reward(name: str) -> Callable[[RewardFunc], RewardFunc]:
    """Decorator registering a TRL-style reward function under ``name``."""

    def decorator(fn: RewardFunc) -> RewardFunc:
        if name in _REWARDS and _REWARDS[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered by {_REWARDS[name].__module__}")
        _REWARDS[name] = fn
        return fn

    return decorator


def available() -> list[str]:
    """Registered reward names, sorted."""
    return sorted(_REWARDS)


def get_reward(name: str) -> RewardFunc:
    """The reward function registered as ``name``; KeyError lists the registered names."""
    try:
        return _REWARDS[name]
    except KeyError:
        raise KeyError(f"no reward function named {name!r}; registered: {available()}") from None
