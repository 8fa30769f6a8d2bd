"""Name -> environment class registry (recipes refer to environments by name)."""

from __future__ import annotations

from typing import Any, Callable

_ENVS: dict[str, Callable[..., Any]] = {}


def register_env(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering an environment class (or factory) under ``name``."""

    def decorator(factory: Callable[..., Any]) -> Callable[..., Any]:
        if name in _ENVS and _ENVS[name] is not factory:
            raise ValueError(f"environment {name!r} is already registered")
        _ENVS[name] = factory
        return factory

    return decorator


def available() -> list[str]:
    """Registered environment names, sorted."""
    return sorted(_ENVS)


def make_env(name: str, **kwargs: Any) -> Any:
    """Build the environment registered as ``name`` with ``kwargs``; KeyError lists the registered names."""
    try:
        factory = _ENVS[name]
    except KeyError:
        raise KeyError(f"no environment named {name!r}; registered: {available()}") from None
    return factory(**kwargs)
