"""Type-check a YAML recipe's values against the dataclass fields they set, naming the key.

TRL's parser hands YAML values to argparse as *defaults*, and argparse converts only strings: a list, a
mapping or a bool written where a number belongs reaches the config untouched and fails later with an
unrelated error (``'>' not supported between 'list' and 'int'``) or, worse, is accepted. Command-line
values are strings and argparse checks them itself (its error names the flag).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, Iterable

from trainer.config.errors import ConfigError


def _matches(value: Any, hint: Any) -> bool:
    if hint is Any or hint is typing.Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, hint) or value in {m.value for m in hint} or value in hint.__members__
    if isinstance(value, str) and hint in (bool, int, float):
        return _parses(value, hint)  # argparse converts string defaults itself (YAML reads 1e-6 as a string)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple) or hint in (list, tuple):
        args = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            return False
        item = args[0] if args and args[-1] is not Ellipsis or len(args) == 2 else Any
        return all(_matches(v, item) for v in value) if args else True
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True  # anything more exotic is left to the config's own validation


def _parses(text: str, hint: type) -> bool:
    if hint is bool:
        return text.strip().lower() in {"yes", "no", "true", "false", "t", "f", "y", "n", "1", "0"}
    try:
        hint(text)
    except ValueError:
        return False
    return True


def check_recipe_types(config: dict[str, Any], classes: Iterable[type]) -> None:
    """Raise :class:`ConfigError` for the first recipe key whose value does not fit its field's type."""
    hints: dict[str, Any] = {}
    for cls in classes:
        resolved = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hints.setdefault(f.name, resolved.get(f.name, Any))
    for key, value in config.items():
        if key in hints and not _matches(value, hints[key]):
            if typing.get_origin(hints[key]) is typing.Literal:  # an option field: the config's own message
                options = list(typing.get_args(hints[key]))
                raise ConfigError(key, f"{value!r:.80} is not an option", f"use one of {options}")
            expected = getattr(hints[key], "__name__", None) or str(hints[key]).replace("typing.", "")
            raise ConfigError(key, f"expects {expected}, got {type(value).__name__} {value!r:.80}",
                              f"write a value of type {expected} for {key!r} in the recipe")
