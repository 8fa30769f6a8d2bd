"""Other trainers' reward names in a winnow recipe: TRL's (``trl grpo``'s registry) and open-r1's.

TRL 1.16's ``trl/scripts/grpo.py`` registers four names; here each is TRL's reward, run as winnow runs rewards:

- ``think_format_reward``: TRL's own function (a regex), given the text of plain-text completions too;
- ``get_soft_overlong_punishment``: TRL's own reward built with the values ``trl grpo`` uses
  (``max_completion_len=1280, soft_punish_cache=256``), whatever the recipe's ``max_completion_length`` -- a TRL recipe
  gets what ``trl grpo`` gives it. Winnow's ``overlong_penalty`` is the one sized to the recipe (DAPO's L_max =
  max_completion_length, ``overlong_buffer_len``, ``overlong_penalty_factor``);
- ``accuracy_reward`` and ``reasoning_accuracy_reward`` (also as ``trl.rewards.accuracy_reward`` /
  ``trl.rewards.reasoning_accuracy_reward``): TRL's grading -- the same Math-Verify settings on the same text, 1.0 /
  0.0, None for a gold it cannot parse, ``solution`` logged to the completions table -- run in winnow's verifier
  worker (:func:`rewards.verifier.grade_batch`) instead of in the trainer's process. TRL's function relies on
  Math-Verify's ``signal.alarm`` limits (parsing 10 s, verification 5 s), spent in the trainer's process, and an
  alarm cannot interrupt a call stuck in C code; winnow's rule is that a verifier has a hard
  limit, so each completion gets ``reward_timeout`` seconds of wall-clock time (default 2) and scores 0.0 over it, as
  TRL scores its own time-outs. Differences: a plain-text completion (a dataset whose prompt is a string) is graded
  as is where TRL's function fails on it, and the completions table gets ``solution`` but not TRL's
  ``gold_parsed`` / ``answer_parsed``.

open-r1 (huggingface/open-r1@bd581c7e73bbd0b63b6605fc1ed4b51d231fa597, src/open_r1/grpo.py's REWARD_FUNCS_REGISTRY)
names ``accuracy`` and ``format`` in its demo recipe; both are here, graded as its ``accuracy_reward`` and
``format_reward`` grade (src/open_r1/rewards.py:11-58): ``accuracy`` with its Math-Verify settings in the verifier
worker (1.0 for a gold it cannot parse, as open-r1 gives), ``format`` by winnow's own linear scan of its pattern. Its
other names (:data:`OPEN_R1_NOT_HERE`) are refused with the names that exist.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from .registry import register_lazy_reward, register_reward
from .verifier import DEFAULT_TIMEOUT, NO_GOLD, grade_batch

# trl grpo's values of get_soft_overlong_punishment (trl/scripts/grpo.py, TRL 1.16)
TRL_OVERLONG_MAX_COMPLETION_LEN = 1280
TRL_OVERLONG_SOFT_PUNISH_CACHE = 256
TRL_NAMES = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward", "get_soft_overlong_punishment")
# Dotted paths to TRL's accuracy rewards: the same reward as the bare name (graded under a hard limit).
TRL_DOTTED = {"trl.rewards.accuracy_reward": "accuracy_reward",
              "trl.rewards.accuracy_rewards.accuracy_reward": "accuracy_reward",
              "trl.rewards.reasoning_accuracy_reward": "reasoning_accuracy_reward",
              "trl.rewards.accuracy_rewards.reasoning_accuracy_reward": "reasoning_accuracy_reward"}
OPEN_R1_NAMES = ("accuracy", "format")
# open-r1's other reward names (its registry at bd581c7 and after), refused with the names that exist.
OPEN_R1_NOT_HERE = ("reasoning_steps", "cosine", "repetition_penalty", "length", "tag_count", "format_deepseek",
                    "code", "code_format", "binary_code", "ioi_code", "cf_code", "soft_overlong_punishment")


def _content(completion: Any) -> str:
    """The text TRL's and open-r1's rewards read: ``completion[0]["content"]`` of a conversation, a string as is."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    first = completion[0] if completion else {}
    content = first.get("content") if isinstance(first, dict) else first
    return "" if content is None else str(content)


# What GRPOTrainer passes besides the dataset's columns
_TRAINER_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                   "environments")


def _solutions(kwargs: dict, name: str, n: int) -> list:
    if "solution" not in kwargs:  # a recipe error, not a model error: fail loudly (probe_rewards reports it)
        columns = sorted(k for k in kwargs if k not in _TRAINER_KWARGS)
        raise KeyError(f"{name} reads the dataset column 'solution'; this dataset has {columns}. Map a column to "
                       "solution with dataset_columns (e.g. {solution: answer}), or use math_accuracy, which reads "
                       "'answer'")
    solution = list(kwargs["solution"])
    if len(solution) != n:
        raise ValueError(f"'solution' has {len(solution)} entries for {n} completions")
    return solution


def make_trl_accuracy(timeout: float = DEFAULT_TIMEOUT) -> Callable[..., list]:
    def accuracy_reward(completions, log_extra=None, **kwargs) -> list[float | None]:
        """TRL's accuracy_reward (trl/rewards/accuracy_rewards.py), graded in winnow's verifier worker."""
        solution = _solutions(kwargs, "accuracy_reward", len(completions))
        grades = grade_batch([(_content(c), s) for c, s in zip(completions, solution)], "trl", timeout)
        if log_extra is not None:
            log_extra("solution", solution)
        return [None if g == NO_GOLD else float(g is True) for g in grades]

    return accuracy_reward


def make_trl_reasoning_accuracy(timeout: float = DEFAULT_TIMEOUT) -> Callable[..., list]:
    def reasoning_accuracy_reward(completions, reasoning_delimiters=None, log_extra=None, **kwargs):
        """TRL's reasoning_accuracy_reward: the text after the first delimiter found (default ``</think>``) graded as
        accuracy_reward; 0.0 when no delimiter closes the reasoning."""
        solution = _solutions(kwargs, "reasoning_accuracy_reward", len(completions))
        delimiters = ["</think>"] if reasoning_delimiters is None else reasoning_delimiters
        answers: list[str | None] = []
        for c in completions:
            text = _content(c)
            delim = next((d for d in delimiters if d in text), None)
            answers.append(None if delim is None else text.split(delim)[-1])
        todo = [i for i, a in enumerate(answers) if a is not None]
        grades = dict(zip(todo, grade_batch([(answers[i], solution[i]) for i in todo], "trl", timeout)))
        if log_extra is not None:
            log_extra("solution", solution)
        return [0.0 if i not in grades else None if grades[i] == NO_GOLD else float(grades[i] is True)
                for i in range(len(completions))]

    return reasoning_accuracy_reward


def make_open_r1_accuracy(timeout: float = DEFAULT_TIMEOUT) -> Callable[..., list]:
    def accuracy_reward(completions, **kwargs) -> list[float]:
        """open-r1's accuracy_reward (bd581c7, src/open_r1/rewards.py:11-50): 1.0 when the answer verifies against
        the gold, 0.0 otherwise (and over the time limit), 1.0 for a gold it cannot parse."""
        solution = _solutions(kwargs, "accuracy", len(completions))
        grades = grade_batch([(_content(c), s) for c, s in zip(completions, solution)], "open_r1", timeout)
        return [1.0 if g == NO_GOLD else float(g is True) for g in grades]

    return accuracy_reward


def open_r1_format_matches(text: str) -> bool:
    """Whether ``text`` matches open-r1's format pattern ``^<think>.*?</think>\\s*<answer>.*?</answer>$`` under
    ``re.match(..., re.DOTALL | re.MULTILINE)`` (bd581c7, src/open_r1/rewards.py:53-58), in linear time: it opens
    with ``<think>``; some ``</think>`` (after it) is followed by whitespace and ``<answer>``; after that, some
    ``</answer>`` ends a line (the text's end or a newline follows: MULTILINE's ``$``)."""
    if not text.startswith("<think>"):
        return False
    at = text.find("</think>", len("<think>"))
    while at >= 0:
        k = at + len("</think>")
        while k < len(text) and text[k].isspace():
            k += 1
        if text.startswith("<answer>", k):
            # the earliest such <answer> leaves the most room for a closing tag: it alone decides
            end = text.find("</answer>", k + len("<answer>"))
            while end >= 0:
                after = end + len("</answer>")
                if after == len(text) or text[after] == "\n":
                    return True
                end = text.find("</answer>", end + 1)
            return False
        at = text.find("</think>", at + 1)
    return False


def format_reward(completions, **kwargs) -> list[float]:
    """open-r1's format_reward: 1.0 for ``<think>...</think> <answer>...</answer>``, else 0.0."""
    return [1.0 if open_r1_format_matches(_content(c)) else 0.0 for c in completions]


def _trl_think_format():
    from trl.rewards import think_format_reward as trl_think_format  # lazy: register_lazy_reward (not on import)

    @functools.wraps(trl_think_format)  # its name (the metric's) and __wrapped__
    def think_format_reward(completions, **kwargs) -> list[float]:
        """TRL's think_format_reward, also on plain-text completions (TRL's reads ``completion[0]["content"]``)."""
        return trl_think_format([[{"content": _content(c)}] for c in completions], **kwargs)

    return think_format_reward


def _trl_soft_overlong():
    from trl.rewards import get_soft_overlong_punishment  # lazy: register_lazy_reward (not on import)

    return get_soft_overlong_punishment(max_completion_len=TRL_OVERLONG_MAX_COMPLETION_LEN,
                                        soft_punish_cache=TRL_OVERLONG_SOFT_PUNISH_CACHE)


register_reward("accuracy_reward", factory=make_trl_accuracy)(make_trl_accuracy())
register_reward("reasoning_accuracy_reward", factory=make_trl_reasoning_accuracy)(make_trl_reasoning_accuracy())
register_lazy_reward("think_format_reward", _trl_think_format)  # imports trl when a recipe names it
register_lazy_reward("get_soft_overlong_punishment", _trl_soft_overlong)
register_reward("accuracy", factory=make_open_r1_accuracy)(make_open_r1_accuracy())
register_reward("format")(format_reward)
