"""The statistics of a comparison: pure functions of per-seed numbers.

The definitions are rliable's (Agarwal et al., "Deep RL at the Edge of the Statistical Precipice", NeurIPS 2021;
google-research/rliable@v1.2.0:rliable/metrics.py): IQM is the 25 % trimmed mean, the probability of improvement is
the Mann-Whitney U statistic over n x m (0.5 for identical samples). They are computed with SciPy, which rliable
itself calls for them: rliable would add arch, pandas, seaborn and absl for its bootstrap and plots, and SciPy's
``stats.bootstrap`` gives the paired interval directly (BCa). The pairing is ours: arms run on the same seeds, so the
interval is of the mean per-seed difference, which cancels what a seed does to both arms (data order, sampling).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    """A point estimate and its two-sided interval at ``confidence``."""

    estimate: float
    low: float
    high: float
    confidence: float = 0.95

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in [low, high]."""
        return self.low <= value <= self.high


def final_value(values: np.ndarray, fraction: float = 0.25) -> float:
    """Mean over the last ``fraction`` of a curve's points (at least one): a final value less noisy than the last
    point (the demo's learning check uses the same last quarter)."""
    values = np.asarray(values, dtype=float)
    tail = max(1, int(round(len(values) * fraction)))
    return float(np.mean(values[-tail:]))


def area_under_curve(x: np.ndarray, y: np.ndarray) -> float:
    """Trapezoid area under ``y(x)`` divided by the span of ``x``: the curve's mean height, comparable between runs
    of the same length (a method that learns sooner scores higher)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or x[-1] == x[0]:
        return float(y.mean())
    return float(np.trapezoid(y, x) / (x[-1] - x[0]))


def iqm(values: np.ndarray) -> float:
    """Interquartile mean (rliable's ``aggregate_iqm``): the mean of the middle 50 %; with fewer than 4 values
    nothing is trimmed and it is the mean."""
    return float(stats.trim_mean(np.asarray(values, dtype=float), proportiontocut=0.25, axis=None))


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) for a random run of each arm, ties counted half (rliable's ``probability_of_improvement``)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.array_equal(x, y):
        return 0.5
    return float(stats.mannwhitneyu(x, y, alternative="greater").statistic / (len(x) * len(y)))


def paired_difference(arm: np.ndarray, baseline: np.ndarray, confidence: float = 0.95, n_resamples: int = 10_000,
                      seed: int = 0) -> Interval:
    """Mean of the per-seed differences ``arm[s] - baseline[s]`` and its bootstrap interval (BCa, SciPy). With
    every difference equal the interval is that value; with one seed it is that difference, unbounded in neither
    direction it cannot know (low = high = the difference is not claimed: NaN bounds)."""
    d = np.asarray(arm, dtype=float) - np.asarray(baseline, dtype=float)
    if d.ndim != 1 or len(d) == 0:
        raise ValueError("paired_difference needs two equal-length 1-D arrays of per-seed values")
    mean = float(d.mean())
    if len(d) == 1:
        return Interval(mean, float("nan"), float("nan"), confidence)
    if np.all(d == d[0]):
        return Interval(mean, mean, mean, confidence)
    with warnings.catch_warnings():
        # BCa's acceleration is undefined for some tiny samples: SciPy warns and returns NaN, then the percentile
        # interval (no acceleration) is used.
        warnings.simplefilter("ignore")
        res = stats.bootstrap((d,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                              method="BCa", rng=np.random.default_rng(seed))
        low, high = res.confidence_interval
        if not (np.isfinite(low) and np.isfinite(high)):
            res = stats.bootstrap((d,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                                  method="percentile", rng=np.random.default_rng(seed))
            low, high = res.confidence_interval
    return Interval(mean, float(low), float(high), confidence)
