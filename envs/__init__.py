"""Text environments for multi-turn agents (Sokoban, FrozenLake), looked up by name.

An environment implements :class:`~envs.base.TextEnv` and is registered with :func:`register_env`; recipes
select it with ``dataset_name: sokoban | frozenlake`` and the multi-turn rollout
(trainer/rollout/multi_turn.py) builds it through :func:`make_env`. Answers are parsed by envs/parsing.py; an
episode's turns, penalties and return are kept by envs/episode.py;
levels travel in dataset rows as envs/levels.py describes.
"""

from . import frozenlake, sokoban  # noqa: F401  (importing the modules registers the environments)
from .registry import available, make_env, register_env

__all__ = ["available", "make_env", "register_env"]
