"""Every built-in method, registered by importing it: trainer.pipeline.stages imports this module on the first
registry lookup (``available`` / ``get_stage`` / ``configured_hooks``), so config validation and the trainer see them.
Hooks are built in the order registered here. (Not done in ``trainer/methods/__init__.py``: a method's config fields,
``trainer/methods/<method>/fields.py``, are imported by the config, which every method imports.)
"""

from trainer.methods.collapse import hook as collapse_hook  # noqa: F401  (registers hook: collapse)
from trainer.methods.cov_losses import loss as cov_losses  # noqa: F401  (registers loss_variant: clip_cov, kl_cov)
from trainer.methods.dynamic_sampling import hook as dynamic_sampling_hook  # noqa: F401  (hook: dynamic_sampling)
from trainer.methods.grpodropout import stage as grpodropout_stage  # noqa: F401  (registers rollout_dropout)
from trainer.methods.low_success_stop import hook as low_success_stop_hook  # noqa: F401  (hook: low_success_stop)
from trainer.methods.ppo import hook as ppo_hook  # noqa: F401  (registers hook: ppo_critic)
from trainer.methods.ppo import stage as ppo_stage  # noqa: F401  (registers advantage: gae, input: old_values)
from trainer.methods.reward_variance_stop import hook as reward_variance_stop_hook  # noqa: F401  (hooks:

# reward_variance_stop, val_before_train)
from trainer.methods.snr import stage as snr_stage  # noqa: F401  (registers rollout_filter: snr)
from trainer.methods.uecr import baselines as uecr_baselines  # noqa: F401  (advantage: pg_opd, distilled_rl, atod;

# loss_variant: naive_hybrid)
from trainer.methods.uecr import hook as teacher_hook  # noqa: F401  (registers hook: teacher)
from trainer.methods.uecr import stage as uecr_stage  # noqa: F401  (registers advantage: puu, uecr)
