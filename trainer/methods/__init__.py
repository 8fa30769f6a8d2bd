"""Methods, one folder each (``trainer/methods/<method>/``): its config fields (``fields.py``, a mixin of
``WinnowConfig``), its stage (a thin adapter from a RolloutBatch to the pure functions in trainer/algorithms/) or hook
(for methods that need more of the run: trainer/pipeline/stages.py), its config checks, and a docstring naming its docs
page and recipes (its ``__init__.py``, only a docstring). ``surrogate.py`` is what the surrogate-replacing loss
variants share.

Importing this package registers nothing: trainer/methods/catalog.py names each built-in method in one
:class:`~trainer.methods.method.Method` line (its fields and the modules that register it) and imports those modules
(the config imports the catalog, so a config and a trainer always see every built-in method).
"""
