"""RAGEN-2's template-collapse probe (mutual information between reasoning traces and prompts), all in this folder:

- ``fields.py``: its knobs, a mixin of ``WinnowConfig`` (``collapse_*``; ``collapse_detection: true`` turns it on);
- ``hook.py``: the hook that samples traces, cross-scores them under the batch's prompts with the current policy and
  logs ``collapse/*`` over the pure metrics of trainer/algorithms/collapse_metrics.py, and its config checks
 ;
- ``reasoning_span.py``: which token ids of a reply are its reasoning (the ``<think>`` span);
- its docs page, docs/ragen.md, and its recipes, configs/ragen/.
"""
