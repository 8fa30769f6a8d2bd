"""bench/token_budget.py's accounting against hand computations: the length percentiles, the equal-memory budget,
the ratios, and -- through the real trainer on the tiny model -- the padded / real tokens of TRL's fixed
micro-batches and of the token-budget chunks on a hand-made length list.

Hand computation (prompt 2 tokens, completion lengths [10, 1, 1, 1, 2, 9, 3, 1], TRL micro-batches of 2 rows):
TRL pads every row to the batch's longest completion, 8 x (2 + 10) = 96 tokens, of which 8 x 2 + 28 = 44 are real
(54 % padding). The equal-memory budget is 2 x (2 + 10) = 24; first-fit decreasing packs {10, 9} (2 x 12 = 24),
{3, 2, 1, 1} (4 x (2 + 3) = 20; a fifth row would cost 25) and {1, 1} (2 x 3 = 6): 50 tokens, 12 % padding.
Half the budget, 12: {10} (12), {9} (11), {3, 2} (10; a 1 would make it 15), {1, 1, 1, 1} (4 x 3 = 12): 45 tokens.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench():
    if str(BENCH) not in sys.path:  # the bench imports its sibling benchlib
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_token_budget", BENCH / "token_budget.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tb = _bench()
LENS, PROMPT, ROWS_PER_MICRO = [10, 1, 1, 1, 2, 9, 3, 1], 2, 2


def test_length_stats_and_equal_memory_budget():
    assert tb.length_stats(list(range(1, 101))) == {"p50": 50.5, "p99": 99, "max": 100}
    assert tb.length_stats([3, 1, 2]) == {"p50": 2, "p99": 3, "max": 3}
    assert tb.equal_memory_budget(ROWS_PER_MICRO, PROMPT, max(LENS)) == 24
    assert tb.equal_memory_budget(4, 16, 84) == 400


def test_compare_ratios():
    fixed = {"seconds": 4.0, "peak_rss_mb": 200.0, "padded_tokens": 72.0, "real_tokens": 36.0}
    budgeted = {"seconds": 1.0, "peak_rss_mb": 50.0, "padded_tokens": 40.0, "real_tokens": 36.0}
    assert tb.padding_share(fixed) == pytest.approx(0.5)
    assert tb.compare(fixed, budgeted) == pytest.approx(
        {"time_ratio": 0.25, "padding_share": 0.1, "peak_memory_ratio": 0.25})


def test_fixed_parts_keep_the_batch_width():
    inputs = tb.synthetic_inputs(LENS, PROMPT)
    parts = tb.fixed_parts(inputs, ROWS_PER_MICRO)
    assert [p["completion_ids"].shape for p in parts] == [(2, 10)] * 4
    assert [int(p["completion_mask"].sum()) for p in parts] == [11, 2, 11, 4]
    assert all(int(p["num_items_in_batch"]) == sum(LENS) for p in parts)


@pytest.mark.parametrize(("budget", "padded"), [(None, 96), (24, 50), (12, 45)])
def test_measured_tokens_match_the_hand_count(budget, padded):
    trainer = tb.synthetic_trainer(len(LENS), max(LENS), budget)
    inputs = tb.synthetic_inputs(LENS, PROMPT)
    for pass_ in tb.PASSES:
        run = tb.measure(trainer, inputs, pass_, ROWS_PER_MICRO, budget, reps=1)
        assert (run["padded_tokens"], run["real_tokens"]) == (padded, 44), pass_
        assert tb.padding_share(run) == pytest.approx(1 - 44 / padded)
