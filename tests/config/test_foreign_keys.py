"""Keys of TRL's and open-r1's recipes that winnow takes differently (trainer/config/foreign_keys.py): each is one
line naming the key, where it comes from and the winnow way, in a YAML recipe and on the command line alike."""

from __future__ import annotations

import pytest
import yaml

from trainer.config.errors import RecipeError
from trainer.config.foreign_keys import FOREIGN_KEYS
from trainer.recipe import parse_recipe

# key -> a value its own trainer accepts, and a word the fix must contain (the winnow way)
VALUES = {
    "torch_dtype": ("bfloat16", "dtype: bfloat16"),
    "dataset_configs": (["default"], "dataset_config:"),
    "vllm_device": ("auto", "vllm_mode"),
    "max_prompt_length": (512, "max_prompt_tokens"),
    "warmup_ratio": (0.1, "warmup_steps: 0.1"),
    "dataset_mixture": ({"datasets": [{"id": "a/b"}]}, "dataset_name"),
    "datasets": ([{"path": "a/b"}], "dataset_name"),
}


def test_every_foreign_key_has_a_case():
    assert set(VALUES) == set(FOREIGN_KEYS)


@pytest.mark.parametrize("key", sorted(VALUES))
def test_a_foreign_key_in_a_recipe_names_the_winnow_way(key, tmp_path):
    value, fix = VALUES[key]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": "offline:tiny-qwen3", key: value}))
    with pytest.raises(RecipeError) as raised:
        parse_recipe(["--config", str(recipe), "--output_dir", str(tmp_path / "run")])
    line = str(raised.value)
    assert line.startswith(f"{key}: ") and "not a recipe field" not in line and fix in line.split("Fix:", 1)[1]


def test_a_foreign_flag_on_the_command_line_names_the_winnow_way(tmp_path):
    with pytest.raises(RecipeError) as raised:
        parse_recipe(["--output_dir", str(tmp_path / "run"), "--bf16", "false", "--use_cpu", "true",
                      "--torch_dtype", "bf16"])
    assert str(raised.value).startswith("--torch_dtype: is the old name") and "dtype: bfloat16" in str(raised.value)


def test_an_unknown_key_still_gets_the_nearest_name(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rat: 0.1\n")
    with pytest.raises(RecipeError, match="did you mean 'learning_rate'"):
        parse_recipe(["--config", str(recipe), "--output_dir", str(tmp_path / "run")])
