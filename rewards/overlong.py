"""DAPO's overlong reward shaping (Yu et al. 2025 §3.4, eq. 13) as a reward function: ``overlong_penalty``.

Added next to the task reward in a recipe (``reward_funcs: [math_accuracy, overlong_penalty]``): 0 up to
``L_max - L_cache`` tokens, a linear penalty down to ``-penalty_factor`` inside the last ``L_cache`` tokens,
``-penalty_factor`` at the cap. ``L_max`` is the run's ``max_completion_length``; ``L_cache`` and the factor are
the recipe's ``overlong_buffer_len`` / ``overlong_penalty_factor``. Length = the completion's token count as
TRL passes it (EOS included, padding excluded), as verl's ``valid_response_length``.
"""

from __future__ import annotations

from .registry import register_reward


def overlong_penalty_value(length: int, max_length: int, buffer_length: int, penalty_factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment R_length (§3.4, eq. 13), times ``penalty_factor``:

    0 for ``|y| <= L_max - L_cache``; ``((L_max - L_cache) - |y|) / L_cache`` inside the buffer (linear from 0 to
    -1); -1 for ``|y| > L_max`` (generation is capped at L_max, so -1 is reached at the cap). Added to the task
    reward."""
    if buffer_length <= 0 or buffer_length > max_length:
        raise ValueError(f"buffer_length must be in (0, max_length={max_length}], got {buffer_length}")
    expected = max_length - buffer_length
    exceed = min(max(length - expected, 0), buffer_length)
    return 0.0 if exceed == 0 else -penalty_factor * exceed / buffer_length


def make_overlong_penalty(
    max_completion_length: int | None = None, overlong_buffer_len: int = 4096, overlong_penalty_factor: float = 1.0
):
    """An ``overlong_penalty`` reward for completions capped at ``max_completion_length`` tokens."""

    def overlong_penalty(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
        """DAPO's soft overlong punishment of each completion (0 when short enough)."""
        if max_completion_length is None:
            raise ValueError(
                "overlong_penalty needs the run's max_completion_length: build it with "
                "rewards.get_reward('overlong_penalty', max_completion_length=..., overlong_buffer_len=...)"
            )
        if completion_ids is None:
            raise ValueError("overlong_penalty needs completion_ids (TRL passes them to every reward function)")
        return [
            overlong_penalty_value(len(ids), max_completion_length, overlong_buffer_len, overlong_penalty_factor)
            for ids in completion_ids
        ]

    return overlong_penalty


overlong_penalty = register_reward("overlong_penalty", factory=make_overlong_penalty)(make_overlong_penalty())
