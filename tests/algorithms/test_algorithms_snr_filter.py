"""RAGEN-2 SNR-aware filtering's pure functions: group scores, group selection, loss scale, telemetry.

Property tests over random score vectors (P 1..40, fp32/fp64, free / non-negative / tie-heavy / tiny
values, injected exact and near zeros) against independent python-float oracles, plus hand-computed
cases (section 3.4 of arXiv:2604.06268; semantics of the RAGEN reference notes, section 1).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.algorithms.snr_filter import (
    KEEP_MODES,
    SCORE_METRICS,
    STRATEGIES,
    TOP_P_MODES,
    filter_loss_scale,
    group_scores,
    select_groups,
    selection_metrics,
)

PROPS = settings(max_examples=100, deadline=None)
NAN = math.nan
# (strategy, top_p_mode, keep) combinations that are defined (linear top-p is largest-only)
COMBOS = [
    (s, m, k)
    for s in STRATEGIES
    for m in (("linear", "softmax") if s == "top_p" else ("linear",))
    for k in KEEP_MODES
    if not (s == "top_p" and m == "linear" and k == "smallest")
]


@st.composite
def score_vectors(draw, max_P=40):
    """(P,) fp32 or fp64 scores; some entries forced to exact or near (|s| <= 1e-10) zero."""
    P = draw(st.integers(1, max_P))
    kind = draw(st.sampled_from(["free", "nonneg", "ties", "tiny"]))
    elem = {
        "free": st.floats(-10, 10, width=32),
        "nonneg": st.floats(0, 10, width=32),
        "ties": st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 4.0]),
        "tiny": st.floats(0, 0.0078125, width=32),
    }[kind]
    vals = draw(st.lists(elem, min_size=P, max_size=P))
    zeros = draw(st.lists(st.sampled_from([None, 0.0, -0.0, 1e-11, -1e-11]), min_size=P, max_size=P))
    vals = [v if z is None or draw(st.booleans()) else z for v, z in zip(vals, zeros)]
    return torch.tensor(vals, dtype=draw(st.sampled_from([torch.float32, torch.float64])))


def candidates(s: list[float], include_zero: bool) -> list[int]:
    return [i for i, v in enumerate(s) if include_zero or abs(v) > 1e-10]


def kept_ids(mask: torch.Tensor) -> list[int]:
    assert mask.dtype == torch.bool and mask.dim() == 1
    return mask.nonzero().squeeze(1).tolist()


# ---------------------------------------------------------------- group_scores

R = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 4.0]])
H = torch.tensor([[0.5, 0.5, 1.5, 1.5], [2.0, 2.0, 2.0, 2.0], [0.0, 1.0, 2.0, 3.0]])
L = torch.tensor([[10, 20, 30, 40], [5, 5, 5, 5], [1, 2, 3, 6]])  # integer token counts


@pytest.mark.parametrize(
    "metric, expected",
    [
        # means [1.5, 1, 1]; squared deviations /4: (2.25+.25+.25+2.25)/4, 0, (1+1+1+9)/4
        ("reward_variance", [1.25, 0.0, 3.0]),
        ("reward_std", [math.sqrt(5 / 3), 0.0, 2.0]),  # sqrt(sum dev^2 / 3): sqrt(5/3), 0, sqrt(12/3)
        ("reward_sum", [6.0, 4.0, 4.0]),
        ("reward_mean", [1.5, 1.0, 1.0]),
        ("entropy", [1.0, 2.0, 1.5]),
        ("entropy_variance", [0.25, 0.0, 1.25]),  # (4 * .25)/4; 0; (2.25+.25+.25+2.25)/4
        ("entropy_std", [math.sqrt(1 / 3), 0.0, math.sqrt(5 / 3)]),
        ("length", [25.0, 5.0, 3.0]),
    ],
)
def test_group_scores_hand_computed(metric, expected):
    out = group_scores(R, metric, entropies=H, lengths=L)
    assert out.shape == (3,) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor(expected), rtol=1e-6, atol=1e-7)


def test_reward_variance_is_population_and_reward_std_unbiased():
    x = torch.tensor([[0.0, 2.0], [1.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(group_scores(x, "reward_variance"), torch.tensor([1.0, 2.25], dtype=torch.float64))
    expected_std = torch.tensor([math.sqrt(2), math.sqrt(4.5)], dtype=torch.float64)
    torch.testing.assert_close(group_scores(x, "reward_std"), expected_std)


@PROPS
@given(st.integers(1, 6), st.integers(2, 9), st.data())
def test_group_scores_match_torch_without_nan(P, G, data):
    vals = data.draw(st.lists(st.floats(-100, 100, width=32), min_size=P * G, max_size=P * G))
    x = torch.tensor(vals, dtype=torch.float64).view(P, G)
    torch.testing.assert_close(group_scores(x, "reward_variance"), x.var(dim=1, unbiased=False), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(group_scores(x, "reward_std"), x.std(dim=1), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(group_scores(x, "reward_sum"), x.sum(dim=1), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(group_scores(x, "entropy_std", entropies=x), x.std(dim=1), atol=1e-9, rtol=1e-9)


def test_nan_rewards_use_scored_rollouts_only():
    x = torch.tensor([[NAN, 1.0, 3.0, NAN], [NAN, NAN, NAN, 2.0], [NAN] * 4, [0.0, NAN, 5.0, 2.0]])
    # scored values: [1, 3]; [2] (one scored: variance/std 0); none (every metric 0); [0, 5, 2] with
    # mean 7/3 and squared deviations 49/9 + 64/9 + 1/9 = 38/3 -> population 38/9, unbiased 19/3
    expect = {
        "reward_variance": [1.0, 0.0, 0.0, 38 / 9],
        "reward_std": [math.sqrt(2), 0.0, 0.0, math.sqrt(19 / 3)],
        "reward_sum": [4.0, 2.0, 0.0, 7.0],
        "reward_mean": [2.0, 2.0, 0.0, 7 / 3],
    }
    for metric, e in expect.items():
        out = group_scores(x, metric)
        assert not torch.isnan(out).any(), metric
        torch.testing.assert_close(out, torch.tensor(e), rtol=1e-6, atol=1e-7)
    # NaN entropies are treated the same way
    torch.testing.assert_close(group_scores(x, "entropy", entropies=x), torch.tensor(expect["reward_mean"]))


@PROPS
@given(st.integers(1, 6), st.integers(1, 9), st.data())
def test_group_scores_never_nan(P, G, data):
    vals = data.draw(st.lists(st.one_of(st.just(NAN), st.floats(-5, 5)), min_size=P * G, max_size=P * G))
    x = torch.tensor(vals).view(P, G)
    for metric in SCORE_METRICS:
        out = group_scores(x, metric, entropies=x, lengths=x)
        assert out.shape == (P,) and torch.isfinite(out).all(), metric


def test_single_rollout_groups_and_equal_values_score_exactly_zero():
    x = torch.tensor([[3.0], [-1.0]])
    for metric in ("reward_variance", "reward_std", "entropy_variance", "entropy_std"):
        assert group_scores(x, metric, entropies=x).tolist() == [0.0, 0.0]
    assert group_scores(x, "reward_mean").tolist() == [3.0, -1.0]
    # 3 * 0.1 / 3 != 0.1 in floating point: the naive variance is ~1e-34, not 0
    eq = torch.tensor([[0.1, 0.1, 0.1], [1e6 + 0.1] * 3, [0.7, NAN, 0.7]], dtype=torch.float64)
    assert group_scores(eq, "reward_variance").tolist() == [0.0, 0.0, 0.0]
    assert group_scores(eq, "reward_std").tolist() == [0.0, 0.0, 0.0]


def test_group_scores_errors():
    with pytest.raises(ValueError, match="'entropy'.*entropies"):
        group_scores(R, "entropy")
    with pytest.raises(ValueError, match="'entropy_std'.*entropies"):
        group_scores(R, "entropy_std", lengths=L)
    with pytest.raises(ValueError, match="'length'.*lengths"):
        group_scores(R, "length", entropies=H)
    with pytest.raises(ValueError, match="reward_variance.*length"):
        group_scores(R, "reward_var")
    with pytest.raises(ValueError, match="match rewards"):
        group_scores(R, "entropy", entropies=H[:2])


# ---------------------------------------------------------------- linear top-p (section 3.4)


@PROPS
@given(score_vectors(), st.floats(0.01, 0.99), st.booleans(), st.sampled_from([0.0, 0.01, 0.1, -0.05, -0.5]))
def test_linear_top_p_is_shortest_reaching_prefix_of_the_largest(s, rho, include_zero, eps):
    keep = kept_ids(select_groups(s, "top_p", rho, "linear", include_zero=include_zero, eps=eps))
    v = s.tolist()
    cand = candidates(v, include_zero)
    order = sorted(cand, key=lambda i: (-v[i], i))  # descending, ties to the lower index
    thr = rho * math.fsum(v[i] for i in cand) - eps
    positive_total = 0.0
    for i in order:
        if v[i] > 0:
            positive_total += v[i]
    reachable = bool(cand) and thr > 0 and positive_total >= thr
    assert bool(keep) == reachable
    if keep:
        k = len(keep)
        assert sorted(keep) == sorted(order[:k])  # exactly the k largest, ties by index
        assert all(v[i] > 0 for i in keep)
        prefix = 0.0
        for i in order[: k - 1]:
            prefix += v[i]
        assert prefix < thr <= prefix + v[order[k - 1]]  # minimal: dropping the last falls short


def test_linear_top_p_hand_computed_paper_example():
    # RV = [4, 1, 0, 3]; zero group dropped; sum 8.
    s = torch.tensor([4.0, 1.0, 0.0, 3.0])
    # rho .9: threshold 7.2 - .01 = 7.19; descending 4 (g0), 3 (g3), 1 (g1): 4 < 7.19, 7 < 7.19, 8 -> {0, 3, 1}
    assert kept_ids(select_groups(s, "top_p", 0.9)) == [0, 1, 3]
    # rho .75: threshold 5.99: 4 < 5.99, 7 >= 5.99 -> {0, 3}
    assert kept_ids(select_groups(s, "top_p", 0.75)) == [0, 3]
    # rho .5: threshold 3.99: 4 -> {0}
    assert kept_ids(select_groups(s, "top_p", 0.5)) == [0]


def test_variance_and_std_scores_select_differently():
    # Population variances [4, 1, 0, 2.25]; unbiased stds [4, 2, 0, 3] / sqrt(3).
    rewards = torch.tensor([[0.0, 0.0, 4.0, 4.0], [0.0, 0.0, 2.0, 2.0], [1.0] * 4, [0.0, 0.0, 3.0, 3.0]])
    var, std = group_scores(rewards, "reward_variance"), group_scores(rewards, "reward_std")
    torch.testing.assert_close(var, torch.tensor([4.0, 1.0, 0.0, 2.25]))
    # variance, rho .8: threshold .8 * 7.25 - .01 = 5.79; 4 < 5.79, 6.25 >= -> {0, 3}
    assert kept_ids(select_groups(var, "top_p", 0.8)) == [0, 3]
    # std, rho .8: threshold .8 * 9/sqrt3 - .01 = 4.1469; 7/sqrt3 = 4.0415 < it -> needs g1 too
    assert kept_ids(select_groups(std, "top_p", 0.8)) == [0, 1, 3]


def test_linear_top_p_empty_cases():
    # Unreachable threshold: a negative eps asks for more than the positive mass (thr 1.8 + .5 = 2.3 > 2).
    assert kept_ids(select_groups(torch.tensor([1.0, 1.0]), "top_p", 0.9, eps=-0.5)) == []
    assert kept_ids(select_groups(torch.tensor([1.0, 1.0]), "top_p", 0.9, eps=0.0)) == [0, 1]
    # ... also when zero / negative scores follow (thr 0 + 1.5; accumulation stops at the first score <= 0)
    assert kept_ids(select_groups(torch.tensor([1.0, 0.0, -1.0]), "top_p", 0.9, include_zero=True, eps=-1.5)) == []
    # threshold <= 0 -> the empty prefix reaches it -> nothing kept:
    # all-zero batch with include_zero (thr = -.01),
    assert kept_ids(select_groups(torch.zeros(4), "top_p", 0.9, include_zero=True)) == []
    # tiny total RV (.9 * .007 - .01 < 0),
    assert kept_ids(select_groups(torch.tensor([0.004, 0.003]), "top_p", 0.9)) == []
    # negative-sum reward_mean scores (sum -2.5).
    means = group_scores(torch.tensor([[-1.0, -1.0], [-2.0, -2.0], [0.0, 1.0]]), "reward_mean")
    assert kept_ids(select_groups(means, "top_p", 0.9, include_zero=True)) == []
    # With a positive sum the same negative scores do not block selection (thr .9 * 1 - .01 = .89).
    assert kept_ids(select_groups(torch.tensor([2.0, -1.0]), "top_p", 0.9, include_zero=True)) == [0]


def test_linear_top_p_ties_go_to_lower_index():
    # sum 4, thr 1.79 with rho .45; 1 + 1 >= 1.79 -> the first two of the four tied groups
    assert kept_ids(select_groups(torch.ones(4), "top_p", 0.45)) == [0, 1]
    s = torch.tensor([1.0, 2.0, 1.0, 2.0])  # thr .5 * 6 - .01 = 2.99; 2 (g1) + 2 (g3) -> {1, 3}
    assert kept_ids(select_groups(s, "top_p", 0.5)) == [1, 3]


# ---------------------------------------------------------------- every strategy


@PROPS
@given(score_vectors(), st.sampled_from([1.0, 1.5]), st.sampled_from(TOP_P_MODES), st.sampled_from(KEEP_MODES))
def test_top_p_rho_one_keeps_every_candidate(s, rho, mode, keep):
    if mode == "linear" and keep == "smallest":
        return
    assert select_groups(s, "top_p", rho, mode, keep, include_zero=True).all()
    expected = [i for i, v in enumerate(s.tolist()) if abs(v) > 1e-10]
    assert kept_ids(select_groups(s, "top_p", rho, mode, keep, include_zero=False)) == expected


@PROPS
@given(score_vectors(), st.floats(0.05, 3.0), st.sampled_from(COMBOS))
def test_include_zero_false_never_keeps_zero_groups(s, value, combo):
    strategy, mode, keep = combo
    mask = select_groups(s, strategy, value, mode, keep, include_zero=False)
    assert mask.shape == s.shape and mask.device == s.device
    assert not (mask & (s.double().abs() <= 1e-10)).any()  # the exact value, as float64


@PROPS
@given(score_vectors(), st.floats(0.01, 1.5), st.integers(1, 45), st.booleans(), st.sampled_from(KEEP_MODES))
def test_top_k_keeps_k_best_with_ties_to_lower_index(s, frac, k_abs, include_zero, keep):
    v = s.tolist()
    cand = candidates(v, include_zero)
    sign = 1.0 if keep == "largest" else -1.0
    for strategy, value, k in (("top_k", frac, int(frac * len(v))), ("top_k_abs", float(k_abs), k_abs)):
        kept = kept_ids(select_groups(s, strategy, value, keep=keep, include_zero=include_zero))
        if not cand:
            assert kept == []
            continue
        assert len(kept) == max(1, min(k, len(cand)))
        unkept = [i for i in cand if i not in kept]
        if unkept:
            assert min(sign * v[i] for i in kept) >= max(sign * v[j] for j in unkept)
        for i in kept:  # a tied unkept candidate always has a higher index
            assert all(j > i for j in unkept if v[j] == v[i])


@PROPS
@given(score_vectors(), st.floats(0.05, 1.5), st.booleans(), st.sampled_from(KEEP_MODES))
def test_min_p_keeps_candidates_within_ratio(s, rho, include_zero, keep):
    v = s.tolist()
    cand = candidates(v, include_zero)
    kept = kept_ids(select_groups(s, "min_p", rho, keep=keep, include_zero=include_zero))
    if not cand:
        assert kept == []
    elif keep == "largest":
        top = max(v[i] for i in cand)
        assert kept == [i for i in cand if v[i] >= rho * top - 1e-10]  # empty e.g. for max < 0, rho < 1
    else:
        low = min(v[i] for i in cand)
        assert kept == [i for i in cand if v[i] <= low / (rho + 1e-10) + 1e-10]


def test_min_p_hand_computed():
    s = torch.tensor([4.0, 1.0, 0.0, 3.0, 2.0])
    assert kept_ids(select_groups(s, "min_p", 0.5)) == [0, 3, 4]  # >= 2
    assert kept_ids(select_groups(s, "min_p", 0.4, keep="smallest")) == [1, 4]  # <= 1 / .4 = 2.5
    # the released tolerance is not symmetric: 1 / (.5 + 1e-10) + 1e-10 < 2, so 2 itself is out
    assert kept_ids(select_groups(s, "min_p", 0.5, keep="smallest")) == [1]
    assert kept_ids(select_groups(-s, "min_p", 0.5)) == []  # max -1 < .5 * -1: nothing (as released)


@PROPS
@given(st.lists(st.floats(-10, 10, width=32), min_size=1, max_size=40, unique=True), st.floats(0.01, 1.5), st.data())
def test_smallest_mirrors_largest_on_negated_scores(vals, value, data):
    s = torch.tensor(vals, dtype=data.draw(st.sampled_from([torch.float32, torch.float64])))
    for strategy, mode in (("top_k", "linear"), ("top_k_abs", "linear"), ("top_p", "softmax")):
        v = value if strategy != "top_k_abs" else float(data.draw(st.integers(1, 45)))
        small = select_groups(s, strategy, v, mode, "smallest", include_zero=True)
        assert torch.equal(small, select_groups(-s, strategy, v, mode, "largest", include_zero=True))


@pytest.mark.parametrize("value", [0.5, 1.0, 2.0])
def test_linear_top_p_smallest_raises(value):
    with pytest.raises(ValueError, match="smallest.*softmax"):
        select_groups(torch.tensor([1.0, 2.0]), "top_p", value, "linear", "smallest")


@PROPS
@given(score_vectors(), st.floats(0.01, 0.99), st.booleans(), st.sampled_from(KEEP_MODES))
def test_softmax_top_p_shortest_probability_prefix(s, rho, include_zero, keep):
    v = s.tolist()
    cand = candidates(v, include_zero)
    kept = kept_ids(select_groups(s, "top_p", rho, "softmax", keep, include_zero=include_zero))
    if not cand:
        assert kept == []
        return
    logits = torch.tensor([v[i] for i in cand], dtype=torch.float64)
    p = torch.softmax(logits if keep == "largest" else -logits, dim=0).tolist()
    order = sorted(range(len(cand)), key=lambda j: (-p[j], j))
    cum, k = 0.0, len(cand)
    for n, j in enumerate(order, start=1):
        cum += p[j]
        if cum >= rho:
            k = n
            break
    assert len(kept) >= 1
    assert kept == sorted(cand[j] for j in order[:k])


def test_softmax_top_p_hand_computed():
    s = torch.tensor([4.0, 1.0, 0.0, 3.0])
    # candidates g0, g1, g3: p ~ e^4, e^1, e^3 / 77.40 = .7054, .0351, .2595; cumsum .7054, .9649
    assert kept_ids(select_groups(s, "top_p", 0.9, "softmax")) == [0, 3]
    assert kept_ids(select_groups(s, "top_p", 0.7, "softmax")) == [0]
    assert kept_ids(select_groups(s, "top_p", 0.97, "softmax")) == [0, 1, 3]  # .9649 < .97
    # smallest: softmax(-s) over g0, g1, g3 puts .8668 on g1, .1173 on g3 -> .9841 >= .9
    assert kept_ids(select_groups(s, "top_p", 0.9, "softmax", "smallest")) == [1, 3]
    # cumsum exactly at value: [.25, .5, ...] reaches .5 at the 2nd group (searchsorted left + 1)
    assert kept_ids(select_groups(torch.ones(4), "top_p", 0.5, "softmax")) == [0, 1]


def test_top_k_hand_computed():
    s = torch.tensor([4.0, 1.0, 0.0, 3.0, 3.0])
    assert kept_ids(select_groups(s, "top_k", 0.4)) == [0, 3]  # int(.4 * 5) = 2; tie 3/3 -> g3
    assert kept_ids(select_groups(s, "top_k", 0.1)) == [0]  # int(.5) = 0 -> clamped to 1
    assert kept_ids(select_groups(s, "top_k", 1.0)) == [0, 1, 3, 4]  # 5 clamped to 4 candidates
    assert kept_ids(select_groups(s, "top_k_abs", 2, keep="smallest")) == [1, 3]
    assert kept_ids(select_groups(s, "top_k_abs", 2, keep="smallest", include_zero=True)) == [1, 2]


def test_selection_argument_errors_and_edge_inputs():
    s = torch.tensor([1.0, 2.0])
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="value"):
            select_groups(s, value=bad)
    for name, bad in (("strategy", "top_q"), ("top_p_mode", "exp"), ("keep", "big")):
        with pytest.raises(ValueError, match=name):
            select_groups(s, **{name: bad})
    with pytest.raises(ValueError, match="finite"):
        select_groups(torch.tensor([1.0, NAN]))
    with pytest.raises(ValueError, match="scores"):
        select_groups(s.view(1, 2))
    assert select_groups(torch.zeros(3)).tolist() == [False] * 3  # no candidate
    # zero test is |score| <= 1e-10 on the exact value: 1e-10 itself is zero, fp32(1e-10) ~ 1.00000001e-10 is not
    near = torch.tensor([1e-10, -1e-10, 2e-10, 1.0], dtype=torch.float64)
    assert kept_ids(select_groups(near, "top_p", 1.0)) == [2, 3]
    assert kept_ids(select_groups(near.float(), "top_p", 1.0)) == [0, 1, 2, 3]
    assert selection_metrics(near, select_groups(near, "top_p", 1.0))["zero_score_groups"] == 2.0
    assert selection_metrics(near.float(), select_groups(near.float(), "top_p", 1.0))["zero_score_groups"] == 0.0
    assert select_groups(torch.empty(0)).shape == (0,)
    # fp32 and fp64 inputs select identically
    s32 = torch.tensor([0.5, 0.25, 2.0, 1.0, 0.0])
    for strategy, mode, keep in COMBOS:
        assert torch.equal(
            select_groups(s32, strategy, 0.6, mode, keep), select_groups(s32.double(), strategy, 0.6, mode, keep)
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_select_groups_on_cuda_matches_cpu():
    torch.manual_seed(0)
    s = torch.rand(256).round(decimals=2)
    for strategy, mode, keep in COMBOS:
        gpu = select_groups(s.cuda(), strategy, 0.7, mode, keep)
        assert gpu.device.type == "cuda"
        assert torch.equal(gpu.cpu(), select_groups(s, strategy, 0.7, mode, keep))


# ---------------------------------------------------------------- loss scale and telemetry


def test_filter_loss_scale():
    assert filter_loss_scale(3, 8, "none") == 1.0
    assert filter_loss_scale(3, 8, "linear") == 0.375
    assert filter_loss_scale(3, 8, "sqrt") == pytest.approx(math.sqrt(0.375))
    assert filter_loss_scale(0, 8, "sqrt") == 0.0
    assert filter_loss_scale(8, 8, "linear") == 1.0
    with pytest.raises(ValueError, match="mode"):
        filter_loss_scale(3, 8, "log")
    for kept, total in ((3, 0), (9, 8), (-1, 8)):
        with pytest.raises(ValueError):
            filter_loss_scale(kept, total, "linear")


def test_selection_metrics():
    s = torch.tensor([4.0, 1.0, 0.0, 3.0])
    m = selection_metrics(s, torch.tensor([True, False, False, True]))
    assert m == {
        "kept_groups": 2.0,
        "kept_ratio": 0.5,
        "zero_score_groups": 1.0,
        "empty": 0.0,
        "score_mean": 2.0,
        "score_max": 4.0,
        "kept_score_mean": 3.5,
        "kept_score_max": 4.0,
    }
    m = selection_metrics(s, torch.zeros(4, dtype=torch.bool))
    assert m == {
        "kept_groups": 0.0,
        "kept_ratio": 0.0,
        "zero_score_groups": 1.0,
        "empty": 1.0,
        "score_mean": 2.0,
        "score_max": 4.0,
    }
    assert not any(math.isnan(x) for x in m.values())
    with pytest.raises(ValueError):
        selection_metrics(s, torch.ones(3, dtype=torch.bool))
