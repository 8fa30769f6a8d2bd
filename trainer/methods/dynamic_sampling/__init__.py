"""DAPO's dynamic sampling (Yu et al. 2025 §3.2: keep only prompt groups whose reward varies, refill the batch by
generating more), all in this folder:

- ``fields.py``: its knobs, a mixin of ``WinnowConfig`` (``dynamic_sampling`` turns it on);
- ``hook.py``: the hook that refills the generation batch before the stage pipeline runs, and its config checks
 ;
- its docs page, docs/baselines.md, and the DAPO recipes (configs/grpodropout/table1/*-dapo.yaml).
"""
