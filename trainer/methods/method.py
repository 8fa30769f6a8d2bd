"""What a method is to the rest of the trainer: its name, its config fields and the modules that register it.

A method is one folder, ``trainer/methods/<name>/`` (or a package of a user's), whose ``__init__.py`` imports its
parts and names them in one :class:`Method`::

    from trainer.methods.method import Method
    from trainer.methods.grpodropout import stage
    from trainer.methods.grpodropout.fields import GRPODropoutFields

    METHOD = Method("grpodropout", fields=GRPODropoutFields, registers=(stage,))

Importing the parts registers the method's stages, inputs, hooks and config checks (trainer/pipeline/stages.py,
trainer/pipeline/hooks.py); the catalog (trainer/methods/catalog.py) lists the built-in methods, one line each, and
that one list makes both ``WinnowConfig``'s fields and the registrations.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Method:
    """One method: ``name`` (its folder), ``fields`` (its config mixin, a dataclass of knobs with help text, or None)
    and ``registers`` (the modules whose import registered its stages and hooks: imported before the Method exists,
    listed so a reader, and the catalog, see what the folder adds)."""

    name: str
    fields: type | None
    registers: tuple[ModuleType, ...] = ()
