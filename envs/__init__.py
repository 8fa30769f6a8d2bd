"""Text environments for multi-turn agents (Sokoban, FrozenLake, ...), looked up by name.

An environment class is registered with :func:`register_env` and built by recipes through :func:`make_env`.
"""

from .registry import available, make_env, register_env

__all__ = ["available", "make_env", "register_env"]
