"""UECR-GRPO (a frozen teacher's group utility, PUU, and its entropy-based token credit, ECR) and the
teacher-assisted baselines of its paper, all in this folder:

- ``fields.py``: the teacher's and the methods' knobs, a mixin of ``WinnowConfig`` (``teacher_*``, ``uecr_*``,
  ``opd_coef``, ``distilled_rl_kappa``, ``atod_*``), and their checks;
- ``teacher.py``: loading the frozen teacher and scoring completions under it (chunked float32 head; ZeRO-3 aware);
- ``hook.py``: the ``teacher`` hook that scores each generation batch for the stages that read it;
- ``inputs.py``: the teacher's inputs as the stages read them (the ``needs`` set, the per-token gap delta);
- ``stage.py``: the ``advantage`` stages ``puu`` and ``uecr`` over trainer/algorithms/uecr.py;
- ``baselines.py``: the ``advantage`` stages ``pg_opd``, ``distilled_rl``, ``atod`` and the ``loss_variant``
  ``naive_hybrid``;
- its docs page, docs/uecr.md, and its recipes, configs/uecr/.
"""
