"""Methods, one folder each (``trainer/methods/<method>/``): its config fields (``fields.py``, a mixin of
``WinnowConfig``), its stage (a thin adapter from a RolloutBatch to the pure functions in trainer/algorithms/) or hook
(for methods that need more of the run: trainer/pipeline/hooks.py), its config checks, and a docstring naming its docs
page and recipes. ``surrogate.py`` is what the surrogate-replacing loss variants share.

Importing this package registers nothing: trainer/methods/builtin.py does, imported by the stage registry on its first
lookup.
"""
