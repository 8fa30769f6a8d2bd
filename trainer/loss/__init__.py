"""The loss seam: what one micro-batch's loss is computed from, and the loss itself.

``WinnowGRPOTrainer._compute_loss`` is the one place winnow computes a loss. It builds a :class:`LossCall` -- the
row scale of a batch that stages thinned, the entropy bonus's weighting, and a recorder for TRL's logged loss
metrics -- and hands it, with the micro-batch, to the configured ``loss_variant``. Nothing about the loss is passed
by changing an attribute of the trainer, TRL or accelerate: every difference from TRL's loss is an argument here.

- :mod:`trainer.loss.call`: :class:`LossCall` and :class:`LossRecorder` (local statistics, reduced once per call
  or, over token-budget chunks, once per micro-step).
- :mod:`trainer.loss.trl_loss`: TRL 1.16's ``_compute_loss`` written with those arguments explicit.
"""
