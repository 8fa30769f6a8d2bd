"""Issue 19 item 1: every stage runs on an accelerator without mixing devices, checked on the CPU.

The stages run on tensors of tests/fake_accelerator.py (real values, reported on another device): any tensor a stage
creates on the CPU and combines with the batch's -- the ``torch.quantile`` q of trainer/methods/uecr/stage.py was
one -- fails here as it would on CUDA. Each result must also stay on the accelerator and equal the plain CPU run.
"""

from __future__ import annotations

import pytest
import torch
from fake_accelerator import ACCELERATOR, AcceleratorTensor, DeviceMixError, fake_accelerator, on_accelerator, to_cpu
from harness import BASE_ARGS

from trainer import RolloutBatch, WinnowConfig
from trainer.algorithms import losses
from trainer.algorithms.dapo import mixed_groups
from trainer.algorithms.snr_filter import SCORE_METRICS, STRATEGIES
from trainer.pipeline import stages

N, G, T = 16, 4, 7
TEACHER = dict(teacher_model_name_or_path="unused")


def _variants() -> list[dict]:
    """One config per registered filter / dropout / advantage stage, plus the options that take other code paths."""
    out = [dict(rollout_filter="snr", snr_metric=m) for m in SCORE_METRICS]
    out += [dict(rollout_filter="snr", snr_strategy=s, snr_value=0.5, snr_loss_scaling="sqrt") for s in STRATEGIES]
    out += [dict(rollout_filter="snr", snr_top_p_mode="softmax", snr_include_zero=True)]
    out += [dict(rollout_dropout="grpodropout", dropout_selector=s, dropout_recenter=r, dropout_delete=d)
            for s in ("paper", "balanced_push") for r in ("prob_weighted", "mean") for d in ("positive", "both")
            if s == "paper" or d == "positive"]  # balanced_push keeps by its own rule: dropout_delete is refused there
    out += [dict(rollout_dropout="grpodropout", dropout_surprisal_basis="sum")]
    out += [dict(rollout_dropout="grpodropout", dropout_selector=s, dropout_zero_push_groups="random_min_keep",
                 dropout_restandardize=True) for s in ("balanced_push", "balanced_push_neg")]  # the authors' variants
    out += [dict(advantage="grpo", scale_rewards=s) for s in ("group", "batch", "none")]
    out += [dict(advantage="grpo", multi_objective_aggregation="normalize_then_sum")]
    out += [dict(advantage=a, **TEACHER) for a in ("puu", "uecr", "pg_opd", "distilled_rl", "atod")]
    out += [dict(advantage="uecr", uecr_normalization="separate", uecr_direction="clip", uecr_confidence="inverse",
                 uecr_projection_norm="max", uecr_weight_full_advantage=True, **TEACHER)]
    out += [
        dict(advantage="uecr", uecr_use_entropy=False, uecr_use_projection=False, uecr_signed_gap=False, **TEACHER)
    ]
    out += [dict(advantage="gae"), dict(advantage="gae", gae_gamma=0.9, gae_lambda=0.95)]  # PPO's critic advantage
    return out


VARIANTS = _variants()


def test_variants_cover_every_registered_stage():
    """A newly registered filter / dropout / advantage stage must be added to the device check."""
    for kind in ("rollout_filter", "rollout_dropout", "advantage"):
        covered = {v.get(kind, "none" if kind != "advantage" else "grpo") for v in VARIANTS}
        assert covered >= set(stages.available(kind)) - {n for n in stages.available(kind) if n.startswith("test_")}, (
            kind
        )


def _batch(device_fn) -> RolloutBatch:
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(N, T)
    mask[1, 3:] = 0
    mask[6, 1:] = 0
    mask[9] = 0  # a rollout with no loss token
    R_k = torch.stack([torch.randint(0, 2, (N,), generator=g).float(), torch.rand(N, generator=g)], dim=1)
    R_k[4:8, 0] = 1.0  # a group with constant accuracy
    tensors = dict(
        R_k=R_k, reward_weights=torch.tensor([1.0, 0.5]), completion_ids=torch.randint(0, 50, (N, T), generator=g),
        mask=mask, old_logps=-torch.rand(N, T, generator=g) * 2, entropies=torch.rand(N, T, generator=g) * 3,
    )
    extras = dict(teacher_logps=-torch.rand(N, T, generator=g) * 2, teacher_entropy=torch.rand(N, T, generator=g) * 3,
                  old_logps_t1=-torch.rand(N, T, generator=g) * 2, old_values=torch.randn(N, T, generator=g) * 0.5)
    return RolloutBatch(reward_names=["acc", "len"], G=G, **{k: device_fn(v) for k, v in tensors.items()},
                        extras={**{k: device_fn(v) for k, v in extras.items()}, "global_step": 3, "max_steps": 10})


@pytest.mark.parametrize(
    "overrides", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v if k != "teacher_model_name_or_path")
)
def test_stage_runs_on_the_accelerator(tmp_path, overrides):
    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "advantage_eps": 1e-6, **overrides})
    want = stages.run_pipeline(_batch(lambda t: t), args)
    with fake_accelerator() as mode:
        got = stages.run_pipeline(_batch(on_accelerator), args)
    assert mode.ops > 0
    for name in ("keep", "advantages"):
        value = getattr(got, name)
        assert isinstance(value, AcceleratorTensor) and value.device == ACCELERATOR, f"{name} left the accelerator"
        torch.testing.assert_close(to_cpu(value), getattr(want, name), rtol=1e-6, atol=1e-9)
    assert got.metrics.keys() == want.metrics.keys()


def test_the_check_catches_a_cpu_tensor_meeting_an_accelerator_one():
    """The harness itself: the old uecr quantile call, and a plain mix, both fail; device-correct code passes."""
    x = on_accelerator(torch.randn(10, dtype=torch.float64))
    with fake_accelerator():
        with pytest.raises(RuntimeError, match="same device"):
            torch.quantile(x, torch.tensor([0.1, 0.5], dtype=x.dtype))
        with pytest.raises(DeviceMixError):
            torch.where(x > 0, x, torch.zeros(10, dtype=x.dtype))
        q = torch.quantile(x, torch.tensor([0.1, 0.5], dtype=x.dtype, device=x.device))
        scalar = torch.where(x > 0, x, torch.tensor(0.0, dtype=x.dtype))  # a 0-dim CPU tensor is a scalar on CUDA too
    assert isinstance(q, AcceleratorTensor) and isinstance(scalar, AcceleratorTensor)
    torch.testing.assert_close(to_cpu(q), torch.quantile(to_cpu(x), torch.tensor([0.1, 0.5], dtype=x.dtype)))


def test_loss_variant_token_choices_and_dynamic_sampling_on_the_accelerator():
    """The pure functions behind loss_variant clip_cov / kl_cov and DAPO's dynamic sampling."""
    g = torch.Generator().manual_seed(0)
    A, logp, mask = torch.randn(8, 6, generator=g), -torch.rand(8, 6, generator=g) * 3, torch.ones(8, 6)
    clipped = torch.zeros(8, 6, dtype=torch.bool)
    values = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    want_cov = losses.token_covariance(A, logp, mask)
    want_clip = losses.clip_cov_selection(want_cov, mask, clipped, 0.2, -10.0, 10.0, torch.Generator().manual_seed(1))
    want_kl = losses.kl_cov_selection(want_cov, mask, 0.2)
    with fake_accelerator():
        acc = [on_accelerator(t) for t in (A, logp, mask, clipped)]
        cov = losses.token_covariance(*acc[:3])
        clip = losses.clip_cov_selection(cov, acc[2], acc[3], 0.2, -10.0, 10.0, torch.Generator().manual_seed(1))
        kl = losses.kl_cov_selection(cov, acc[2], 0.2)
        mixed = mixed_groups(on_accelerator(values), 4)
    for got, want in ((cov, want_cov), (clip, want_clip), (kl, want_kl), (mixed, mixed_groups(values, 4))):
        assert isinstance(got, AcceleratorTensor)
        torch.testing.assert_close(to_cpu(got), want)
