"""The built-in methods, one line each. This list is the only place a built-in method is named outside its folder:
``WinnowConfig`` mixes in each method's fields in this order (trainer/config/core.py), and importing this module
imports the modules each line names, which register the method's stages, inputs, hooks and config checks (in import
order, which is the order hooks are built and called in). The first line is TRL's GRPO itself: the stages that are
on when no method is (trainer/pipeline/trl_stages.py).

A method of a user's (a folder outside the package) adds itself with :func:`add` and brings a config class that mixes
in its fields (``class MyConfig(MyFields, WinnowConfig)``); docs/design.md, "Adding a method".
"""

from __future__ import annotations

# First: TRL's own stages and the per-row inputs (old policy, teacher) that methods' stages name in `needs`.
from trainer.pipeline import stages, trl_stages

# isort: split
from trainer.methods.collapse import hook as collapse_hook
from trainer.methods.collapse.fields import CollapseFields
from trainer.methods.cov_losses import loss as cov_losses_loss
from trainer.methods.cov_losses.fields import CovLossFields
from trainer.methods.dynamic_sampling import hook as dynamic_sampling_hook
from trainer.methods.dynamic_sampling.fields import DynamicSamplingFields
from trainer.methods.grpodropout import stage as grpodropout_stage
from trainer.methods.grpodropout.fields import GRPODropoutFields
from trainer.methods.low_success_stop import hook as low_success_stop_hook
from trainer.methods.low_success_stop.fields import LowSuccessStopFields
from trainer.methods.method import Method
from trainer.methods.ppo import hook as ppo_hook
from trainer.methods.ppo import stage as ppo_stage
from trainer.methods.ppo.fields import PPOFields
from trainer.methods.reward_variance_stop import hook as reward_variance_stop_hook
from trainer.methods.reward_variance_stop.fields import RewardVarianceStopFields
from trainer.methods.snr import stage as snr_stage
from trainer.methods.snr.fields import SNRFilterFields
from trainer.methods.uecr import baselines as uecr_baselines
from trainer.methods.uecr import hook as uecr_hook
from trainer.methods.uecr import stage as uecr_stage
from trainer.methods.uecr.fields import TeacherFields

BUILTIN: tuple[Method, ...] = (
    Method("trl", fields=None, registers=(trl_stages,)),  # TRL's GRPO: the stages on when no method is
    Method("collapse", fields=CollapseFields, registers=(collapse_hook,)),
    Method("cov_losses", fields=CovLossFields, registers=(cov_losses_loss,)),
    Method("dynamic_sampling", fields=DynamicSamplingFields, registers=(dynamic_sampling_hook,)),
    Method("grpodropout", fields=GRPODropoutFields, registers=(grpodropout_stage,)),
    Method("low_success_stop", fields=LowSuccessStopFields, registers=(low_success_stop_hook,)),
    Method("ppo", fields=PPOFields, registers=(ppo_hook, ppo_stage)),
    Method("reward_variance_stop", fields=RewardVarianceStopFields, registers=(reward_variance_stop_hook,)),
    Method("snr", fields=SNRFilterFields, registers=(snr_stage,)),
    Method("uecr", fields=TeacherFields, registers=(uecr_baselines, uecr_hook, uecr_stage)),
)
stages.check_needs()  # every built-in stage's inputs are registered now

_ADDED: list[Method] = []


def add(method: Method) -> Method:
    """Add a user's method (its parts already imported, so its stages and hooks are registered); a name already in
    the catalog, or a stage that needs an input nobody registered, is an error."""
    if any(m.name == method.name for m in methods()):
        raise ValueError(f"a method named {method.name!r} is already in the catalog")
    stages.check_needs()
    _ADDED.append(method)
    return method


def methods() -> tuple[Method, ...]:
    """Every method: the built-in ones, then the users' in the order added."""
    return BUILTIN + tuple(_ADDED)


def field_mixins() -> tuple[type, ...]:
    """The built-in methods' config mixins, in catalog order (``WinnowConfig``'s bases)."""
    return tuple(m.fields for m in BUILTIN if m.fields is not None)


def missing_fields(args: object) -> list[Method]:
    """The methods whose fields ``args``'s class does not mix in (a user's method used with plain WinnowConfig)."""
    return [m for m in methods() if m.fields is not None and not isinstance(args, m.fields)]
