"""Configuration: ``WinnowConfig`` (``core``: TRL's ``GRPOConfig`` plus the stage selectors) and its parts
(``errors``, ``server``, ``teacher``, ``env``), the YAML recipe layer (``recipe``, ``recipe_parser``,
``recipe_checks``, ``yaml_types``) that turns a recipe file into a trainer, and ``redaction`` (the rule that keeps
secrets out of what is written or logged).
"""
