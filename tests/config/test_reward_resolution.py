"""How a recipe's ``reward_funcs`` entries resolve (trainer/config/recipe_checks.py:resolve_reward): a user's module
file beside the recipe (a ``rewards.py`` is not shadowed by winnow's ``rewards`` package), the current directory,
installed modules; reward models (hub id, local folder, offline alias) passed on to TRL as names, checked like the
policy; reward_model_name_or_path first, as in trl grpo."""

from __future__ import annotations

import sys

import pytest

import rewards
from trainer.config.errors import RecipeError
from trainer.config.recipe_checks import is_reward_model, probe_rewards, resolve_reward


def test_a_rewards_py_beside_the_recipe_is_not_shadowed_by_winnows_package(tmp_path, monkeypatch):
    recipe_dir = tmp_path / "exp"
    recipe_dir.mkdir()
    (recipe_dir / "helpers_beside.py").write_text("BONUS = 0.25\n")
    (recipe_dir / "rewards.py").write_text(
        "from helpers_beside import BONUS\n"  # a sibling module imports as it would for `python` run there
        "def my_func(completions, **kwargs):\n"
        "    return [BONUS for _ in completions]\n"
        "def math_accuracy(completions, **kwargs):\n"
        "    return [-1.0 for _ in completions]\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))
    winnows = sys.modules["rewards"]
    fn = resolve_reward("rewards.my_func", {}, recipe_dir=recipe_dir)
    assert fn(completions=["a", "b"]) == [0.25, 0.25]
    import rewards as again

    assert again is winnows and sys.modules["rewards"] is winnows and "math_accuracy" in again.available()
    # a dotted path to the user's file wins over winnow's registered name; the bare name stays winnow's
    assert resolve_reward("rewards.math_accuracy", {}, recipe_dir=recipe_dir)(completions=["a"]) == [-1.0]
    assert resolve_reward("math_accuracy", {}, recipe_dir=recipe_dir) is rewards.get_reward("math_accuracy")
    # not beside the recipe: the current directory's package, then installed modules
    (elsewhere / "cwd_pkg_rw").mkdir()
    (elsewhere / "cwd_pkg_rw" / "__init__.py").write_text("")
    (elsewhere / "cwd_pkg_rw" / "mod.py").write_text("def fn(completions, **kw):\n"
                                                      "    return [2.0] * len(completions)\n")
    assert resolve_reward("cwd_pkg_rw.mod.fn", {}, recipe_dir=recipe_dir)(completions=["a"]) == [2.0]
    with pytest.raises(RecipeError, match="my_missing"):
        resolve_reward("rewards.my_missing", {}, recipe_dir=recipe_dir)


def test_reward_models_are_passed_on_as_names_and_checked_like_the_policy(tmp_path, monkeypatch):
    assert is_reward_model("org/reward-model-v1.5") and is_reward_model("offline:tiny-qwen3")
    assert is_reward_model(str(tmp_path)) and not is_reward_model("my_pkg.rewards.fn")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RecipeError, match="hf download"):
        resolve_reward("nobody-xyz/no-such-reward-model", {})
    with pytest.raises(RecipeError, match="no config.json"):
        resolve_reward(str(tmp_path), {})
    (tmp_path / "config.json").write_text("{}")
    assert resolve_reward(str(tmp_path), {}) == str(tmp_path)
    probe_rewards([str(tmp_path)], [str(tmp_path)], [{"prompt": "x"}])  # a model is not probed like a function


def test_recipe_reward_model_field_comes_first_and_counts_for_the_weights(tmp_path):
    from trainer.recipe import TaskArguments

    task = TaskArguments(reward_model_name_or_path="org/rm")
    assert task.reward_funcs == [] and task.reward_entries == ["org/rm"]  # trl grpo: no default function then
    task = TaskArguments(reward_model_name_or_path="org/rm", reward_funcs=["accuracy_reward"])
    assert task.reward_entries == ["org/rm", "accuracy_reward"]
    assert TaskArguments().reward_entries == ["math_accuracy"]
