"""Methods: stages (thin adapters from a RolloutBatch to the pure functions in trainer/algorithms/) and hooks (the
methods that need more of the run: trainer/pipeline/hooks.py). A method with a folder of its own
(``trainer/methods/grpodropout/``, ``trainer/methods/snr/``) keeps there its config fields, its stage and its config
checks.

Importing this package registers nothing: trainer/methods/builtin.py does, imported by the stage registry on its first
lookup.
"""
