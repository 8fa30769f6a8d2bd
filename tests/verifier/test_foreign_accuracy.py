"""TRL's accuracy_reward / reasoning_accuracy_reward and open-r1's ``accuracy`` in a recipe (rewards/foreign.py),
graded in winnow's verifier worker with each trainer's own Math-Verify settings. TRL's are checked against TRL's own
functions (called here in the main thread, where their signal.alarm limits work); open-r1's against values read off
its code (huggingface/open-r1@bd581c7e73bbd0b63b6605fc1ed4b51d231fa597, src/open_r1/rewards.py:11-50)."""

from __future__ import annotations

import time

import pytest

from trainer.config.errors import RecipeError
from trainer.config.recipe_checks import probe_rewards, resolve_reward


def _chat(texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


# (solution, completion, TRL's accuracy_reward, open-r1's accuracy) -- TRL's gold parse takes a bare "5" (its
# default extraction includes plain expressions) and gives None for a gold it cannot parse; open-r1 parses the gold
# as LaTeX only and gives 1.0 ("skip") for one it cannot parse.
ACCURACY_CASES = [
    ("$\\frac{1}{3}$", "The answer is \\boxed{\\frac{1}{3}}", 1.0, 1.0),
    ("$\\frac{1}{3}$", "\\boxed{\\frac{1}{2}}", 0.0, 0.0),
    ("$\\frac{1}{3}$", "1/3", 0.0, 0.0),  # no anchor, no box: nothing extracted (try_extract_without_anchor=False)
    ("$\\frac{1}{2}$", "\\boxed{\\frac12}", 0.0, 0.0),  # malformed operators are not repaired in the answer
    ("$\\frac{1}{2}$", "\\boxed{0.5}", 1.0, 1.0),
    ("$3 \\times 4 = \\boxed{12}$", "so \\boxed{12}.", 1.0, 1.0),
    ("no math here", "\\boxed{1}", None, 1.0),
    ("5", "\\boxed{4}", 0.0, 1.0),
]


def test_trl_accuracy_rewards_grade_as_trls_own_functions():
    from trl.rewards import accuracy_reward as trl_accuracy
    from trl.rewards import reasoning_accuracy_reward as trl_reasoning

    solutions = [c[0] for c in ACCURACY_CASES]
    completions = _chat([c[1] for c in ACCURACY_CASES])
    ours = resolve_reward("accuracy_reward", {"timeout": 5.0})
    assert ours.__name__ == "accuracy_reward"  # TRL's metric name: rewards/accuracy_reward/mean
    expected = [c[2] for c in ACCURACY_CASES]
    assert trl_accuracy(completions, solutions) == expected
    logged = {}
    assert ours(completions=completions, solution=solutions, log_extra=logged.__setitem__) == expected
    assert logged["solution"] == solutions
    # the dotted path names the same reward (graded under winnow's hard limit, not in the trainer's process)
    assert resolve_reward("trl.rewards.accuracy_reward", {})(completions=completions, solution=solutions) == expected
    assert ours(completions=[c[0]["content"] for c in completions], solution=solutions) == expected  # plain text

    thinking = _chat([f"<think>{c[1]}</think>{c[1]}" for c in ACCURACY_CASES] + ["<think>\\boxed{5} cut off"])
    solutions.append("5")
    reasoning = resolve_reward("reasoning_accuracy_reward", {"timeout": 5.0})
    assert trl_reasoning(thinking, solutions) == expected + [0.0]
    assert reasoning(completions=thinking, solution=solutions) == expected + [0.0]


def test_open_r1_accuracy_scores_as_open_r1():
    solutions = [c[0] for c in ACCURACY_CASES]
    completions = _chat([c[1] for c in ACCURACY_CASES])
    accuracy = resolve_reward("accuracy", {"timeout": 5.0})
    assert accuracy.__name__ == "accuracy_reward"  # open-r1's function name, its metric name
    assert accuracy(completions=completions, solution=solutions) == [c[3] for c in ACCURACY_CASES]


def test_accuracy_reward_without_solution_column_is_one_line_naming_the_fix():
    fn = resolve_reward("accuracy_reward", {})
    dataset = [{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}]
    with pytest.raises(RecipeError) as e:
        probe_rewards([fn], ["accuracy_reward"], dataset)
    line = str(e.value)
    assert "reads the dataset column 'solution'; this dataset has ['answer']" in line
    assert "dataset_columns" in line and "math_accuracy" in line


@pytest.mark.parametrize("name", ["accuracy_reward", "accuracy"])
def test_a_completion_math_verify_cannot_finish_scores_0_within_the_hard_limit(name):
    """Graded in the worker, a completion Math-Verify cannot finish gets reward_timeout seconds, then 0.0 (as TRL
    scores its own time-outs). TRL's function, run in the trainer's process, spends its signal.alarm limits on it
    instead (about 8 s here: parsing 10 s + verification 5 s allowed per item) -- this bound fails for it."""
    fn = resolve_reward(name, {"timeout": 1.0})
    bomb = "\\boxed{9^{9^{9^{9}}}}"
    t0 = time.perf_counter()
    assert fn(completions=_chat([bomb, "\\boxed{3}"]), solution=["$3$", "$3$"]) == [0.0, 1.0]
    assert time.perf_counter() - t0 < 5.0
