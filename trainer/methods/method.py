"""What a method is to the rest of the trainer: its name, its config fields and the modules that register it.

A method is one folder, ``trainer/methods/<name>/`` (or a package of a user's), named by one :class:`Method`::

    Method("grpodropout", fields=GRPODropoutFields, registers=(grpodropout_stage,))

Importing the parts registers the method's stages, inputs, hooks and config checks (trainer/pipeline/stages.py,
trainer/pipeline/stages.py); the catalog (trainer/methods/catalog.py) holds the built-in methods' lines, and that one
list makes both ``WinnowConfig``'s fields and the registrations. A user's method builds its line in its own package
and hands it to ``catalog.add``.
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
