"""GRPODropout (drop high-probability positive-advantage rollouts, recenter the rest), all in this folder:

- ``fields.py``: its knobs, a mixin of ``WinnowConfig`` (``dropout_*``; ``rollout_dropout: grpodropout`` turns it on);
- ``stage.py``: the ``rollout_dropout`` stage over the pure selection and recentering of
  trainer/algorithms/dropout.py, and its config checks;
- its docs page, docs/grpodropout.md, and its recipes, configs/grpodropout/ (their claims are checked by
  tests/methods/test_grpodropout_fidelity.py and the recipe tests).
"""
