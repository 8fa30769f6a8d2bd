"""RAGEN's low-validation-success early stop, all in this folder:

- ``fields.py``: its knobs, a mixin of ``WinnowConfig`` (``low_success_stop_steps`` > 0 turns it on);
- ``hook.py``: the hook and its callback that count failed evaluations and stop the run, and its config checks
 ;
- its docs page, docs/ragen-fidelity.md, and the RAGEN recipes, configs/ragen/.
"""
