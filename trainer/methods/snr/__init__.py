"""RAGEN-2's SNR-aware filtering (keep the prompt groups whose rewards vary informatively), all in this folder:

- ``fields.py``: its knobs, a mixin of ``WinnowConfig`` (``snr_*``; ``rollout_filter: snr`` turns it on);
- ``stage.py``: the ``rollout_filter`` stage over the pure scoring and selection of trainer/algorithms/snr_filter.py,
  its inputs and its config checks;
- its docs page, docs/ragen.md, and its recipes, configs/ragen/.
"""
