"""Safety guards around a training step: skipping steps with nothing to train on (``empty_steps``),
non-finite losses and gradients (``numerics``), reward functions that raise (``rewards``), atomic checkpoints
and launch checks that need the environment (``startup_checks``).
"""
