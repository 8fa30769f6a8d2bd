"""The configuration errors of every config module (their own module, so the config parts need not import each
other, and whatever raises one imports nothing else)."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration value: the message names the field and how to fix it."""

    def __init__(self, field_name: str, problem: str, fix: str):
        self.field_name = field_name
        super().__init__(f"WinnowConfig.{field_name}: {problem}. Fix: {fix}")


class RecipeError(ConfigError):
    """A recipe or command-line mistake found before any weights load: ``<where>: <what>. Fix: <how>``."""

    def __init__(self, field_name: str, problem: str, fix: str):
        ValueError.__init__(self, f"{field_name}: {problem.rstrip('. ')}. Fix: {fix}")
        self.field_name = field_name
