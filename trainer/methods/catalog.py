"""The built-in methods, one line each. This list is the only place a built-in method is named outside its folder:
``WinnowConfig`` mixes in each method's fields in this order (trainer/config/core.py), and importing this module
imports each method's folder, whose parts register its stages, inputs, hooks and config checks -- in this order,
which is the order hooks are built and called in.

A method of a user's (a folder outside the package) adds itself with :func:`add` and brings a config class that mixes
in its fields (``class MyConfig(MyFields, WinnowConfig)``); docs/design.md, "Adding a method".
"""

from __future__ import annotations

from trainer.methods import (
    collapse,
    cov_losses,
    dynamic_sampling,
    grpodropout,
    low_success_stop,
    ppo,
    reward_variance_stop,
    snr,
    uecr,
)
from trainer.methods.method import Method

BUILTIN: tuple[Method, ...] = (
    collapse.METHOD,
    cov_losses.METHOD,
    dynamic_sampling.METHOD,
    grpodropout.METHOD,
    low_success_stop.METHOD,
    ppo.METHOD,
    reward_variance_stop.METHOD,
    snr.METHOD,
    uecr.METHOD,
)

_ADDED: list[Method] = []


def add(method: Method) -> Method:
    """Add a user's method (its parts already imported, so its stages and hooks are registered); a name already in
    the catalog is an error."""
    if any(m.name == method.name for m in methods()):
        raise ValueError(f"a method named {method.name!r} is already in the catalog")
    _ADDED.append(method)
    return method


def methods() -> tuple[Method, ...]:
    """Every method: the built-in ones, then the users' in the order added."""
    return BUILTIN + tuple(_ADDED)


def field_mixins() -> tuple[type, ...]:
    """The built-in methods' config mixins, in catalog order (``WinnowConfig``'s bases)."""
    return tuple(m.fields for m in BUILTIN if m.fields is not None)


def missing_fields(args: object) -> list[Method]:
    """The methods whose fields ``args``'s class does not mix in (a user's method used with plain WinnowConfig)."""
    return [m for m in methods() if m.fields is not None and not isinstance(args, m.fields)]
