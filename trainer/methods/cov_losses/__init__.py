"""Clip-Cov and KL-Cov (Cui et al. 2025 §4.2), the covariance-based entropy baselines, all in this folder:

- ``fields.py``: their knobs, a mixin of ``WinnowConfig`` (``clip_cov_*``, ``kl_cov_*``);
- ``loss.py``: the ``loss_variant`` entries ``clip_cov`` and ``kl_cov`` over trainer/algorithms/losses.py, and their
  config checks;
- their docs page, docs/baselines.md, and the recipes configs/grpodropout/table1/*-clip_cov.yaml / *-kl_cov.yaml.
"""
