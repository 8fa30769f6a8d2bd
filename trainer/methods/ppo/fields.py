"""PPO's critic knobs: a mixin of ``WinnowConfig`` (its fields appear there and in ``--help`` like all others).

Defaults are RAGEN-2's and verl's: mll-lab-nu/RAGEN@0321471 config/base.yaml (``critic.optim.lr: 1e-5``,
``algorithm.gamma: 1.0``, ``algorithm.lam: 1.0``, the critic's ``model.path: ${model_path}``);
volcengine/verl@03d67c6 verl/trainer/config/critic/critic.yaml (``weight_decay: 0.01``, ``cliprange_value: 0.5``,
the critic's ``loss_agg_mode`` = the actor's) and the critic's ``grad_clip: 1.0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PPOFields:
    """PPO with a learned critic (``advantage: gae``; docs/ppo.md)."""

    critic_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Checkpoint the value model starts from (a scalar head on it, initialised fresh). Default: the "
            "policy's checkpoint, as RAGEN-2 initialises its critic from model_path."
        },
    )
    critic_learning_rate: float = field(
        default=1e-5,
        metadata={"help": "The critic's AdamW learning rate (RAGEN-2 / verl critic.optim.lr: 1e-5), constant."},
    )
    critic_weight_decay: float = field(
        default=0.01,
        metadata={"help": "The critic's AdamW weight decay (verl critic.optim.weight_decay: 0.01)."},
    )
    critic_max_grad_norm: float = field(
        default=1.0,
        metadata={"help": "Clip the critic's gradient to this global L2 norm before its step (verl critic.grad_clip: "
                  "1.0); 0 turns clipping off."},
    )
    cliprange_value: float = field(
        default=0.5,
        metadata={"help": "Value clipping: the new value may move at most this far from the old one in the loss "
                  "(verl critic.cliprange_value: 0.5)."},
    )
    vf_coef: float = field(
        default=1.0,
        metadata={"help": "Coefficient of the value loss. The critic has its own optimizer, so this scales only its "
                  "gradient (before clipping); 1.0 is verl's separate critic (no coefficient)."},
    )
    gae_gamma: float = field(
        default=1.0,
        metadata={"help": "GAE discount gamma over tokens (RAGEN-2 algorithm.gamma: 1.0)."},
    )
    gae_lambda: float = field(
        default=1.0,
        metadata={"help": "GAE lambda (RAGEN-2 algorithm.lam: 1.0): 1 gives returns-to-go minus the value."},
    )
