"""RAGEN's reward-variance collapse early stop and its evaluation before training, all in this folder:

- ``fields.py``: their knobs, a mixin of ``WinnowConfig`` (``reward_variance_stop_*``, ``val_before_train``);
- ``hook.py``: the two hooks (the stop and the evaluation before the first update) and their config checks
 ;
- their docs page, docs/ragen.md, and the RAGEN recipes, configs/ragen/.
"""
