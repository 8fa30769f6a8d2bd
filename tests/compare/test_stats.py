"""The comparison's statistics (trainer/compare/stats.py) on synthetic per-seed numbers whose answer is known."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from trainer.compare import stats


def test_a_constant_shift_gives_an_interval_containing_it():
    rng = np.random.default_rng(0)
    base = rng.normal(0.5, 0.2, 10)
    noisy = base + 0.1 + rng.normal(0.0, 0.02, 10)  # every seed ahead by about 0.1
    ci = stats.paired_difference(noisy, base)
    assert ci.contains(0.1) and not ci.contains(0.0)
    assert ci.estimate == pytest.approx(np.mean(noisy - base), rel=1e-12)
    exact = stats.paired_difference(base + 0.25, base)  # every difference the same: the interval is that value
    assert (exact.low, exact.estimate, exact.high) == pytest.approx((0.25, 0.25, 0.25), abs=1e-12)


def test_identical_arms_give_an_interval_containing_zero():
    rng = np.random.default_rng(1)
    base = rng.normal(0.5, 0.2, 8)
    same = stats.paired_difference(base.copy(), base)
    assert same.contains(0.0) and same.estimate == 0.0
    # arms that differ only by noise: 0 inside, the interval straddles it
    other = base + rng.normal(0.0, 0.05, 8)
    ci = stats.paired_difference(other, base)
    assert ci.low < 0.0 < ci.high


def test_pairing_cancels_the_seed_effect():
    rng = np.random.default_rng(2)
    seed_effect = rng.normal(0.0, 1.0, 10)  # large, shared by both arms of a seed
    base, arm = seed_effect, seed_effect + 0.3 + rng.normal(0.0, 0.05, 10)
    paired = stats.paired_difference(arm, base)
    assert paired.low > 0.2 and paired.high < 0.4  # the 1.0 seed spread does not widen it
    unpaired = scipy_stats.bootstrap((arm, base), lambda a, b: a.mean() - b.mean(), rng=np.random.default_rng(0))
    assert unpaired.confidence_interval.high - unpaired.confidence_interval.low > 5 * (paired.high - paired.low)


def test_interval_coverage_is_near_95_percent():
    rng = np.random.default_rng(3)
    true_shift, hits, draws = 0.2, 0, 300
    for i in range(draws):
        base = rng.normal(0.0, 1.0, 30)
        arm = base + true_shift + rng.normal(0.0, 0.5, 30)
        hits += stats.paired_difference(arm, base, n_resamples=2000, seed=i).contains(true_shift)
    # 300 draws: the standard error of a 95 % coverage is 1.3 points; BCa at 30 seeds covers about 94 %
    assert 0.91 <= hits / draws <= 0.98


def test_one_seed_claims_no_interval():
    ci = stats.paired_difference(np.array([0.7]), np.array([0.5]))
    assert ci.estimate == pytest.approx(0.2) and np.isnan(ci.low) and np.isnan(ci.high)


def test_iqm_and_probability_of_improvement_by_hand():
    # trim_mean 25 % of 8 values drops 2 from each end of -50, 1, 2, 3, 4, 5, 6, 100: mean of 2, 3, 4, 5
    assert stats.iqm([100, 1, 2, 3, 4, 5, 6, -50]) == pytest.approx(3.5)
    assert stats.iqm([1, 2, 3]) == pytest.approx(2.0)  # fewer than 4: nothing trimmed
    # x > y in 8 of the 9 pairs, one tie (3 vs 3) counted half: 8.5 / 9
    assert stats.probability_of_improvement([3, 4, 5], [1, 2, 3]) == pytest.approx(8.5 / 9)
    assert stats.probability_of_improvement([1, 2], [1, 2]) == 0.5
    assert stats.probability_of_improvement([0, 0], [1, 1]) == 0.0


def test_final_value_and_area_under_curve_by_hand():
    assert stats.final_value(np.arange(8.0)) == pytest.approx(6.5)  # the last quarter: 6, 7
    assert stats.area_under_curve([1, 2, 3], [0.0, 1.0, 1.0]) == pytest.approx((0.5 + 1.0) / 2)
    # learning sooner scores higher at the same final value
    assert stats.area_under_curve([1, 2, 3, 4], [0, 1, 1, 1]) > stats.area_under_curve([1, 2, 3, 4], [0, 0, 0, 1])
