"""The stage registry: duplicate names are refused (as in the reward, environment and dataset registries), and the
built-in method stages are there on the first lookup although the registry module imports none of them."""

from __future__ import annotations

import pytest

from trainer import StageResult
from trainer.pipeline import stages


@stages.register_stage("rollout_filter", "test_registry_first")
def _first(batch, args):
    return StageResult()


def test_duplicate_stage_name_is_refused_and_the_first_stays():
    with pytest.raises(ValueError, match=r"rollout_filter stage 'test_registry_first' is already registered by "
                                         r".*test_stage_registry\._first"):
        @stages.register_stage("rollout_filter", "test_registry_first")
        def _second(batch, args):
            return StageResult()

    assert stages.get_stage("rollout_filter", "test_registry_first").fn is _first


def test_a_user_stage_cannot_take_a_builtin_name():
    assert "snr" in stages.available("rollout_filter")  # the built-in methods are loaded by the lookup
    with pytest.raises(ValueError, match="already registered by trainer.methods.snr.stage"):
        stages.register_stage("rollout_filter", "snr")(lambda batch, args: StageResult())


def test_same_name_under_another_kind_is_fine():
    stages.register_stage("rollout_dropout", "test_registry_first")(lambda batch, args: StageResult())
    assert "test_registry_first" in stages.available("rollout_dropout")


def test_builtin_stages_are_found_without_importing_methods_first():
    for kind, name in (("rollout_dropout", "grpodropout"), ("advantage", "uecr"), ("loss_variant", "clip_cov")):
        assert stages.get_stage(kind, name).name == name
