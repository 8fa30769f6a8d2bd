"""Every built-in method, registered by importing it: trainer.pipeline.stages imports this module on the first
registry lookup (``available`` / ``get_stage`` / ``configured_hooks``), so config validation and the trainer see them.
Hooks are built in the order registered here. (Not done in ``trainer/methods/__init__.py``: a method's config fields,
``trainer/methods/<method>/fields.py``, are imported by the config, which every method imports.)
"""

from trainer.methods import (
    collapse_detector,  # noqa: F401  (registers hook: collapse)
    cov_losses,  # noqa: F401  (registers loss_variant: clip_cov, kl_cov)
    dynamic_sampling,  # noqa: F401  (registers hook: dynamic_sampling)
    low_success_stop,  # noqa: F401  (registers hook: low_success_stop)
    reward_variance_stop,  # noqa: F401  (registers hooks: reward_variance_stop, val_before_train)
    teacher_baselines,  # noqa: F401  (registers advantage: pg_opd, distilled_rl, atod; loss_variant: naive_hybrid)
    teacher_hook,  # noqa: F401  (registers hook: teacher)
    uecr,  # noqa: F401  (registers advantage: puu, uecr)
)
from trainer.methods.grpodropout import stage as grpodropout_stage  # noqa: F401  (registers rollout_dropout)
from trainer.methods.snr import stage as snr_stage  # noqa: F401  (registers rollout_filter: snr)
