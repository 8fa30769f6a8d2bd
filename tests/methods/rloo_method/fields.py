"""RLOO's knob: a config mixin, as every built-in method's fields.py."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RLOOFields:
    """RLOO (``advantage: test_outside_rloo``)."""

    rloo_scale: float = field(default=1.0, metadata={"help": "Multiplies the leave-one-out advantage (> 0)."})
