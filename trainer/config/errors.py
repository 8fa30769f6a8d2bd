"""The configuration error of every config module (its own module, so the config parts need not import each other)."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration value: the message names the field and how to fix it."""

    def __init__(self, field_name: str, problem: str, fix: str):
        self.field_name = field_name
        super().__init__(f"WinnowConfig.{field_name}: {problem}. Fix: {fix}")
