"""UECR-GRPO's pure functions (PUU, ECR) and the teacher baselines (PG-OPD, Distilled RL, ATOD).

The paper's F.9 regression tests at the pure level -- rho = 0 reproduces PUU exactly (C3), the projection
invariants C1/C2 hold on every mask pattern -- as hypothesis properties over random batches (G 1..8, empty
and single-token rows, scattered masks, |delta| up to 50, teacher entropy 0..12, garbage/NaN at padding,
float32 and float64), plus hand-computed cases for the Table 1 sign table, each F.7 ablation switch, the
decomposition, the audits and the reconstructed baselines (reference doc §1.3-§1.5, §2.6-§2.9).

Stated tolerances: C1 |sum_t m q| <= 1e-12 (float64 outputs) / 1e-6 (float32); decomposition error 0 for float64
(A_U is computed as the sum of its parts); token mean of A_hat vs A_U <= 1e-9 (float64) / 1e-5 (float32),
relative to max(1, |A_task_U|, |A_T_U|).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.algorithms.grpo import grpo_advantages
from trainer.algorithms.uecr import (
    CONFIDENCES,
    DIRECTIONS,
    PROJECTION_NORMS,
    alpha_safety,
    atod_advantages,
    atod_lambda,
    audit_metrics,
    distilled_rl_advantages,
    ecr_terms,
    ecr_weights,
    pg_opd_advantages,
    puu,
    separate_normalization,
    teacher_score,
    token_gap,
    uecr_advantages,
)

PROPS = settings(max_examples=120, deadline=None)
NAN = math.nan
F64 = torch.float64


@st.composite
def batches(draw, dtype=None):
    """A random rollout batch: P groups of G rows, T tokens; per-row lengths biased to 0 and 1, prefix or
    scattered masks; deltas at several scales with injected +-50; entropies in [0, scale], scale in {0, .5, 12};
    {0, 1} task rewards; NaN / -inf in the log-probs and entropies at padding (must never be read)."""
    P, G, T = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(st.integers(1, 10))
    N = P * G
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    lengths = draw(st.lists(st.one_of(st.just(0), st.just(1), st.integers(0, T)), min_size=N, max_size=N))
    scattered = draw(st.booleans())
    mask = torch.zeros(N, T, dtype=torch.bool)
    for i, L in enumerate(lengths):
        mask[i, torch.randperm(T, generator=gen)[:L] if scattered else torch.arange(L)] = True
    scale = draw(st.sampled_from([1e-3, 1.0, 5.0, 50.0]))
    delta = (torch.rand(N, T, generator=gen, dtype=F64) * 2 - 1) * scale
    extreme = torch.rand(N, T, generator=gen) < draw(st.sampled_from([0.0, 0.2, 1.0]))
    delta = torch.where(extreme, torch.where(torch.rand(N, T, generator=gen) < 0.5, -50.0, 50.0).double(), delta)
    old = -torch.rand(N, T, generator=gen, dtype=F64) * 10
    H = torch.rand(N, T, generator=gen, dtype=F64) * draw(st.sampled_from([0.0, 0.5, 12.0]))
    R_task = (torch.rand(P, G, generator=gen) < draw(st.sampled_from([0.0, 0.5, 1.0]))).double()
    dtype = dtype or draw(st.sampled_from([torch.float32, F64]))
    float_mask = draw(st.booleans())
    return SimpleNamespace(
        P=P,
        G=G,
        dtype=dtype,
        mask=mask.to(dtype) if float_mask else mask,
        valid=mask,
        teacher_logps=(old + delta).masked_fill(~mask, NAN).to(dtype),
        old_logps=old.masked_fill(~mask, -math.inf).to(dtype),
        H=H.masked_fill(~mask, NAN).to(dtype),
        R_task=R_task.to(dtype),
    )


ecr_options = st.fixed_dictionaries(
    {
        "rho": st.sampled_from([0.0, 0.25, 0.5, 0.9, 0.999]),
        "tau_delta": st.sampled_from([0.1, 1.0, 3.0]),
        "tau_H": st.sampled_from([0.5, 2.0, 10.0]),
        "use_entropy": st.booleans(),
        "use_projection": st.booleans(),
        "signed_gap": st.booleans(),
        "direction": st.sampled_from(DIRECTIONS),
        "confidence": st.sampled_from(CONFIDENCES),
        "projection_norm": st.sampled_from(PROJECTION_NORMS),
    }
)


def pipeline(b, alpha=1.0, weight_full=False, **opts):
    """The trainer's order: delta -> R^T -> PUU -> ECR -> A_hat, everything flattened to rows."""
    delta = token_gap(b.teacher_logps, b.old_logps, b.mask)
    R_T = teacher_score(delta, b.mask)
    parts = puu(b.R_task, R_T.view(b.P, b.G), alpha=alpha)
    flat = {k: v.reshape(-1) for k, v in parts.items()}
    terms = ecr_terms(delta, b.H, b.mask, flat["A_task_U"], **opts)
    A = uecr_advantages(flat["A_task_U"], flat["A_T_U"], terms["w"], b.mask, alpha=alpha, weight_full=weight_full)
    return SimpleNamespace(delta=delta, R_T=R_T, A=A, **flat, **terms)


def amax(x):
    """max |x| as a float, 0 for an empty tensor."""
    return float(x.abs().max()) if x.numel() else 0.0


def row_sums(x, valid):
    return torch.where(valid, x.double(), 0.0).sum(dim=1)


# ----------------------------------------------------------------------------- token gap and teacher score


def test_token_gap_and_teacher_score_hand_computed():
    teacher = torch.tensor([[-1.0, -2.0, NAN], [NAN, NAN, NAN], [-0.25, -8.0, -3.0]])
    old = torch.tensor([[-1.5, -1.0, -math.inf], [-1.0, -1.0, -1.0], [-0.5, -4.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 0]])
    delta = token_gap(teacher, old, mask)
    assert delta.dtype == torch.float32
    assert torch.equal(delta, torch.tensor([[0.5, -1.0, 0.0], [0.0, 0.0, 0.0], [0.0, -4.0, 0.0]]))
    # masked token means: (0.5 - 1) / 2, empty row -> 0 (not NaN), single token -4
    assert torch.equal(teacher_score(delta, mask), torch.tensor([-0.25, 0.0, -4.0]))


@PROPS
@given(batches())
def test_teacher_score_is_masked_mean_and_never_nan(b):
    delta = token_gap(b.teacher_logps, b.old_logps, b.mask)
    R_T = teacher_score(delta, b.mask)
    assert delta.dtype == R_T.dtype == b.dtype
    assert torch.isfinite(delta).all() and torch.isfinite(R_T).all()
    assert (delta[~b.valid] == 0).all()
    L = b.valid.sum(dim=1)
    assert (R_T[L == 0] == 0).all()
    expected = row_sums(delta, b.valid) / L.clamp(min=1)
    torch.testing.assert_close(R_T.double(), expected, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------------------ PUU


def test_puu_hand_computed():
    # R_U = [1.2, -0.1, 0.0, 1.3], mean 0.6, deviations [0.6, -0.7, -0.6, 0.7], population variance
    # (0.36 + 0.49 + 0.36 + 0.49) / 4 = 0.425; task deviations +-0.5, teacher deviations (mean 0.1)
    # [0.1, -0.2, -0.1, 0.2], all over sqrt(0.425) + 1e-6.
    task = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=F64)
    scores = torch.tensor([[0.2, -0.1, 0.0, 0.3]], dtype=F64)
    out = puu(task, scores)
    den = math.sqrt(0.425) + 1e-6
    exp = {
        "R_U": [1.2, -0.1, 0.0, 1.3],
        "A_task_U": [0.5 / den, -0.5 / den, -0.5 / den, 0.5 / den],
        "A_T_U": [0.1 / den, -0.2 / den, -0.1 / den, 0.2 / den],
        "A_U": [0.6 / den, -0.7 / den, -0.6 / den, 0.7 / den],
    }
    for k, v in exp.items():
        assert out[k].dtype == F64 and out[k].shape == (1, 4)
        torch.testing.assert_close(out[k], torch.tensor([v], dtype=F64), rtol=1e-12, atol=1e-12)
    # alpha = 2 doubles the teacher part inside R_U (and hence in sigma_U)
    out2 = puu(task, scores, alpha=2.0)
    R_U2 = torch.tensor([1.4, -0.2, 0.0, 1.6], dtype=F64)
    den2 = (R_U2 - R_U2.mean()).pow(2).mean().sqrt() + 1e-6
    torch.testing.assert_close(out2["A_U"][0], (R_U2 - R_U2.mean()) / den2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out2["A_T_U"][0], torch.tensor([0.1, -0.2, -0.1, 0.2], dtype=F64) / den2)


def test_separate_normalization_hand_computed():
    # task: deviations +-0.5 over its own std 0.5; teacher: deviations [0.1, -0.2, -0.1, 0.2] over its own
    # population std sqrt((0.01 + 0.04 + 0.01 + 0.04) / 4) = sqrt(0.025).
    task = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=F64)
    scores = torch.tensor([[0.2, -0.1, 0.0, 0.3]], dtype=F64)
    out = separate_normalization(task, scores, alpha=1.0)
    a = torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=F64) / (0.5 + 1e-6)
    b = torch.tensor([0.1, -0.2, -0.1, 0.2], dtype=F64) / (math.sqrt(0.025) + 1e-6)
    torch.testing.assert_close(out["A_task_U"][0], a, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out["A_T_U"][0], b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out["A_U"][0], a + b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out["R_U"][0], torch.tensor([1.2, -0.1, 0.0, 1.3], dtype=F64))
    # it differs from the joint normalisation (the point of the ablation)
    assert not torch.allclose(out["A_U"], puu(task, scores)["A_U"])
    out3 = separate_normalization(task, scores, alpha=3.0)
    torch.testing.assert_close(out3["A_U"][0], a + 3 * b, rtol=1e-12, atol=1e-12)


@PROPS
@given(batches(), st.sampled_from([0.0, 0.5, 1.0, 3.0]))
def test_puu_decomposition_and_normalisation(b, alpha):
    R_T = teacher_score(token_gap(b.teacher_logps, b.old_logps, b.mask), b.mask).view(b.P, b.G)
    for combine in (puu, separate_normalization):
        out = combine(b.R_task, R_T, alpha=alpha)
        assert all(v.shape == (b.P, b.G) and v.dtype == b.dtype and torch.isfinite(v).all() for v in out.values())
        err = (out["A_U"].double() - (out["A_task_U"].double() + alpha * out["A_T_U"].double())).abs().max()
        assert err <= (1e-12 if b.dtype == F64 else 1e-6 * max(1.0, float(out["A_U"].abs().max())))
        tied = (b.R_task == b.R_task[:, :1]).all(dim=1)
        assert (out["A_task_U"][tied] == 0).all()  # exactly 0: ECR's sign(0) = 0 relies on it
    out = puu(b.R_task.double(), R_T.double(), alpha=alpha)
    assert torch.equal(out["A_U"], out["A_task_U"] + alpha * out["A_T_U"])  # decomposition error exactly 0
    # A_U equals the direct formula (R_U - mu_U) / (sigma_U + eps), population std
    R_U = b.R_task.double() + alpha * R_T.double()
    dev = R_U - R_U.mean(dim=1, keepdim=True)
    direct = dev / (dev.pow(2).mean(dim=1, keepdim=True).sqrt() + 1e-6)
    scale = 1.0 + direct.abs().max()
    assert (out["A_U"] - direct).abs().max() <= 1e-9 * scale
    # alpha = 0 is task-only GRPO with population std and eps 1e-6 ("Task only" row of Table 3)
    task_only = puu(b.R_task.double(), R_T.double(), alpha=0.0)["A_U"].reshape(-1)
    ref, _ = grpo_advantages(b.R_task.double().reshape(-1), b.G, std="population", eps=1e-6)
    torch.testing.assert_close(task_only, ref, rtol=1e-12, atol=1e-12)


def test_puu_single_rollout_groups_and_ties_give_zero():
    out = puu(torch.tensor([[1.0], [0.0]]), torch.tensor([[0.3], [-2.0]]))
    assert all(torch.equal(out[k], torch.zeros(2, 1)) for k in ("A_U", "A_task_U", "A_T_U"))
    # 0.1 * 3 / 3 != 0.1: the naive mean of equal values is off by an ulp; equal values still give 0
    out = puu(torch.tensor([[0.1, 0.1, 0.1]], dtype=F64), torch.tensor([[0.7, 0.7, 0.7]], dtype=F64))
    assert torch.equal(out["A_U"], torch.zeros(1, 3, dtype=F64))


# ------------------------------------------------------------------------------------------------------ ECR


@settings(max_examples=200, deadline=None)
@given(batches(), ecr_options, st.sampled_from([0.0, 1.0, 2.0]), st.booleans())
def test_ecr_invariants_on_every_mask_pattern(b, opts, alpha, weight_full):
    """F.9 test 2: C1 zero-sum, C2 |q| <= c <= 1, w > 0 for rho < 1, padding/empty rows, no NaN, mean_t w = 1,
    mean_t A_hat = A_U; verifier-tied rows keep w = 1."""
    out = pipeline(b, alpha=alpha, weight_full=weight_full, **opts)
    valid, nonempty = b.valid, b.valid.any(dim=1)
    for name in ("d", "c", "q", "w", "mu_c", "A"):
        t = getattr(out, name)
        assert t.dtype == b.dtype and torch.isfinite(t).all(), name
    # C1: sum_t m q = 0 per non-empty row, so mean_t w = 1 (the task-credit budget) -- unless ablation 3
    # (use_projection=False) removed the zero-sum constraint
    projected = opts["use_projection"]
    tol = 1e-12 if b.dtype == F64 else 1e-6
    L = valid.sum(dim=1).clamp(min=1)
    if projected:
        assert amax(row_sums(out.q, valid)) <= tol
        assert amax((row_sums(out.w, valid) / L - 1)[nonempty]) <= tol
    # C2
    assert (out.q.abs() <= 1).all() and (out.c <= 1).all() and (out.c >= 0).all() and (out.d.abs() <= 1).all()
    if opts["projection_norm"] == "one_plus_mean":  # |q| <= c: the strength never exceeds the confidence
        assert (out.q.abs() <= out.c).all()
    else:  # max normaliser: |q| <= |c (d - mu_c)| <= 2c
        assert (out.q.abs() <= 2 * out.c).all()
    assert (out.w > 0).all()
    # padding and empty rows
    assert (out.q[~valid] == 0).all() and (out.w[~valid] == 1).all() and (out.A[~valid] == 0).all()
    assert (out.c[~valid] == 0).all() and (out.d[~valid] == 0).all()
    assert (out.mu_c[~nonempty] == 0).all() and (out.R_T[~nonempty] == 0).all()
    # sign(0) = 0: a verifier-tied group gets q = 0, w = 1
    tied = (out.A_task_U == 0).unsqueeze(1).expand_as(valid)
    assert (out.q[tied] == 0).all() and (out.w[tied] == 1).all()
    # token mean of A_hat over valid tokens is A_U (w's mean is 1 and the teacher part is constant per row)
    if projected:
        mean_A = row_sums(out.A, valid) / L
        scale = torch.stack([out.A_task_U.abs(), out.A_T_U.abs(), out.A_U.abs()]).double().amax(0).clamp(min=1)
        rel = ((mean_A - out.A_U.double()).abs() / scale)[nonempty]
        assert amax(rel) <= (1e-9 if b.dtype == F64 else 1e-5)
    # the ECR weights equal the terms' w
    assert torch.equal(ecr_weights(out.delta, b.H, b.mask, out.A_task_U, **opts), out.w)


@PROPS
@given(batches(), ecr_options, st.sampled_from([0.0, 1.0, 2.5]), st.booleans())
def test_rho_zero_reproduces_puu_exactly(b, opts, alpha, weight_full):
    """F.9 test 1 / C3: rho = 0 gives w = 1 and A_hat = A_U broadcast, bit for bit (so loss and gradient match)."""
    out = pipeline(b, alpha=alpha, weight_full=weight_full, **{**opts, "rho": 0.0})
    assert torch.equal(out.w, torch.ones_like(out.w))
    expected = torch.where(b.valid, out.A_U.unsqueeze(1).expand_as(out.A), torch.zeros((), dtype=b.dtype))
    assert torch.equal(out.A, expected)


def test_c4_large_entropy_recovers_broadcast_puu():
    delta = torch.tensor([[2.0, -1.0, 0.5, -3.0]], dtype=F64)
    mask = torch.ones(1, 4)
    A = torch.tensor([0.8], dtype=F64)
    qmax = []
    for H in (0.0, 2.0, 8.0, 20.0, 60.0):
        t = ecr_terms(delta, torch.full((1, 4), H, dtype=F64), mask, A)
        assert (t["q"].abs() <= t["c"]).all()
        qmax.append(float(t["q"].abs().max()))
    assert all(a > b for a, b in zip(qmax, qmax[1:])) and qmax[-1] < 1e-12
    # c underflows to ~1e-174 (exp) or is tiny (inverse): w = 1 and A_hat = A_U broadcast exactly
    for conf, H in (("exp", 800.0), ("inverse", 1e300)):
        t = ecr_terms(delta, torch.full((1, 4), H, dtype=F64), mask, A, confidence=conf)
        assert torch.equal(t["w"], torch.ones(1, 4, dtype=F64)), conf
        A_hat = uecr_advantages(A, torch.tensor([0.3], dtype=F64), t["w"], mask)
        assert torch.equal(A_hat, torch.full((1, 4), 0.8 + 0.3, dtype=F64))
    # one token with c -> 0 keeps w = 1 exactly; the others still redistribute among themselves
    t = ecr_terms(delta, torch.tensor([[0.0, 0.0, 1e4, 0.0]], dtype=F64), mask, A)
    assert t["w"][0, 2] == 1 and t["q"][0, [0, 1, 3]].abs().min() > 0
    assert abs(float(t["q"].sum())) < 1e-15


def test_c5_sign_table():
    """Table 1: the local direction d follows delta for successful responses and is reversed for failed ones;
    a failed response's teacher-preferred token gets less (but still negative) blame."""
    delta = torch.tensor([[1.0, -1.0], [1.0, -1.0], [1.0, -1.0]], dtype=F64)
    H = torch.zeros(3, 2, dtype=F64)  # c = 1
    mask = torch.ones(3, 2)
    A_task = torch.tensor([1.0, -1.0, 0.0], dtype=F64)
    t = ecr_terms(delta, H, mask, A_task, rho=0.5)
    th = math.tanh(1.0)
    assert torch.equal(t["d"], torch.tensor([[th, -th], [-th, th], [0.0, 0.0]], dtype=F64))
    assert torch.equal(t["mu_c"], torch.zeros(3, dtype=F64))
    w_exp = torch.tensor([[1 + th / 2, 1 - th / 2], [1 - th / 2, 1 + th / 2], [1, 1]], dtype=F64)
    torch.testing.assert_close(t["w"], w_exp)
    A_hat = uecr_advantages(A_task, torch.zeros(3, dtype=F64), t["w"], mask)
    assert 0 < A_hat[0, 1] < 1 < A_hat[0, 0]  # success: teacher-preferred token gets more credit
    assert -1 < A_hat[1, 0] < 0 and A_hat[1, 1] < -1  # failure: less blame, never a positive target
    assert torch.equal(A_hat[2], torch.zeros(2, dtype=F64))  # tied: nothing to redistribute

    # all tokens teacher-preferred: the projection is zero-sum, so some still fall below weight 1
    all_pos = torch.tensor([[0.5, 1.0, 2.0]], dtype=F64)
    t = ecr_terms(all_pos, torch.zeros(1, 3, dtype=F64), torch.ones(1, 3), A_task[:1])
    assert (t["d"] > 0).all() and t["mu_c"][0] > 0
    assert t["w"][0, 0] < 1 < t["w"][0, 2] and abs(float(t["q"].sum())) < 1e-15


def test_hand_computed_projection():
    # A > 0, delta = [1, -1, 3], H = [0, 2 ln 2, 0] (tau_H 2 -> c = [1, 1/2, 1]), tau_delta 1, rho 0.5
    delta = torch.tensor([[1.0, -1.0, 3.0]], dtype=F64)
    H = torch.tensor([[0.0, 2 * math.log(2), 0.0]], dtype=F64)
    t = ecr_terms(delta, H, torch.ones(1, 3), torch.tensor([2.0], dtype=F64))
    c = torch.tensor([1.0, 0.5, 1.0], dtype=F64)
    d = torch.tanh(torch.tensor([1.0, -1.0, 3.0], dtype=F64))
    mu = float((c * d).sum() / c.sum())
    q = c * (d - mu) / (1 + abs(mu))
    torch.testing.assert_close(t["c"][0], c, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(t["mu_c"][0], torch.tensor(mu, dtype=F64), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(t["q"][0], q, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(t["w"][0], 1 + 0.5 * q, rtol=1e-14, atol=1e-14)
    # max normaliser: |c (d - mu)| <= 1 + |mu| but here max |c (d - mu)| < 1 -> divide by 1
    tm = ecr_terms(delta, H, torch.ones(1, 3), torch.tensor([2.0], dtype=F64), projection_norm="max")
    torch.testing.assert_close(tm["q"][0], c * (d - mu), rtol=1e-14, atol=1e-14)
    # clip direction and inverse confidence
    tc = ecr_terms(delta, H, torch.ones(1, 3), torch.tensor([2.0], dtype=F64), direction="clip", confidence="inverse",
                   tau_delta=2.0)
    torch.testing.assert_close(tc["d"][0], torch.tensor([0.5, -0.5, 1.0], dtype=F64))
    torch.testing.assert_close(tc["c"][0], 1 / (1 + torch.tensor([0.0, math.log(2), 0.0], dtype=F64)))


def test_max_normaliser_bounds_q_when_mean_is_large():
    # c (d - mu) reaches beyond 1 when mu is opposite and large: [d] = [-1, 1, 1, 1, 1] with c = 1 -> mu = 0.6,
    # c (d - mu) = [-1.6, 0.4 ...]: divided by 1.6 -> q = [-1, 0.25, ...]
    delta = torch.tensor([[-60.0, 60.0, 60.0, 60.0, 60.0]], dtype=F64)
    t = ecr_terms(delta, torch.zeros(1, 5, dtype=F64), torch.ones(1, 5), torch.tensor([1.0], dtype=F64),
                  direction="clip", projection_norm="max")
    torch.testing.assert_close(t["q"][0], torch.tensor([-1.0, 0.25, 0.25, 0.25, 0.25], dtype=F64))


@PROPS
@given(batches(dtype=F64))
def test_c7_each_ablation_switch_changes_only_its_term(b):
    delta = token_gap(b.teacher_logps, b.old_logps, b.mask)
    A_task = puu(b.R_task, teacher_score(delta, b.mask).view(b.P, b.G))["A_task_U"].reshape(-1)
    base = ecr_terms(delta, b.H, b.mask, A_task)
    valid = b.valid
    s = torch.sign(A_task).unsqueeze(1).expand_as(delta)

    # (3) mu_c = 0: q is the raw proposal c d (sign of q = sign of d where c > 0: C6, entropy only scales)
    t = ecr_terms(delta, b.H, b.mask, A_task, use_projection=False)
    assert torch.equal(t["mu_c"], torch.zeros_like(t["mu_c"])) and torch.equal(t["q"], t["c"] * t["d"])
    assert torch.equal(t["c"], base["c"]) and torch.equal(t["d"], base["d"])
    pos = t["c"] > 0
    assert torch.equal(torch.sign(t["q"])[pos], torch.sign(t["d"])[pos])
    t = ecr_terms(delta, b.H, b.mask, A_task, use_projection=False, projection_norm="max")
    assert torch.equal(t["q"], t["c"] * t["d"])

    # (2) c = 1 with the projection kept: a plain-mean projection
    t = ecr_terms(delta, b.H, b.mask, A_task, use_entropy=False)
    assert torch.equal(t["c"], valid.double()) and torch.equal(t["d"], base["d"])
    L = valid.sum(dim=1)
    plain_mean = torch.where(L > 0, row_sums(t["d"], valid) / L.clamp(min=1), 0.0)
    torch.testing.assert_close(t["mu_c"], plain_mean, rtol=1e-12, atol=1e-12)

    # (6) no signed gap: d = s c, independent of delta
    t = ecr_terms(delta, b.H, b.mask, A_task, signed_gap=False)
    assert torch.equal(t["d"], torch.where(valid, s * base["c"], 0.0)) and torch.equal(t["c"], base["c"])
    assert torch.equal(ecr_terms(delta * 7 - 3, b.H, b.mask, A_task, signed_gap=False)["q"], t["q"])

    # direction / confidence options touch only d / c; rho only w
    t = ecr_terms(delta, b.H, b.mask, A_task, direction="clip")
    assert torch.equal(t["c"], base["c"]) and torch.equal(t["d"], torch.where(valid, s * delta.clamp(-1, 1), 0.0))
    t = ecr_terms(delta, b.H, b.mask, A_task, confidence="inverse")
    assert torch.equal(t["d"], base["d"])
    t = ecr_terms(delta, b.H, b.mask, A_task, rho=0.9)
    assert all(torch.equal(t[k], base[k]) for k in ("c", "d", "mu_c", "q"))
    assert torch.equal(t["w"], torch.where(valid, 1 + 0.9 * base["q"], 1.0))


def test_weight_full_and_alpha_zero_ablations():
    A_task = torch.tensor([1.0, -0.5], dtype=F64)
    A_T = torch.tensor([0.25, 0.75], dtype=F64)
    w = torch.tensor([[1.5, 0.5, 9.0], [0.8, 1.2, 1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # default: w A_task + alpha A_T (teacher sequence part not modulated)
    exp = torch.tensor([[1.5 + 0.5, 0.5 + 0.5, 0.0], [-0.4 + 1.5, -0.6 + 1.5, -0.5 + 1.5]], dtype=F64)
    assert torch.equal(uecr_advantages(A_task, A_T, w, mask, alpha=2.0), exp)
    # (4) w on the full A_U = A_task + alpha A_T
    A_U = A_task + 2.0 * A_T
    exp_full = torch.where(mask.bool(), w * A_U.unsqueeze(1), 0.0)
    assert torch.equal(uecr_advantages(A_task, A_T, w, mask, alpha=2.0, weight_full=True), exp_full)
    # (5) alpha = 0 keeps ECR on the task part only
    exp_task = torch.where(mask.bool(), w * A_task.unsqueeze(1), 0.0)
    assert torch.equal(uecr_advantages(A_task, A_T, w, mask, alpha=0.0), exp_task)
    # C8: the full advantage may differ in sign from the task part
    A = uecr_advantages(torch.tensor([-0.2]), torch.tensor([1.0]), torch.ones(1, 2), torch.ones(1, 2))
    assert (A > 0).all()


def test_c9_shuffled_entropy_recomputes_mu_c():
    delta = torch.tensor([[3.0, -1.0, 0.5, -2.0]], dtype=F64)
    H = torch.tensor([[0.0, 4.0, 8.0, 1.0]], dtype=F64)
    A = torch.tensor([1.0], dtype=F64)
    t = ecr_terms(delta, H, torch.ones(1, 4), A)
    ts = ecr_terms(delta, H[:, [2, 0, 3, 1]], torch.ones(1, 4), A)
    assert not torch.allclose(t["mu_c"], ts["mu_c"]) and not torch.allclose(t["w"], ts["w"])
    assert abs(float(ts["q"].sum())) < 1e-15  # the shuffle still satisfies C1


def test_ecr_dtypes_and_empty_rows():
    mask = torch.tensor([[0, 0], [1, 0]])
    for dt, exp in ((torch.bfloat16, torch.float32), (torch.float32, torch.float32), (F64, F64)):
        H = torch.tensor([[NAN, NAN], [1.0, NAN]], dtype=dt)
        t = ecr_terms(torch.tensor([[NAN, NAN], [2.0, NAN]], dtype=dt), H, mask, torch.tensor([0.5, 0.5], dtype=dt))
        assert all(v.dtype == exp and torch.isfinite(v).all() for v in t.values())
        assert torch.equal(t["w"][0], torch.ones(2, dtype=exp)) and t["mu_c"][0] == 0
        assert t["q"][1, 0] == 0 and t["w"][1, 0] == 1  # a single-token row is its own mean
    # float32 delta with float64 A_task_U (the trainer's mix): float64 out
    t = ecr_terms(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([1.0], dtype=F64))
    assert t["w"].dtype == F64
    # zero-width batch
    t = ecr_terms(torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0), torch.ones(2), projection_norm="max")
    assert t["w"].shape == (2, 0) and t["mu_c"].tolist() == [0.0, 0.0]


def test_ecr_rejects_bad_options():
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1))
    for kw in ({"rho": 1.0}, {"rho": -0.1}, {"tau_H": 0.0}, {"tau_delta": -1.0}, {"direction": "sign"},
               {"confidence": "linear"}, {"projection_norm": "l2"}):
        with pytest.raises(ValueError):
            ecr_terms(*args, **kw)
    with pytest.raises(ValueError):
        ecr_terms(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2), torch.ones(1))
    with pytest.raises(ValueError):
        ecr_terms(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(2))
    with pytest.raises(ValueError):
        puu(torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError):
        puu(torch.zeros(2, 4), torch.zeros(4, 2))


# ----------------------------------------------------------------------------------------------- baselines


def test_pg_opd_is_coef_times_delta():
    delta = torch.tensor([[0.5, -2.0, NAN], [NAN, NAN, NAN]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(pg_opd_advantages(delta, mask), torch.tensor([[0.5, -2.0, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(pg_opd_advantages(delta, mask, coef=0.5), torch.tensor([[0.25, -1.0, 0.0], [0.0, 0.0, 0.0]]))


def test_distilled_rl_hand_computed():
    # kappa 2: log rho~ = clip(delta, -ln 2, ln 2). Row 0: [ln 2, 0], geometric mean sqrt 2 -> w = [sqrt 2, 1/sqrt 2].
    delta = torch.tensor([[10.0, 0.0, NAN], [1.0, -1.0, 0.0], [3.0, 3.0, 3.0], [-0.1, NAN, NAN]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]])
    A = torch.tensor([0.5, -0.3, 0.0, 2.0], dtype=F64)
    out = distilled_rl_advantages(A, delta, mask)
    r2 = math.sqrt(2)
    exp = torch.tensor([[0.5 * r2, 0.5 / r2, 0.0], [-0.3] * 3, [0.0] * 3, [2.0, 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(out, exp, rtol=1e-14, atol=1e-14)
    # constant ratio (all clipped to kappa) -> weights 1; single token -> weight 1
    ones = torch.tensor([1.0, 1.0])
    out = distilled_rl_advantages(ones, torch.tensor([[5.0, 9.0], [-3.0, 0.0]]), torch.tensor([[1, 1], [1, 0]]))
    assert torch.equal(out, torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    with pytest.raises(ValueError):
        distilled_rl_advantages(A, delta, mask, kappa=0.5)


@PROPS
@given(batches(), st.sampled_from([1.0, 1.5, 2.0, 10.0]))
def test_distilled_rl_properties(b, kappa):
    delta = token_gap(b.teacher_logps, b.old_logps, b.mask)
    gen = torch.Generator().manual_seed(int(b.valid.sum()))
    A = torch.randn(b.valid.shape[0], generator=gen).to(b.dtype)
    A[::3] = 0.0
    out = distilled_rl_advantages(A, delta, b.mask, kappa=kappa)
    assert out.dtype == b.dtype and torch.isfinite(out).all() and (out[~b.valid] == 0).all()
    broadcast = torch.where(b.valid, A.unsqueeze(1), torch.zeros((), dtype=b.dtype))
    assert torch.equal(out[A <= 0], broadcast[A <= 0])  # A <= 0 unchanged, A = 0 stays 0
    pos = (A > 0) & b.valid.any(dim=1)
    w = (out[pos].double() / A[pos].double().unsqueeze(1))
    v = b.valid[pos]
    log_w = torch.where(v, w.clamp(min=1e-300).log(), 0.0)
    assert amax(log_w.sum(dim=1)) <= (1e-12 if b.dtype == F64 else 1e-5) * v.shape[1]  # prod w = 1
    assert (w[v] > 0).all() and (w[v] <= kappa**2 * (1 + 1e-6)).all() and (w[v] >= kappa**-2 * (1 - 1e-6)).all()


def test_atod_lambda_schedule():
    assert atod_lambda(0, 100) == 1.0 and atod_lambda(-5, 100) == 1.0
    assert atod_lambda(100, 100) == 0.1 and atod_lambda(250, 100) == 0.1
    assert math.isclose(atod_lambda(50, 100), 0.55, rel_tol=1e-12)
    assert math.isclose(atod_lambda(25, 100), 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)), rel_tol=1e-12)
    values = [atod_lambda(k, 37, 2.0, 0.0) for k in range(40)]
    assert values[0] == 2.0 and values[-1] == 0.0 and all(a >= b for a, b in zip(values, values[1:]))
    assert atod_lambda(0, 0) == 0.1 and atod_lambda(7, -1, 1.0, 0.3) == 0.3  # no horizon -> lambda_end


def test_atod_advantages_hand_computed():
    delta = torch.tensor([[1.0, -1.0], [2.0, 9.0], [5.0, 5.0]], dtype=F64)
    old = torch.tensor([[-1.0, -3.0], [-4.0, NAN], [NAN, NAN]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]])
    A = torch.tensor([0.5, -0.5, 0.7], dtype=F64)
    out = atod_advantages(A, delta, old, mask, lambda_opd=0.3, kappa_omega=1.0)
    # non-empty rows 0, 1: D = [1, 2] -> z_D = [-0.5, 0.5] / (0.5 + 1e-6); U = [2, 4] -> z_U = [-1, 1] / (1 + 1e-6)
    z = torch.tensor([-0.5 / (0.5 + 1e-6) - 1 / (1 + 1e-6), 0.5 / (0.5 + 1e-6) + 1 / (1 + 1e-6), 0.0], dtype=F64)
    omega = 1 + torch.sigmoid(z)
    torch.testing.assert_close(out["omega"], omega, rtol=1e-14, atol=1e-14)
    exp = torch.tensor(
        [[0.5 + 0.3 * omega[0] * 1, 0.5 - 0.3 * omega[0]], [-0.5 + 0.3 * omega[1] * 2, 0.0], [0.0, 0.0]], dtype=F64
    )
    torch.testing.assert_close(out["advantages"], exp, rtol=1e-14, atol=1e-14)
    # one non-empty row, or zero spread: z = 0 -> omega = 1 + kappa / 2
    one = atod_advantages(A[:1], delta[:1], old[:1], mask[:1], lambda_opd=1.0, kappa_omega=2.0)
    assert torch.equal(one["omega"], torch.tensor([2.0], dtype=F64))
    same = atod_advantages(torch.zeros(2), torch.ones(2, 2), -torch.ones(2, 2), torch.ones(2, 2), lambda_opd=1.0)
    assert torch.equal(same["omega"], torch.full((2,), 1.5))
    assert torch.equal(same["advantages"], torch.full((2, 2), 1.5))


@PROPS
@given(batches(), st.sampled_from([0.5, 1.0, 3.0]), st.floats(0.0, 1.0), st.sampled_from([0.5, 1.0]))
def test_atod_properties(b, kappa_omega, lambda_opd, lambda_rl):
    delta = token_gap(b.teacher_logps, b.old_logps, b.mask)
    A = torch.linspace(-1, 1, b.valid.shape[0], dtype=b.dtype)
    out = atod_advantages(A, delta, b.old_logps, b.mask, lambda_opd, kappa_omega=kappa_omega, lambda_rl=lambda_rl)
    omega, adv = out["omega"], out["advantages"]
    assert omega.dtype == adv.dtype == b.dtype and torch.isfinite(adv).all() and torch.isfinite(omega).all()
    assert (omega > 1).all() and (omega < 1 + kappa_omega).all()
    exp = lambda_rl * A.double().unsqueeze(1) + lambda_opd * omega.double().unsqueeze(1) * delta.double()
    exp = torch.where(b.valid, exp, 0.0)
    assert (adv.double() - exp).abs().max() <= (1e-12 if b.dtype == F64 else 1e-4)


# ------------------------------------------------------------------------------------------------- audits


def test_alpha_safety_hand_group():
    # correct: 0 (R^T 0.1), 1 (0.5); incorrect: 2 (0.3), 3 (-0.2). Only (0, 2) has the teacher preferring the
    # incorrect response: alpha* = 1 / (0.3 - 0.1) = 5.
    R = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=F64)
    S = torch.tensor([0.1, 0.5, 0.3, -0.2], dtype=F64)
    a_star = alpha_safety(R, S)
    assert math.isclose(a_star, 5.0, rel_tol=1e-12)

    def inverted(alpha):
        U = R + alpha * S
        return bool((U[2] > U[0]) or (U[3] > U[0]) or (U[2] > U[1]) or (U[3] > U[1]))

    assert not inverted(4.99) and inverted(5.01)
    assert alpha_safety(R, torch.tensor([0.5, 0.4, 0.3, -0.2])) == math.inf  # teacher agrees with the verifier
    assert alpha_safety(torch.ones(4), S) == math.inf  # tied group: no correct-incorrect pair
    assert alpha_safety(torch.tensor([1.0]), torch.tensor([0.0])) == math.inf
    # non-binary margins (DAPO's +-1): inversion at margin / gap = 2 / 0.5
    assert math.isclose(alpha_safety(torch.tensor([1.0, -1.0]), torch.tensor([0.0, 0.5])), 4.0)
    with pytest.raises(ValueError):
        alpha_safety(torch.zeros(2, 2), torch.zeros(2, 2))


@PROPS
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0]), st.floats(-3, 3).map(lambda x: round(x, 3))), max_size=12))
def test_alpha_safety_is_the_inversion_threshold(group):
    """Scores on a 1e-3 grid keep alpha* <= 1000, where R + alpha R^T still resolves the unit margin."""
    R = torch.tensor([r for r, _ in group], dtype=F64)
    S = torch.tensor([s for _, s in group], dtype=F64)
    a_star = alpha_safety(R, S)

    def inverted(alpha):
        U = R + alpha * S
        mixed = R.numel() > 0 and R.max() > R.min()
        return bool(mixed and (U[R == 0].max() > U[R == 1].min()))

    if a_star == math.inf:
        assert not inverted(1e6)
    else:
        assert a_star > 0 and inverted(a_star * (1 + 1e-6)) and not inverted(a_star * (1 - 1e-6))


def test_audit_metrics_hand_batch():
    task = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]], dtype=F64)
    scores = torch.tensor([[0.0, 0.4], [0.0, 0.01], [0.0, 0.0], [0.1, 0.2]], dtype=F64)
    R_U = puu(task, scores)["R_U"]
    # Std(R_U) = [0.2, 0.005, 0.5, 0.05]; teacher range = [0.4, 0.01, 0, 0.1]; degenerate = groups 0, 1, 3
    m = audit_metrics(task, R_U, scores)
    exp = {
        "degenerate_frac": 0.75,
        "unified_variation_frac": 0.5,
        "teacher_range_frac": 0.5,
        "degenerate_resolved_frac": 1 / 3,
        "degenerate_teacher_range_frac": 2 / 3,
    }
    assert m.keys() == exp.keys() and all(math.isclose(m[k], v) for k, v in exp.items())
    m = audit_metrics(task, R_U, scores, std_threshold=0.01, range_threshold=0.005)
    assert math.isclose(m["degenerate_resolved_frac"], 2 / 3) and math.isclose(m["teacher_range_frac"], 0.75)
    m = audit_metrics(task[2:3], R_U[2:3], scores[2:3])  # no degenerate group: conditional stats left out
    assert m == {"degenerate_frac": 0.0, "unified_variation_frac": 1.0, "teacher_range_frac": 0.0}
