"""From a command line to the recipe's dataclasses, with errors a user can act on.

TRL's ``TrlParser`` reads ``--config recipe.yaml`` and lets ``--field value`` override it; this parser keeps
that contract and adds what a user needs when something is off, before anything heavy happens:

- the ``--config`` file: missing, or not YAML (line and column), or not a mapping;
- a key that is no field (YAML or command line), with the nearest valid name;
- ``import_modules``: the recipe's own modules (a user's stage or reward registers itself on import) are
  imported before the values are checked, so their names are valid in the same recipe;
- argparse's own errors (a value of the wrong type) as one line instead of usage + message;
- ``--help`` that opens with a description and an example, shows ``--config``, lists each stage's choices
  by name and groups the several hundred options (run, task, stages, ..., TRL, transformers).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml
from trl import TrlParser

from trainer.config.errors import RecipeError
from trainer.config.foreign_keys import foreign_key_error

HELP_HINT = "see `python launch/train.py --help` for the fields"



class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each help text; the description and epilog keep their line breaks."""


class RecipeParser(TrlParser):
    """``TrlParser`` over the recipe's dataclasses, with one-line errors and grouped ``--help``."""

    def __init__(self, classes: Sequence[type], sections: Sequence[tuple[str, str, Sequence[str]]],
                 description: str, epilog: str):
        super().__init__(classes, description=description, epilog=epilog, formatter_class=_Formatter,
                         usage="%(prog)s --config RECIPE.yaml [--FIELD VALUE ...]", allow_abbrev=False)
        self.fields = {a.dest for a in self._actions if a.dest != "help"}
        run = self.run_group = self.add_argument_group("run")  # recipe.py adds its command-line-only flags here
        # Read by parse_recipe_argv before argparse runs; declared here only so --help shows it.
        run.add_argument("--config", metavar="RECIPE.yaml", default=argparse.SUPPRESS,
                         help="The recipe: a YAML mapping of any of the fields below, e.g. --config "
                         "configs/demo/smollm2-arithmetic.yaml. Command-line flags override its values.")
        self._move(run, ("help", *sections[0][2]))
        for title, text, names in sections[1:]:
            self._move(self.add_argument_group(title, text), names)
        self._optionals.title = "other options"  # empty (and so not shown) once every field has its topic

    @property
    def actions(self) -> list[argparse.Action]:
        """Every option, in the order added (argparse keeps them in ``_actions`` and has no public accessor)."""
        return self._actions

    def _move(self, group: argparse._ArgumentGroup, names: Sequence[str]) -> None:
        # argparse has no public way to regroup actions the dataclass parser already added; its help
        # formatter walks each group's _group_actions, so moving them there is the whole change.
        order = {name: i for i, name in enumerate(names)}
        other = self._optionals._group_actions  # noqa: SLF001 -- argparse's, no public accessor
        for action in sorted((a for a in other if a.dest in order), key=lambda a: order[a.dest]):
            other.remove(action)
            group._group_actions.append(action)  # noqa: SLF001 -- argparse's, no public accessor

    def error(self, message: str):  # argparse calls this for a bad value; default: usage + message, exit 2
        """Raise a :class:`RecipeError` instead of printing argparse's usage block."""
        if message.startswith("argument ") and ": " in message:  # "argument --lr/--lr-x: invalid float value: 'a'"
            flags, problem = message[len("argument "):].split(": ", 1)
            raise RecipeError(flags.split("/")[0], problem, HELP_HINT)
        raise RecipeError("command line", message, HELP_HINT)

    def nearest(self, key: str) -> str:
        """``did you mean 'x'?`` for a mistyped key, or the help hint."""
        close = difflib.get_close_matches(key, sorted(self.fields), n=1, cutoff=0.6)
        return f"did you mean {close[0]!r}?" if close else HELP_HINT


def own_fields(cls: type) -> list[str]:
    """Fields a dataclass declares itself (not inherited from a dataclass base)."""
    inherited = {
        name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for name in base.__dataclass_fields__
    }
    return [f.name for f in dataclasses.fields(cls) if f.name not in inherited]


def split_config_flag(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(path of --config, the other arguments)``; accepts ``--config PATH`` and ``--config=PATH``."""
    rest, path, it = [], None, iter(argv)
    for arg in it:
        if arg == "--config":
            path = next(it, None)
            if path is None:
                raise RecipeError("--config", "no file named after --config", "write --config configs/<recipe>.yaml")
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return path, rest


def pop_cli_flag(argv: Sequence[str], name: str) -> tuple[bool, list[str]]:
    """``(value of the boolean --name, the other arguments)``: ``--name``, ``--name true|false``, ``--name=...``;
    the last one given wins. For the flags only the command line may set (``CLI_ONLY`` in recipe.py)."""
    rest, value, args = [], False, list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        flag = arg.split("=", 1)[0].replace("-", "_")
        if flag == f"__{name}":  # --allow_unsafe_env or --allow-unsafe-env, as argparse's other fields
            if "=" in arg:
                text = arg.split("=", 1)[1]
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                text, i = args[i + 1], i + 1
            else:
                text = "true"
            word = text.strip().lower()
            if word not in ("true", "false", "yes", "no", "1", "0"):
                raise RecipeError(f"--{name}", f"{text!r} is not a boolean", f"write --{name} true")
            value = word in ("true", "yes", "1")
        else:
            rest.append(arg)
        i += 1
    return value, rest


def read_recipe_file(path: str) -> dict[str, Any]:
    """The recipe YAML as a mapping; a missing file or a YAML error (with line and column) is a RecipeError."""
    if not Path(path).is_file():
        raise RecipeError(
            "--config", f"no recipe file {path!r}",
            "check the path (the shipped recipes are under configs/, e.g. configs/demo/smollm2-arithmetic.yaml)",
        )
    try:
        config = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise RecipeError(
            "--config", f"{where}: not valid YAML ({problem})",
            "fix the YAML at that line and column (one `key: value` per line, consistent indentation)",
        ) from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise RecipeError("--config", f"{path} holds a {type(config).__name__}, not a mapping of fields",
                          "write one `field: value` per line")
    return config


def cli_values(argv: Sequence[str], flag: str) -> list[str] | None:
    """The values given to ``--flag`` on the command line (``None`` when the flag is absent)."""
    for i, arg in enumerate(argv):
        if arg == f"--{flag}":
            values = []
            for value in argv[i + 1:]:
                if value.startswith("--"):
                    break
                values.append(value)
            return values
        if arg.startswith(f"--{flag}="):
            return [arg.split("=", 1)[1]]
    return None


def import_modules(modules: Sequence[str]) -> None:
    """Import the recipe's own modules (they register stages, rewards or datasets on import)."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` would: a module next to where the user runs from
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise RecipeError(
                "import_modules", f"cannot import {name!r} ({e})",
                "run from the folder that holds the module, or install its package (pip install -e .)",
            ) from None


def check_keys(parser: RecipeParser, config: dict[str, Any], remaining: Sequence[str]) -> None:
    """Unknown YAML keys and unknown command-line flags: another trainer's key (trainer/config/foreign_keys.py) with
    the winnow way, any other with the nearest valid name."""
    for key in config:
        if key != "env" and key not in parser.fields:  # `env` is TrlParser's: environment variables to set
            foreign = foreign_key_error(str(key))
            raise RecipeError(str(key), *(foreign or ("is not a recipe field", parser.nearest(str(key)))))
    for arg in remaining:
        if arg.startswith("--"):
            key = arg[2:].split("=", 1)[0]
            foreign = foreign_key_error(key.replace("-", "_"))
            raise RecipeError(arg.split("=", 1)[0], *(foreign or ("is not a recipe field", parser.nearest(key))))
    if remaining:
        raise RecipeError(
            "command line", f"unexpected value {remaining[0]!r}", "write every value after its --field flag"
        )
