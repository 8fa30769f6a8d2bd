"""Method stages: thin adapters from a RolloutBatch to the pure functions in trainer/algorithms/.

Importing this package registers every method stage; trainer.pipeline.stages imports it on the first registry lookup
(``available`` / ``get_stage``), so config validation sees them.
"""

from trainer.methods import (
    cov_losses,  # noqa: F401  (registers loss_variant: clip_cov, kl_cov)
    grpodropout,  # noqa: F401  (registers rollout_dropout: grpodropout)
    snr,  # noqa: F401  (registers rollout_filter: snr)
    teacher_baselines,  # noqa: F401  (registers advantage: pg_opd, distilled_rl, atod; loss_variant: naive_hybrid)
    uecr,  # noqa: F401  (registers advantage: puu, uecr)
)
