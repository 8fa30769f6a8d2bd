"""Configuration: ``WinnowConfig`` (``core``: TRL's ``GRPOConfig`` plus the stage selectors) and its parts
(``errors``, ``server``, ``teacher``, ``env``), and the YAML recipe layer (``recipe``, ``recipe_parser``,
``recipe_checks``, ``yaml_types``) that turns a recipe file into a trainer.
"""
