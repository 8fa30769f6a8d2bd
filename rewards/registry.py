"""Name -> reward function registry (recipes refer to reward functions by name).

A reward may be registered with a ``factory`` that builds a configured copy (e.g. another verifier time
limit); :func:`get_reward` passes the options the factory accepts and ignores the others, so a recipe's
``reward_timeout`` reaches the math rewards and leaves a format reward alone.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

RewardFunc = Callable[..., list]
_REWARDS: dict[str, tuple[RewardFunc | None, Callable[..., RewardFunc] | None]] = {}


def register_reward(name: str, factory: Callable[..., RewardFunc] | None = None) -> Callable[[RewardFunc], RewardFunc]:
    """Decorator registering a TRL-style reward function under ``name`` (optionally with its factory)."""

    def decorator(fn: RewardFunc) -> RewardFunc:
        if name in _REWARDS and _REWARDS[name][0] is not fn:
            raise ValueError(f"reward {name!r} is already registered by {_registrant(name)}")
        _REWARDS[name] = (fn, factory)
        return fn

    return decorator


def register_lazy_reward(name: str, loader: Callable[..., RewardFunc]) -> None:
    """Register ``name`` without importing its function yet: ``loader()`` builds it when a recipe asks for it (another
    library's reward -- TRL's -- so that importing :mod:`rewards` does not import that library)."""
    if name in _REWARDS and _REWARDS[name][1] is not loader:
        raise ValueError(f"reward {name!r} is already registered by {_registrant(name)}")
    _REWARDS[name] = (None, loader)


def _registrant(name: str) -> str:
    fn, factory = _REWARDS[name]
    return (fn or factory).__module__


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
    accepted = inspect.signature(factory).parameters if factory is not None else {}
    usable = {k: v for k, v in options.items() if k in accepted}
    if fn is None:  # register_lazy_reward
        return factory(**usable)
    return factory(**usable) if usable else fn
