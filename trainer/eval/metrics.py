"""Evaluation metrics over per-sample records: Mean@k, unbiased pass@k, answer dispersion W, summaries.

A *record* is one sampled response to one question, as a dict::

    {"system": "GRPO", "benchmark": "AIME24", "id": 7, "sample": 3,
     "correct": 1.0, "answer": "42", "length": 913, "truncated": False,
     "entropy_sum": 120.5, "entropy_tokens": 913}        # the two entropy keys are optional

Conventions (GRPODropout §4, B.1-B.2; teacher-methods reference §1.7):

- Mean@k (= Avg@k): accuracy averaged over a question's k samples, then over questions
  (:func:`mean_at_k`). It uses the raw ``correct`` values.
- pass@k: the unbiased estimator of Chen et al. (2021) per question, averaged over questions
  (:func:`pass_at_k`). A sample counts as correct for pass@k, for the correct counts c_{m,q} of the
  dispersion partition and for W when ``correct >= 0.5`` (records carry 0/1 values, so this is exact).
- Token-mean entropy: Σ entropy_sum / Σ entropy_tokens over the samples that carry both keys, i.e.
  averaged over valid response tokens, not per sequence.
- Answer dispersion W (B.2): distinct non-empty stripped answer strings among a question's incorrect
  responses; :func:`dispersion_split` averages it over the cross-system Q_{>=8} / Q_{<8} partition.
- A system's ``avg`` is the unweighted mean of its per-benchmark Mean@k (the papers' "Avg.").

A question is identified by ``(benchmark, id)``, so equal ids in different benchmarks never collide.
Everything returned is plain Python (float / int / str / None / dict / list), hence JSON-serialisable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REQUIRED_KEYS = ("system", "benchmark", "id", "sample", "correct")


def is_correct(value: Any) -> bool:
    """The 0/1 correctness indicator of a record's ``correct`` value (threshold 0.5)."""
    return float(value) >= 0.5


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate 1 - C(n-c, k) / C(n, k) from ``n`` samples of which ``c`` are correct.

    Uses the numerically stable product form 1 - Π_{i=n-c+1}^{n} (1 - k/i) (Chen et al. 2021), which
    never forms a binomial coefficient. Raises ValueError unless 0 <= c <= n and 1 <= k <= n.
    """
    n, c, k = _as_int(n, "n"), _as_int(c, "c"), _as_int(k, "k")
    if n < 1:
        raise ValueError(f"pass@k needs n >= 1 samples, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k is undefined for k={k} with n={n} samples (need 1 <= k <= n)")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return float(1.0 - prod)


def mean_at_k(correct_per_question: Sequence[Sequence[float]]) -> float:
    """Mean@k / Avg@k: mean over questions of the mean correctness over that question's samples."""
    if len(correct_per_question) == 0:
        raise ValueError("mean@k of zero questions is undefined")
    per_q = []
    for i, samples in enumerate(correct_per_question):
        if len(samples) == 0:
            raise ValueError(f"question {i} has no samples")
        per_q.append(math.fsum(float(x) for x in samples) / len(samples))
    return math.fsum(per_q) / len(per_q)


def dispersion_W(answers: Sequence[str], correct: Sequence[float]) -> int:
    """Answer-string dispersion W (GRPODropout B.2): |{strip(a_i) : r_i = 0, strip(a_i) != ""}|."""
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} correctness values")
    wrong = set()
    for answer, corr in zip(answers, correct):
        if is_correct(corr):
            continue
        text = ("" if answer is None else str(answer)).strip()
        if text:
            wrong.add(text)
    return len(wrong)


def group_records(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, dict[Any, list[Mapping]]]]:
    """``{system: {benchmark: {question id: [records sorted by sample]}}}``, insertion-ordered.

    Raises KeyError for a record missing a required key and ValueError for a repeated
    (system, benchmark, id, sample).
    """
    grouped: dict[str, dict[str, dict[Any, list[Mapping]]]] = {}
    seen: set = set()
    for i, rec in enumerate(records):
        missing = [k for k in REQUIRED_KEYS if k not in rec]
        if missing:
            raise KeyError(f"record {i} lacks {missing}: {dict(rec)!r}")
        key = (rec["system"], rec["benchmark"], rec["id"], rec["sample"])
        if key in seen:
            raise ValueError(f"duplicate record for system/benchmark/id/sample {key}")
        seen.add(key)
        grouped.setdefault(rec["system"], {}).setdefault(rec["benchmark"], {}).setdefault(rec["id"], []).append(rec)
    for benches in grouped.values():
        for questions in benches.values():
            for qid, recs in questions.items():
                recs.sort(key=lambda r: r["sample"])
    return grouped


def dispersion_split(
    records: Iterable[Mapping[str, Any]], systems: Sequence[str] | None = None, threshold: int = 8
) -> dict[str, Any]:
    """Mean W per system over the cross-system partition of GRPODropout B.2.

    With c_{m,q} the number of correct samples of system m on question q = (benchmark, id):
    Q_{>=t} = questions where *every* system has c_{m,q} >= t, Q_{<t} = questions where every system
    has c_{m,q} < t. Questions with mixed membership, and questions some system in ``systems`` has no
    samples for, are in neither subset. ``systems=None`` means every system in ``records``; records of
    other systems are ignored.

    Returns ``{"threshold", "systems", "n_ge", "n_lt", "n_mixed", "n_incomplete", "W_ge", "W_lt"}``
    where ``W_ge`` / ``W_lt`` map system -> mean W over that subset (None when the subset is empty).
    """
    grouped = group_records(records)
    systems = list(grouped) if systems is None else list(systems)
    if not systems:
        raise ValueError("dispersion_split needs at least one system")
    per_system: dict[str, dict[tuple, list[Mapping]]] = {}
    for system in systems:
        per_system[system] = {
            (bench, qid): recs
            for bench, questions in grouped.get(system, {}).items()
            for qid, recs in questions.items()
        }
    all_questions: list[tuple] = []
    for system in systems:
        for q in per_system[system]:
            if q not in all_questions:
                all_questions.append(q)

    ge, lt, mixed, incomplete = [], [], 0, 0
    for q in all_questions:
        if any(q not in per_system[s] for s in systems):
            incomplete += 1
            continue
        counts = [sum(is_correct(r["correct"]) for r in per_system[s][q]) for s in systems]
        if all(c >= threshold for c in counts):
            ge.append(q)
        elif all(c < threshold for c in counts):
            lt.append(q)
        else:
            mixed += 1

    def mean_w(system: str, subset: list[tuple]) -> float | None:
        if not subset:
            return None
        ws = []
        for q in subset:
            recs = per_system[system][q]
            ws.append(dispersion_W([r.get("answer", "") for r in recs], [r["correct"] for r in recs]))
        return float(sum(ws) / len(ws))

    return {
        "threshold": threshold,
        "systems": systems,
        "n_ge": len(ge),
        "n_lt": len(lt),
        "n_mixed": mixed,
        "n_incomplete": incomplete,
        "W_ge": {s: mean_w(s, ge) for s in systems},
        "W_lt": {s: mean_w(s, lt) for s in systems},
    }


def summarize(records: Iterable[Mapping[str, Any]], k_pass: int | None = None) -> dict[str, Any]:
    """Per (system, benchmark) metrics and each system's unweighted benchmark average.

    Returns::

        {"benchmarks": [benchmark, ...],             # order of first appearance
         "systems": {system: {
             "avg": float,                          # unweighted mean of the benchmarks' "mean"
             "n_benchmarks": int,
             "benchmarks": {benchmark: {
                 "n_questions", "n_samples", "samples_per_question": {"min", "max"},
                 "mean", "mean@K",                    # Mean@K; K = the observed sample count ("mean@8-12" if varies)
                 "pass@1", "pass@K'",                 # K' = k_pass or the (minimum) sample count; only when K' <= min
                 "entropy",                           # Σ entropy_sum / Σ entropy_tokens, None when absent
                 "n_entropy_samples", "mean_length", "truncation_rate"}}}}}

    ``mean_length`` / ``truncation_rate`` are None when no record carries ``length`` / ``truncated``.
    """
    grouped = group_records(records)
    if k_pass is not None:
        k_pass = _as_int(k_pass, "k_pass")
        if k_pass < 1:
            raise ValueError(f"k_pass must be >= 1, got {k_pass}")
    benchmarks: list[str] = []
    systems: dict[str, Any] = {}
    for system, benches in grouped.items():
        out: dict[str, Any] = {}
        for bench, questions in benches.items():
            if bench not in benchmarks:
                benchmarks.append(bench)
            out[bench] = _summarize_benchmark(list(questions.values()), k_pass)
        means = [b["mean"] for b in out.values()]
        systems[system] = {
            "avg": math.fsum(means) / len(means),
            "n_benchmarks": len(out),
            "benchmarks": out,
        }
    return {"benchmarks": benchmarks, "systems": systems}


def _summarize_benchmark(questions: list[list[Mapping[str, Any]]], k_pass: int | None) -> dict[str, Any]:
    sizes = [len(q) for q in questions]
    kmin, kmax = min(sizes), max(sizes)
    samples = [r for q in questions for r in q]
    mean = mean_at_k([[float(r["correct"]) for r in q] for q in questions])
    res: dict[str, Any] = {
        "n_questions": len(questions),
        "n_samples": len(samples),
        "samples_per_question": {"min": kmin, "max": kmax},
        "mean": mean,
        (f"mean@{kmax}" if kmin == kmax else f"mean@{kmin}-{kmax}"): mean,
    }
    counts = [sum(is_correct(r["correct"]) for r in q) for q in questions]
    for k in sorted({1, k_pass if k_pass is not None else kmin}):
        if k <= kmin:
            res[f"pass@{k}"] = math.fsum(pass_at_k(n, c, k) for n, c in zip(sizes, counts)) / len(questions)

    ent = [r for r in samples if r.get("entropy_sum") is not None and r.get("entropy_tokens") is not None]
    tokens = sum(int(r["entropy_tokens"]) for r in ent)
    res["entropy"] = math.fsum(float(r["entropy_sum"]) for r in ent) / tokens if tokens > 0 else None
    res["n_entropy_samples"] = len(ent)
    lengths = [float(r["length"]) for r in samples if r.get("length") is not None]
    res["mean_length"] = math.fsum(lengths) / len(lengths) if lengths else None
    trunc = [bool(r["truncated"]) for r in samples if r.get("truncated") is not None]
    res["truncation_rate"] = sum(trunc) / len(trunc) if trunc else None
    return res


def _as_int(value: Any, name: str) -> int:
    """``value`` as an int; integral floats/numpy ints are accepted, anything else is a ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        as_int = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if as_int != value:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return as_int
