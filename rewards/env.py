"""Rewards of the multi-turn environment tasks: the episode's return and its success flag.

The rollout (trainer/rollout/multi_turn.py) plays each episode and returns per-row extras; TRL passes them to reward
functions as keyword arguments. ``env_return`` is RAGEN's score (Σ environment rewards + Σ format
penalties, placed on the whole trajectory); ``env_success`` is 1.0 for a solved episode (log it with a zero
reward weight, or train on it as a sparse reward). Without the rollout's extras these fail loudly: that is a
recipe error (an environment reward on a non-environment dataset), not a model error.
"""

from __future__ import annotations

from .registry import register_reward


def _extra(kwargs: dict, key: str, reward: str) -> list:
    if key not in kwargs:
        raise KeyError(
            f"reward {reward!r} needs the multi-turn rollout's {key!r}; use it with dataset_name: sokoban | frozenlake"
        )
    return list(kwargs[key])


@register_reward("env_return")
def env_return(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
    """Episode return: Σ environment rewards + Σ format penalties."""
    return [float(v) for v in _extra(kwargs, "episode_return", "env_return")]


@register_reward("env_success")
def env_success(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
    """1.0 when the episode reached the goal, else 0.0."""
    return [float(bool(v)) for v in _extra(kwargs, "success", "env_success")]
