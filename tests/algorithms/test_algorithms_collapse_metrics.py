"""RAGEN-2 MI collapse metrics: mi_metrics / cross_log_prob_matrices (arXiv:2604.06268 sections 3.2, 3.5).

Property tests over random cross-score matrices (N 1..12 traces, P 2..8 prompts; free values from
per-token to sequence scale, and tie-heavy integer grids) plus hand-computed cases, the paper's own
sketch as an oracle on tie-free matrices, and a brute-force random-tie-break oracle for retrieval.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.algorithms.collapse_metrics import cross_log_prob_matrices, mi_metrics

PROPS = settings(max_examples=150, deadline=None)


@st.composite
def cases(draw, max_N=12, max_P=8, kind=None):
    """(L float64 (N, P), true ids (N,) long): free floats up to sequence scale, or a tie-heavy integer grid."""
    N, P = draw(st.integers(1, max_N)), draw(st.integers(2, max_P))
    kind = kind or draw(st.sampled_from(["free", "ties"]))
    if kind == "free":
        vals = draw(st.lists(st.floats(-2000.0, 5.0), min_size=N * P, max_size=N * P))
    else:
        vals = draw(st.lists(st.sampled_from([-3.0, -2.0, -1.0, 0.0]), min_size=N * P, max_size=N * P))
    ids = draw(st.lists(st.integers(0, P - 1), min_size=N, max_size=N))
    return torch.tensor(vals, dtype=torch.float64).view(N, P), torch.tensor(ids, dtype=torch.long)


def paper_sketch(L: torch.Tensor, ids: torch.Tensor) -> dict[str, float]:
    """The paper's section 3.5 code sketch (argmax retrieval), valid as an oracle only without ties."""
    n, p = L.shape
    matched = L[torch.arange(n), ids]
    marginal = torch.logsumexp(L, dim=1) - math.log(p)
    return {
        "mi_estimate": float((matched - marginal).mean()),
        "conditional_entropy": float(-matched.mean()),
        "reasoning_entropy": float(-marginal.mean()),
        "retrieval_accuracy": float((L.argmax(dim=1) == ids).double().mean()),
        "marginal_std": float(marginal.std(unbiased=False)),
    }


def random_tiebreak_hit(row: list[float], true: int, k: int) -> float:
    """Fraction of all column orders in which a stable descending sort puts ``true`` in the top k."""
    hits = perms = 0
    for order in itertools.permutations(range(len(row))):
        ranked = sorted(order, key=lambda j: -row[j])  # stable: ties keep the permuted order
        hits += true in ranked[:k]
        perms += 1
    return hits / perms


def test_hand_computed_2x2():
    # q(z0|x0)=.6, q(z0|x1)=.2 (own prompt 0); q(z1|x0)=.1, q(z1|x1)=.3 but z1 is labelled with prompt 0.
    L = torch.tensor([[0.6, 0.2], [0.1, 0.3]]).log()
    m = mi_metrics(L, torch.tensor([0, 0]))
    # gaps: log(.6/.4) = log 1.5 and log(.1/.2) = log .5; marginals log .4 and log .2
    assert m["mi_estimate"] == pytest.approx(-0.14384103622589045, abs=1e-7)  # log(.75)/2 (fp32 input)
    assert m["marginal_std"] == pytest.approx(0.34657359027997264, abs=1e-7)  # log(2)/2
    assert m["mi_zscore"] == pytest.approx(-0.4138433996381187, abs=1e-6)  # log(.75)/2 / (log(2)/2 + 1e-3)
    assert m["conditional_entropy"] == pytest.approx(1.4067053583800182, abs=1e-7)
    assert m["reasoning_entropy"] == pytest.approx(1.2628643221541276, abs=1e-7)
    assert m["mi_upper_bound"] == math.log(2)
    assert m["retrieval_accuracy"] == 0.5 and m["retrieval_chance_level"] == 0.5
    assert m["retrieval_above_chance"] == 0.0
    assert not any(key.startswith("retrieval_at_") for key in m)  # every k >= P = 2


def test_hand_computed_ties_3x3():
    rows = [[0.0, 0.0, -1.0], [-1.0, 0.0, 0.0], [-2.0, -1.0, -1.0], [5.0, 5.0, 5.0]]
    L = torch.tensor(rows, dtype=torch.float64)
    m = mi_metrics(L, torch.tensor([0, 0, 2, 1]))
    # per-row top-1 hits: 1/2 (tied with one), 0 (two above), 1/2, 1/3; top-2: 1, 0, 1, 2/3
    assert m["retrieval_accuracy"] == pytest.approx(1 / 3, abs=1e-15)
    assert m["retrieval_at_2"] == pytest.approx(2 / 3, abs=1e-15)
    assert m["retrieval_chance_at_2"] == 2 / 3
    assert m["retrieval_above_chance_at_2"] == pytest.approx(0.0, abs=1e-15)
    assert "retrieval_at_4" not in m and "retrieval_at_8" not in m


def test_single_trace_zscore_uses_eps_only():
    L = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=torch.float64)
    m = mi_metrics(L, torch.tensor([0]), zscore_eps=0.01)
    gap = math.log(0.5) - math.log(0.375)
    assert m["marginal_std"] == 0.0
    assert m["mi_estimate"] == pytest.approx(gap, abs=1e-14)
    assert m["mi_zscore"] == pytest.approx(gap / 0.01, abs=1e-11)


def test_ks_filtering():
    L = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    m = mi_metrics(L, torch.tensor([0, 1, 2, 3, 0, 1]))
    assert {"retrieval_at_2", "retrieval_chance_at_2", "retrieval_above_chance_at_2"} <= m.keys()
    assert not any(key.endswith(("_at_4", "_at_8")) for key in m)
    assert m["retrieval_chance_at_2"] == 0.5
    m = mi_metrics(L, torch.tensor([0, 1, 2, 3, 0, 1]), ks=(1, 3))
    assert m["retrieval_at_1"] == m["retrieval_accuracy"] and "retrieval_at_3" in m and "retrieval_at_2" not in m


@PROPS
@given(cases(), st.floats(0.5, 50.0))
def test_own_prompt_dominant_is_perfect_retrieval(case, bonus):
    base, ids = case
    L = base.clamp(min=-5.0, max=0.0)  # spread < bonus, so the own column is the strict row maximum
    L[torch.arange(L.shape[0]), ids] += 5.0 + bonus
    m = mi_metrics(L, ids)
    P = L.shape[1]
    assert m["retrieval_accuracy"] == 1.0 and m["retrieval_above_chance"] == pytest.approx(1 - 1 / P)
    assert all(m[f"retrieval_at_{k}"] == 1.0 for k in (2, 4, 8) if k < P)
    assert 0 < m["mi_estimate"] <= math.log(P) + 1e-9
    assert m["conditional_entropy"] < m["reasoning_entropy"]
    assert m["mi_zscore"] > 0


@PROPS
@given(cases(kind="free"))
def test_identical_columns_are_exactly_chance(case):
    base, ids = case
    N, P = base.shape
    L = base[:, :1].expand(N, P).contiguous()  # L[n, j] = c_n: every trace equally likely under every prompt
    m = mi_metrics(L, ids)
    assert m["mi_estimate"] == 0.0 and m["mi_zscore"] == 0.0
    assert m["retrieval_accuracy"] == pytest.approx(1 / P, abs=1e-15)
    assert m["retrieval_above_chance"] == pytest.approx(0.0, abs=1e-15)
    for k in (2, 4, 8):
        if k < P:
            assert m[f"retrieval_at_{k}"] == pytest.approx(k / P, abs=1e-15)
            assert m[f"retrieval_above_chance_at_{k}"] == pytest.approx(0.0, abs=1e-15)
    assert m["conditional_entropy"] == pytest.approx(m["reasoning_entropy"], rel=1e-12, abs=1e-12)


@PROPS
@given(cases())
def test_entropy_decomposition_and_bounds(case):
    L, ids = case
    m = mi_metrics(L, ids)
    P = L.shape[1]
    scale = 1.0 + float(L.abs().max())
    # H(Z) = I(X; Z) + H(Z|X) (section 3.2)
    assert m["reasoning_entropy"] == pytest.approx(m["mi_estimate"] + m["conditional_entropy"], abs=1e-12 * scale)
    assert m["reasoning_entropy"] == -m["marginal_log_prob_mean"]
    assert m["conditional_entropy"] == -m["matched_log_prob_mean"]
    assert m["mi_estimate"] <= math.log(P) + 1e-9 and m["mi_upper_bound"] == math.log(P)
    assert m["marginal_std"] >= 0
    assert m["mi_zscore"] == pytest.approx(m["mi_estimate"] / (m["marginal_std"] + 1e-3), rel=1e-9, abs=1e-9)
    hits = [m["retrieval_accuracy"]] + [m[f"retrieval_at_{k}"] for k in (2, 4, 8) if k < P]
    assert all(0.0 <= h <= 1.0 for h in hits) and hits == sorted(hits)  # more candidates, no fewer hits
    assert all(isinstance(v, float) for v in m.values())


@PROPS
@given(st.integers(1, 12), st.integers(2, 8), st.integers(0, 2**31), st.sampled_from([1.0, 30.0, 1000.0]))
def test_matches_paper_sketch_without_ties(N, P, seed, scale):
    g = torch.Generator().manual_seed(seed)
    L = scale * torch.randn(N, P, generator=g, dtype=torch.float64) - scale
    ids = torch.randint(0, P, (N,), generator=g)
    m, ref = mi_metrics(L, ids), paper_sketch(L, ids)
    for key in ("mi_estimate", "conditional_entropy", "reasoning_entropy", "marginal_std"):
        assert m[key] == pytest.approx(ref[key], rel=1e-12, abs=1e-12 * scale), key
    assert m["retrieval_accuracy"] == ref["retrieval_accuracy"]


@settings(max_examples=60, deadline=None)
@given(cases(max_N=4, max_P=5, kind="ties"))
def test_retrieval_is_expected_hit_of_random_tiebreak(case):
    L, ids = case
    P = L.shape[1]
    m = mi_metrics(L, ids, ks=(1, 2, 3, 4))
    for k in range(1, P):
        expected = sum(random_tiebreak_hit(row, int(t), k) for row, t in zip(L.tolist(), ids)) / len(ids)
        assert m[f"retrieval_at_{k}"] == pytest.approx(expected, abs=1e-12), k


@PROPS
@given(cases(kind="ties"), st.data())
def test_invariances(case, data):
    L, ids = case
    N, P = L.shape
    m = mi_metrics(L, ids)
    # a per-trace shift (e.g. a trace-length effect) changes entropies but not input dependence;
    # integer shifts keep every tie exact
    c = torch.tensor(data.draw(st.lists(st.integers(-1000, 1000), min_size=N, max_size=N)), dtype=torch.float64)
    shifted = mi_metrics(L + c.unsqueeze(1), ids)
    assert shifted["mi_estimate"] == pytest.approx(m["mi_estimate"], abs=1e-12)
    assert shifted["conditional_entropy"] == pytest.approx(m["conditional_entropy"] - float(c.mean()), abs=1e-9)
    for key in m:
        if key.startswith("retrieval"):
            assert shifted[key] == m[key], key
    # relabelling the prompts changes nothing (ties included: no column-order preference)
    perm = torch.tensor(data.draw(st.permutations(range(P))))
    permuted = mi_metrics(L[:, perm], torch.argsort(perm)[ids])
    assert permuted.keys() == m.keys()
    for key in m:
        # relative too: mi_zscore divides by (marginal_std + 1e-3) and reaches ~1e3 when the std is ~0, where
        # a permuted logsumexp's last-bit differences are ~1e-10 absolute
        assert permuted[key] == pytest.approx(m[key], rel=1e-9, abs=1e-12), key


def test_dtype_is_cast_to_float64():
    g = torch.Generator().manual_seed(1)
    L32 = torch.randn(7, 5, generator=g) * 40
    ids = torch.tensor([0, 1, 2, 3, 4, 0, 1], dtype=torch.int32)
    assert mi_metrics(L32, ids) == mi_metrics(L32.double(), ids.long())


def test_cross_log_prob_matrices():
    sums = torch.tensor([[-6.0, -9.0, -3.0], [-10.0, -4.0, -8.0]])
    L_mean, L_sum = cross_log_prob_matrices(sums, torch.tensor([3, 2]))
    assert L_sum.dtype == L_mean.dtype == torch.float64
    assert torch.equal(L_sum, sums.double())
    assert torch.equal(L_mean, torch.tensor([[-2.0, -3.0, -1.0], [-5.0, -2.0, -4.0]], dtype=torch.float64))
    L_mean2, _ = cross_log_prob_matrices(sums, torch.tensor([[3, 3, 3], [2, 2, 2]]))
    assert torch.equal(L_mean, L_mean2)
    ids = torch.tensor([0, 1])
    # per-token and sequence MI differ when traces have different lengths (the *_seq variant of the paper)
    assert mi_metrics(L_mean, ids)["mi_estimate"] != mi_metrics(L_sum, ids)["mi_estimate"]
    with pytest.raises(ValueError, match="> 0"):
        cross_log_prob_matrices(sums, torch.tensor([3, 0]))
    with pytest.raises(ValueError, match="do not match"):
        cross_log_prob_matrices(sums, torch.tensor([3, 2, 1]))
    with pytest.raises(ValueError, match=r"\(N, P\)"):
        cross_log_prob_matrices(sums[0], torch.tensor([3]))


GOOD_L = torch.zeros(3, 4)
GOOD_IDS = torch.tensor([0, 1, 3])


@pytest.mark.parametrize(
    "L, ids, kwargs, match",
    [
        (torch.zeros(4), GOOD_IDS, {}, "2-D"),
        (torch.zeros(2, 3, 4), GOOD_IDS, {}, "2-D"),
        (torch.zeros(3, 1), torch.tensor([0, 0, 0]), {}, "at least 2"),
        (torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), {}, "no rows"),
        (torch.zeros(3, 4, dtype=torch.long), GOOD_IDS, {}, "floating"),
        (torch.tensor([[0.0, float("nan"), 0, 0]] * 3), GOOD_IDS, {}, "finite"),
        (torch.tensor([[0.0, float("-inf"), 0, 0]] * 3), GOOD_IDS, {}, "finite"),
        (torch.tensor([[0.0, float("inf"), 0, 0]] * 3), GOOD_IDS, {}, "finite"),
        (GOOD_L, torch.tensor([0, 1]), {}, "true_prompt_ids must be a"),
        (GOOD_L, torch.tensor([[0, 1, 3]]), {}, "true_prompt_ids must be a"),
        (GOOD_L, torch.tensor([0.0, 1.0, 3.0]), {}, "integer"),
        (GOOD_L, torch.tensor([0, 1, 4]), {}, "lie in"),
        (GOOD_L, torch.tensor([0, -1, 3]), {}, "lie in"),
        (GOOD_L, GOOD_IDS, {"ks": (2, 0)}, "ks"),
        (GOOD_L, GOOD_IDS, {"ks": (2.0,)}, "ks"),
        (GOOD_L, GOOD_IDS, {"zscore_eps": 0.0}, "zscore_eps"),
        (GOOD_L, GOOD_IDS, {"zscore_eps": float("nan")}, "zscore_eps"),
    ],
)
def test_invalid_inputs_raise(L, ids, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mi_metrics(L, ids, **kwargs)
    assert mi_metrics(GOOD_L, GOOD_IDS)["mi_estimate"] == 0.0  # the valid baseline does not raise
