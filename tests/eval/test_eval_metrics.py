"""Evaluation metrics and reports: pass@k, Mean@k, answer dispersion W, summaries, tables and plots."""

import itertools
import json
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.eval.metrics import dispersion_split, dispersion_W, mean_at_k, pass_at_k, summarize
from trainer.eval.report import _series, markdown_table, plot_benchmarks, plot_training_curves, read_run_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 4) == 1.0  # only 3 wrong samples: every 4-subset has a correct one
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(32, 1, 32) == 1.0
    assert pass_at_k(32, 1, 1) == pytest.approx(1 / 32)


def test_pass_at_k_stable_for_large_n():
    n, c, k = 2000, 7, 1000
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(10_000, 3, 10) == pytest.approx(1 - math.comb(9997, 10) / math.comb(10_000, 10), rel=1e-12)


@pytest.mark.parametrize("n,c,k", [(5, 2, 6), (5, 2, 0), (5, 6, 1), (5, -1, 1), (0, 0, 1), (5, 2, 1.5)])
def test_pass_at_k_rejects_undefined(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


@st.composite
def nck(draw, max_n=9):
    n = draw(st.integers(1, max_n))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@settings(max_examples=150, deadline=None)
@given(nck())
def test_pass_at_k_matches_subset_enumeration(args):
    n, c, k = args
    samples = [1] * c + [0] * (n - c)  # which samples are correct does not matter
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(any(samples[i] for i in s) for s in subsets)
    assert pass_at_k(n, c, k) == pytest.approx(hits / len(subsets), abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(nck(max_n=60))
def test_pass_at_k_monotone_and_pass1_is_accuracy(args):
    n, c, k = args
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    if k < n:
        assert pass_at_k(n, c, k + 1) >= value - 1e-12
    if c < n:
        assert pass_at_k(n, c + 1, k) >= value - 1e-12


# ----------------------------------------------------------------------------------------------- Mean@k


def test_mean_at_k_hand_case():
    # per-question means 0.5, 0.25, 1.0 -> 1.75 / 3; NOT the pooled mean over all 9 samples (5/9)
    assert mean_at_k([[1, 0, 1, 0], [0, 0, 0, 1], [1]]) == pytest.approx(1.75 / 3)
    assert mean_at_k([[1.0] * 12, [0.0] * 12]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mean_at_k([])
    with pytest.raises(ValueError):
        mean_at_k([[1.0], []])


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 6), st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=6, max_size=6), min_size=1, max_size=8)
)
def test_mean_at_k_equal_sizes_is_pooled_mean(k, rows):
    rows = [r[:k] for r in rows]
    flat = [x for r in rows for x in r]
    assert mean_at_k(rows) == pytest.approx(sum(flat) / len(flat))


# ----------------------------------------------------------------------------------------------- W


def test_dispersion_W_constructed_example():
    answers = ["5", " 5 ", "7", "", "   ", "42", "42", "8\n", "7"]
    correct = [0, 0, 0, 0, 0, 1, 1, 0, 0.0]
    # incorrect non-empty stripped strings: {"5", "7", "8"}; blanks and the correct "42"s do not count
    assert dispersion_W(answers, correct) == 3
    assert dispersion_W(["1", "2"], [1, 1]) == 0
    assert dispersion_W(["", "  ", "\t"], [0, 0, 0]) == 0
    assert dispersion_W([], []) == 0
    with pytest.raises(ValueError):
        dispersion_W(["1"], [0, 0])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["", " ", "1", "2", " 2", "x", "x "]), st.sampled_from([0, 1])), max_size=20)
)
def test_dispersion_W_properties(pairs):
    answers = [a for a, _ in pairs]
    correct = [c for _, c in pairs]
    w = dispersion_W(answers, correct)
    assert 0 <= w <= correct.count(0)
    assert dispersion_W(answers[::-1], correct[::-1]) == w
    assert dispersion_W([f"  {a}\n" for a in answers], correct) == w


# ----------------------------------------------------------------------------------------------- split


def _recs(system, bench, qid, correct, answers):
    return [
        {"system": system, "benchmark": bench, "id": qid, "sample": i, "correct": c, "answer": a}
        for i, (c, a) in enumerate(zip(correct, answers))
    ]


def _split_records():
    r = []
    # q1: A 3/3, B 2/3 -> Q>=2.  W_A = 0, W_B = 1
    r += _recs("A", "X", 1, [1, 1, 1], ["5", "5", "5"]) + _recs("B", "X", 1, [1, 1, 0], ["5", "5", " 9 "])
    # q2: A 2/3 (wrong answer blank), B 2/3 -> Q>=2 (2 == threshold counts).  W_A = 0, W_B = 1
    r += _recs("A", "X", 2, [1, 1, 0], ["3", "3", ""]) + _recs("B", "X", 2, [1, 1, 0], ["3", "3", "4"])
    # q3: A 0/3, B 1/3 -> Q<2.  W_A = |{1, 2}| = 2, W_B = |{6}| = 1
    r += _recs("A", "X", 3, [0, 0, 0], ["1", "2", "2 "]) + _recs("B", "X", 3, [1, 0, 0], ["5", "6", "6"])
    # q4: A 2/3, B 0/3 -> mixed, in neither subset
    r += _recs("A", "X", 4, [1, 1, 0], ["7", "7", "z"]) + _recs("B", "X", 4, [0, 0, 0], ["a", "b", "c"])
    # q5: only A has it -> excluded (would otherwise be in Q>=2 and change W_ge for A)
    r += _recs("A", "X", 5, [1, 1, 0], ["1", "1", "x"])
    # same id as q1 but another benchmark, only in B -> excluded, must not merge with X/1
    r += _recs("B", "Y", 1, [0, 0, 0], ["p", "q", "r"])
    return r


def test_dispersion_split_two_systems():
    out = dispersion_split(_split_records(), ["A", "B"], threshold=2)
    assert (out["n_ge"], out["n_lt"], out["n_mixed"], out["n_incomplete"]) == (2, 1, 1, 2)
    assert out["W_ge"] == {"A": 0.0, "B": 1.0}
    assert out["W_lt"] == {"A": 2.0, "B": 1.0}
    json.dumps(out)


def test_dispersion_split_single_system_and_defaults():
    out = dispersion_split(_split_records(), ["A"], threshold=2)
    # A alone: Q>=2 = {q1, q2, q4, q5} with W 0, 0, 1, 1; Q<2 = {q3}
    assert (out["n_ge"], out["n_lt"], out["n_mixed"], out["n_incomplete"]) == (4, 1, 0, 0)
    assert out["W_ge"] == {"A": 0.5} and out["W_lt"] == {"A": 2.0}
    # default threshold 8: nothing reaches 8 correct -> every complete question is in Q<8
    out8 = dispersion_split(_split_records(), None)
    assert out8["systems"] == ["A", "B"]
    assert (out8["n_ge"], out8["n_lt"]) == (0, 4)
    assert out8["W_ge"] == {"A": None, "B": None}
    assert out8["W_lt"]["A"] == pytest.approx((0 + 0 + 2 + 1) / 4)


# ----------------------------------------------------------------------------------------------- summarize


def _summary_records():
    recs = []
    x = {  # benchmark X: 2 questions x 4 samples
        "q1": ([1, 1, 0, 0], [1.0, 2.0, 3.0, 4.0], [10, 10, 10, 10], [10, 20, 30, 40], [False, False, False, True]),
        "q2": ([0, 0, 0, 1], [1.0, 1.0, 1.0, 1.0], [5, 5, 5, 5], [5, 5, 5, 5], [False] * 4),
    }
    for qid, (corr, esum, etok, length, trunc) in x.items():
        for i in range(4):
            recs.append(
                {"system": "S", "benchmark": "X", "id": qid, "sample": i, "correct": float(corr[i]),
                 "answer": "a", "length": length[i], "truncated": trunc[i],
                 "entropy_sum": esum[i], "entropy_tokens": etok[i]}
            )
    for qid, corr, length in [(0, 1, 100), (1, 0, 200), (2, 1, 300)]:  # benchmark Y: Mean@1, no entropy
        recs.append({"system": "S", "benchmark": "Y", "id": qid, "sample": 0, "correct": float(corr),
                     "answer": "", "length": length, "truncated": False})
    return recs


def test_summarize_hand_numbers():
    out = summarize(_summary_records())
    assert out["benchmarks"] == ["X", "Y"]
    s = out["systems"]["S"]
    x, y = s["benchmarks"]["X"], s["benchmarks"]["Y"]
    assert x["n_questions"] == 2 and x["n_samples"] == 8
    assert x["samples_per_question"] == {"min": 4, "max": 4}
    assert x["mean"] == pytest.approx(0.375) and x["mean@4"] == pytest.approx(0.375)
    assert x["pass@1"] == pytest.approx(0.375)
    assert x["pass@4"] == pytest.approx(1.0)
    assert x["entropy"] == pytest.approx(14 / 60)  # token mean, not the per-sequence mean 0.225
    assert x["n_entropy_samples"] == 8
    assert x["mean_length"] == pytest.approx(15.0)
    assert x["truncation_rate"] == pytest.approx(0.125)
    assert y["mean@1"] == pytest.approx(2 / 3) and y["pass@1"] == pytest.approx(2 / 3)
    assert y["entropy"] is None and y["n_entropy_samples"] == 0
    assert y["mean_length"] == pytest.approx(200.0) and y["truncation_rate"] == 0.0
    assert s["avg"] == pytest.approx((0.375 + 2 / 3) / 2)
    assert s["n_benchmarks"] == 2
    json.loads(json.dumps(out))


def test_summarize_k_pass_and_varying_counts():
    out = summarize(_summary_records(), k_pass=2)
    x, y = out["systems"]["S"]["benchmarks"]["X"], out["systems"]["S"]["benchmarks"]["Y"]
    assert x["pass@2"] == pytest.approx((5 / 6 + 1 / 2) / 2)  # q1: 1 - C(2,2)/C(4,2); q2: 1 - C(3,2)/C(4,2)
    assert "pass@4" not in x and "pass@2" not in y  # Y has 1 sample per question: pass@2 undefined
    assert "pass@5" not in summarize(_summary_records(), k_pass=5)["systems"]["S"]["benchmarks"]["X"]

    recs = _recs("T", "Z", "a", [1, 0], ["1", "2"]) + _recs("T", "Z", "b", [0, 0, 1], ["", "", "3"])
    z = summarize(recs)["systems"]["T"]["benchmarks"]["Z"]
    assert z["samples_per_question"] == {"min": 2, "max": 3}
    assert z["mean@2-3"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert z["pass@2"] == pytest.approx((1.0 + (1 - 1 / 3)) / 2)  # b: 1 - C(2,2)/C(3,2)
    assert z["mean_length"] is None and z["truncation_rate"] is None


def test_summarize_rejects_duplicates_and_missing_keys():
    recs = _summary_records()
    with pytest.raises(ValueError):
        summarize(recs + [dict(recs[0])])
    bad = dict(recs[0])
    del bad["correct"]
    with pytest.raises(KeyError):
        summarize([bad])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=3, max_size=3), min_size=1, max_size=6))
def test_summarize_pass1_equals_mean_for_binary(rows):
    recs = [r for qid, row in enumerate(rows) for r in _recs("S", "B", qid, row, ["x"] * 3)]
    b = summarize(recs)["systems"]["S"]["benchmarks"]["B"]
    assert b["pass@1"] == pytest.approx(b["mean"])
    assert b["pass@3"] == pytest.approx(sum(any(r) for r in rows) / len(rows))
    assert b["pass@3"] >= b["pass@1"] - 1e-12


# ----------------------------------------------------------------------------------------------- report


def _hand_summary():
    def bench(v, ent=None):
        return {"mean": v, "mean@32": v, "pass@1": v, "entropy": ent}

    return {
        "benchmarks": ["AIME24", "AMC23"],
        "systems": {
            "GRPO": {"avg": 0.5, "benchmarks": {"AIME24": bench(0.30, 0.05), "AMC23": bench(0.70, 0.04)}},
            "Dropout": {"avg": 0.525, "benchmarks": {"AIME24": bench(0.40, 0.2), "AMC23": bench(0.65, 0.3)}},
        },
    }


def test_markdown_table_layout_and_bold():
    table = markdown_table(_hand_summary())
    assert table.splitlines() == [
        "| System | AIME24 | AMC23 | Avg. |",
        "|---|---:|---:|---:|",
        "| GRPO | 30.00 | **70.00** | 50.00 |",
        "| Dropout | **40.00** | 65.00 | **52.50** |",
    ]
    sub = markdown_table(_hand_summary(), benchmarks=["AMC23"], digits=1).splitlines()
    assert sub[2] == "| GRPO | **70.0** | **70.0** |" and sub[3] == "| Dropout | 65.0 | 65.0 |"
    ent = markdown_table(_hand_summary(), metric="entropy", digits=3).splitlines()  # not a %
    assert ent[2] == "| GRPO | 0.050 | 0.040 | 0.045 |"
    assert ent[3] == "| Dropout | **0.200** | **0.300** | **0.250** |"


def test_markdown_table_missing_cell_and_ties():
    summary = _hand_summary()
    del summary["systems"]["GRPO"]["benchmarks"]["AMC23"]
    summary["systems"]["GRPO"]["benchmarks"]["AIME24"]["mean"] = 0.40
    lines = markdown_table(summary).splitlines()
    assert lines[2] == "| GRPO | **40.00** | – | – |"
    assert lines[3] == "| Dropout | **40.00** | **65.00** | **52.50** |"


def test_markdown_table_from_summarize_matches_avg():
    out = summarize(_summary_records())
    row = markdown_table(out).splitlines()[2]
    assert row == "| S | **37.50** | **66.67** | **52.08** |"


def test_plot_benchmarks_writes_png(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    bars = []
    real_bar = Axes.bar

    def spy(self, x, height, *args, **kwargs):
        bars.append((kwargs.get("label"), [float(h) for h in height]))
        return real_bar(self, x, height, *args, **kwargs)

    monkeypatch.setattr(Axes, "bar", spy)
    path = plot_benchmarks(_hand_summary(), tmp_path / "sub" / "bench.png")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    # one bar series per system, one bar per benchmark, in %
    assert bars == [
        ("GRPO", [pytest.approx(30.0), pytest.approx(70.0)]),
        ("Dropout", [pytest.approx(40.0), pytest.approx(65.0)]),
    ]


def test_plot_training_curves_writes_png(tmp_path):
    a, b = tmp_path / "run_a", tmp_path / "run_b"
    a.mkdir()
    b.mkdir()
    (a / "metrics.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [
            {"step": 1, "reward": 0.1, "entropy": 0.5, "stages/kept_ratio": 0.9},
            {"step": 2, "reward": 0.3, "entropy": "nan"},
            {"train_runtime": 12.0},
            {"step": 3, "reward": 0.4, "entropy": 0.4, "stages/kept_ratio": 0.8},
        ]) + "\n\n"
    )
    (b / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.2}) + "\n")
    rows = read_run_metrics(a)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert _series(rows, "entropy") == ([1.0, 3.0], [0.5, 0.4])
    assert _series(rows, "stages/kept_ratio") == ([1.0, 3.0], [0.9, 0.8])
    assert _series(read_run_metrics(b), "entropy") == ([], [])
    path = plot_training_curves(
        [a, b], tmp_path / "curves.png", keys=("reward", "entropy", "stages/kept_ratio", "absent")
    )
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    with pytest.raises(FileNotFoundError):
        plot_training_curves([tmp_path / "nowhere"], tmp_path / "x.png")
