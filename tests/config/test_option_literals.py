"""Option sets are Literal types that the parser checks (issue 36, item 5).

Every config field whose value must be one of a fixed set of strings is typed ``Literal[...]``, and that type is the
one list of its options: HfArgumentParser makes it the flag's argparse ``choices`` (and ``--help`` shows them),
trainer/config/yaml_types.py checks a recipe's value against it, and ``WinnowConfig.__post_init__`` checks a Python
caller's (``trainer.config.core.option_fields``). The module tuples other code uses (``STD_KINDS``,
``FILTERED_UPDATES``, ``SCORE_METRICS``, ...) are derived from the same Literals with ``typing.get_args``.
"""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest
import yaml
from harness import BASE_ARGS, TRAIN_CLI_RECIPE

from trainer.algorithms import deal_plan, dropout, grpo, snr_filter, uecr
from trainer.config.core import ConfigError, WinnowConfig, option_fields
from trainer.recipe import TaskArguments, parse_recipe, recipe_parser

pytestmark = pytest.mark.unit

# Every option field and its options, in the order the type lists them (the first is not always the default).
EXPECTED = {
    "advantage_std": ("unbiased", "population"),
    "old_logps_source": ("policy", "sampler"),
    "dynamic_sampling_on_limit": ("partial", "error"),
    "dropout_selector": ("paper", "balanced_push", "balanced_push_neg"),
    "dropout_zero_push_groups": ("keep_all", "random_min_keep"),
    "dropout_delete": ("positive", "negative", "both"),
    "dropout_recenter": ("prob_weighted", "mean", "none"),
    "dropout_surprisal_basis": ("mean", "sum"),
    "snr_metric": ("reward_variance", "reward_std", "reward_sum", "reward_mean", "entropy", "entropy_variance",
                   "entropy_std", "length"),
    "snr_strategy": ("top_p", "top_k", "top_k_abs", "min_p"),
    "snr_top_p_mode": ("linear", "softmax"),
    "snr_keep": ("largest", "smallest"),
    "snr_loss_scaling": ("none", "linear", "sqrt"),
    "filtered_updates": ("fixed", "proportional", "verl_minibatch"),
    "entropy_aggregation": ("token_mean", "loss_type"),
    "collapse_turns": ("first", "all"),
    "weight_sync": ("auto", "nccl", "disk", "lora"),
    "weight_sync_dtype": ("auto", "float32", "bfloat16", "float16"),
    "teacher_dtype": ("auto", "float32", "bfloat16", "float16"),
    "uecr_normalization": ("joint", "separate"),
    "uecr_direction": ("tanh", "clip"),
    "uecr_confidence": ("exp", "inverse"),
    "uecr_projection_norm": ("one_plus_mean", "max"),
}

# str fields whose help quotes several values although they are not a fixed set -- each with the reason.
NOT_FIXED = {
    "rollout_filter": "a stage registry others extend (trainer.pipeline.stages.register_stage)",
    "rollout_dropout": "a stage registry",
    "advantage": "a stage registry",
    "loss_variant": "a stage registry",
    "dynamic_sampling_metric": "'reward' or the name of any reward function of the recipe",
}

# The module tuples that other code uses, each derived from the Literal that types its field.
DERIVED = {
    "advantage_std": grpo.STD_KINDS,
    "dropout_delete": dropout.DELETE_KINDS,
    "dropout_recenter": dropout.RECENTER_MODES,
    "dropout_surprisal_basis": dropout.SURPRISAL_BASES,
    "snr_metric": snr_filter.SCORE_METRICS,
    "snr_strategy": snr_filter.STRATEGIES,
    "snr_top_p_mode": snr_filter.TOP_P_MODES,
    "snr_keep": snr_filter.KEEP_MODES,
    "snr_loss_scaling": snr_filter.LOSS_SCALING,
    "filtered_updates": deal_plan.FILTERED_UPDATES,
    "uecr_direction": uecr.DIRECTIONS,
    "uecr_confidence": uecr.CONFIDENCES,
    "uecr_projection_norm": uecr.PROJECTION_NORMS,
}

# (field, a bad value): one field of each place an option set lives (core inline, trainer/algorithms, the pipeline,
# the server and teacher mixins).
BAD = [("collapse_turns", "some"), ("snr_keep", "middle"), ("filtered_updates", "adaptive"),
       ("weight_sync", "rsync"), ("uecr_confidence", "linear")]


def _hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def test_every_option_field_is_a_literal_with_its_options():
    hints = _hints(WinnowConfig)
    for name, options in EXPECTED.items():
        assert typing.get_origin(hints[name]) is typing.Literal, f"{name} is {hints[name]}, not a Literal"
        assert typing.get_args(hints[name]) == options, name
    assert option_fields(WinnowConfig) == EXPECTED  # no option field unlisted, none listed that is not one
    for name, options in DERIVED.items():
        assert tuple(options) == EXPECTED[name], f"the module tuple of {name} is not its Literal's options"
    for f in dataclasses.fields(WinnowConfig):
        if f.name in EXPECTED:
            assert f.default in EXPECTED[f.name], f"{f.name}'s default {f.default!r} is not an option"


def test_no_str_field_lists_quoted_options():
    """A str field (winnow's own, not TRL's) whose help quotes two or more values is an option set in disguise,
    unless it is one of NOT_FIXED (open sets)."""
    from trl import GRPOConfig

    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    for cls in (WinnowConfig, TaskArguments):
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in trl_fields or hints[f.name] is not str or f.name in NOT_FIXED:
                continue
            quoted = set(re.findall(r"'([a-z][a-z0-9_]*)'", f.metadata.get("help", "")))
            assert len(quoted) < 2, f"{cls.__name__}.{f.name} is str but its help lists options {sorted(quoted)}"
    assert not set(NOT_FIXED) & set(EXPECTED)


def test_the_parser_offers_the_options_as_choices():
    parser = recipe_parser()
    choices = {a.dest: tuple(a.choices) for a in parser.actions if a.choices}
    for name, options in EXPECTED.items():
        assert choices.get(name) == options, name
    text = " ".join(parser.format_help().split())
    assert "--snr_keep {largest,smallest}" in text and "--weight_sync {auto,nccl,disk,lora}" in text


def _recipe(tmp_path, **changes) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**TRAIN_CLI_RECIPE, "output_dir": str(tmp_path / "run"), **changes}))
    return str(path)


@pytest.mark.parametrize("name, bad", BAD)
def test_bad_value_in_a_recipe_names_the_field_and_options(tmp_path, name, bad):
    with pytest.raises(ConfigError) as err:
        parse_recipe(["--config", _recipe(tmp_path, **{name: bad})])
    assert err.value.field_name == name
    assert f"WinnowConfig.{name}: {bad!r} is not an option" in str(err.value)
    assert f"use one of {list(EXPECTED[name])}" in str(err.value)


def test_non_string_value_in_a_recipe_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"WinnowConfig\.snr_keep: 3 is not an option"):
        parse_recipe(["--config", _recipe(tmp_path, snr_keep=3)])


def test_good_values_parse_from_a_recipe_and_the_command_line(tmp_path):
    argv = ["--config", _recipe(tmp_path, snr_metric="length", uecr_confidence="inverse"), "--weight_sync_dtype",
            "bfloat16", "--filtered_updates", "proportional"]
    _, args, _ = parse_recipe(argv)
    assert (args.snr_metric, args.uecr_confidence, args.weight_sync_dtype, args.filtered_updates) == (
        "length", "inverse", "bfloat16", "proportional")


@pytest.mark.parametrize("name, bad", BAD)
def test_bad_flag_is_an_argparse_error_naming_the_choices(tmp_path, name, bad, capsys):
    """Plain HfArgumentParser: argparse's own 'invalid choice' (exit 2); the recipe parser: one RecipeError line."""
    from transformers import HfArgumentParser

    choices = ", ".join(repr(o) for o in EXPECTED[name])
    with pytest.raises(SystemExit) as exit_:
        HfArgumentParser(WinnowConfig).parse_args_into_dataclasses([f"--{name}", bad, "--output_dir", str(tmp_path)])
    assert exit_.value.code == 2
    stderr = capsys.readouterr().err
    assert f"--{name}" in stderr and f"invalid choice: {bad!r} (choose from {choices})" in stderr, stderr
    with pytest.raises(ConfigError) as err:
        parse_recipe(["--config", _recipe(tmp_path), f"--{name}", bad])
    assert str(err.value).startswith(f"--{name}: invalid choice: {bad!r} (choose from {choices})")


def test_bad_flag_through_the_train_cli_is_one_line(tmp_path, capsys, monkeypatch):
    from trainer.cli.train import main

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    capsys.readouterr()
    assert main(["--config", _recipe(tmp_path), "--snr_top_p_mode", "cubic"]) == 2
    line = capsys.readouterr().err.strip()
    assert line == ("error: --snr_top_p_mode: invalid choice: 'cubic' (choose from 'linear', 'softmax'). Fix: see "
                    "`python launch/train.py --help` for the fields"), line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, bad", BAD)
def test_bad_value_from_python_names_the_field_and_options(tmp_path, name, bad):
    """A Python caller bypasses argparse: WinnowConfig's own check reads the options from the Literal."""
    with pytest.raises(ConfigError) as err:
        WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, name: bad})
    assert err.value.field_name == name
    assert str(err.value) == (f"WinnowConfig.{name}: {bad!r} is not an option. "
                              f"Fix: use one of {list(EXPECTED[name])}")


def test_the_environment_prompt_is_an_option_field_too(tmp_path):
    """The recipe's task fields follow the same rule: env_prompt's options are its Literal, offered by the parser."""
    hints = _hints(TaskArguments)
    assert typing.get_origin(hints["env_prompt"]) is typing.Literal
    assert typing.get_args(hints["env_prompt"]) == ("ragen", "detailed")
    choices = {a.dest: tuple(a.choices) for a in recipe_parser().actions if a.choices}
    assert choices["env_prompt"] == ("ragen", "detailed")
