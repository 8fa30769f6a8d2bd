"""Fuzz every text-scoring reward function with the seeded hostile corpus (tests/hostile_outputs.py).

Every reward in ``rewards.available()`` except ``env_return`` / ``env_success`` (they read the rollout's
extras, not the text; :func:`test_env_rewards_missing_and_garbage_extras` covers them) is called the way TRL
calls it -- ``f(prompts=..., completions=..., completion_ids=..., answer=..., trainer_state=...,
log_extra=..., log_metric=...)`` -- on these corpora (every one covers every class of :data:`CLASSES`):

- ``hostile``: ``hostile_outputs(n, seed)`` as generated (Sokoban-style move names) -- every text reward;
- ``math_names`` / ``countdown_names``: the same generator with math answers (``\\boxed{42}``, ``Answer: 42``,
  ...) or Countdown equations as the "move names", so the hostile shapes wrap answers that the math /
  countdown extractors actually find;
- ``views``: each hostile text pushed into an answer slot -- ``\\boxed{<text>}``, an ``Answer: <text>`` line or
  ``<answer><text></answer>`` (think tags in the text defused, so the payload reaches Math-Verify / the
  countdown parser instead of being cut off by ``strip_think``);
- ``edge``: hand-written cases, including regressions (see :data:`EDGE_CASES`).

Two passes per (reward, corpus): pass A in batches of :data:`BATCH` (alternately plain strings and chat
message lists, as TRL passes text and conversational datasets), pass B one completion per call in the other
format. Checked on every call:

- no exception; one score per completion; each a finite ``float`` (no reward here documents None) and one of
  the values the reward's docstring allows (``overlong_penalty``: exactly DAPO's formula of ``len(ids)``);
- no hang: math rewards (``math_accuracy``, ``dapo_accuracy``, built with ``timeout=MATH_TIMEOUT``) finish a
  call within ``verified_items * timeout`` (+ a worker start-up allowance per item that hit the limit and a
  small slack) and a single item within ``timeout + ITEM_SLACK``; the other rewards within generous bounds
  (:data:`TEXT_ITEM_BOUND` per item, :data:`TEXT_CALL_BOUND` per call);
- deterministic: pass B gives every item the same score as pass A (so also batch vs single and plain vs
  chat), except items that hit the math time limit in either pass (a time-out scores as wrong by contract,
  and a case near the limit may land either side on a loaded machine); their number is printed.

Items "at the time limit" are those whose verifier result was None (time-out or dead worker; every gold here
parses), seen by wrapping ``rewards.math.verify_batch``. The verifier worker is warmed (untimed) before each
timed math call, so a time includes the kill and replacement of an overrunning worker but not the start-up
a previous call's kill left pending.

A summary table (texts, calls, exceptions, items at the time limit with their classes, worst seconds per
item and per call) is printed at the end of the module (run with ``-s``); times are recorded, never asserted
beyond the bounds above. Sizes (:data:`CI_SIZES`, :data:`SLOW_SIZES`): the default run puts 2,000 hostile
texts (every class) through every text reward, plus 1,000 math_names / countdown_names texts, 2,000 views
(340 for math_accuracy, none for dapo_accuracy: Math-Verify is the time budget) and the edge cases -- about
45 s on a 2-core box; ``-m slow`` runs 10,000 hostile texts with another seed (5,000 math_names /
countdown_names, 10,000 views, 2,000 for both math rewards) -- about 5 minutes.
"""

from __future__ import annotations

import functools
import importlib
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import pytest
from hostile_outputs import CLASSES, hostile_outputs

import rewards
from rewards import verifier
from rewards.overlong import overlong_penalty_value as overlong_value
from trainer.data.countdown import encode_answer

rmath = importlib.import_module("rewards.math")  # the module (``rewards.math`` the attribute is shadowed)
rformat = importlib.import_module("rewards.format")

CI_TEXTS, CI_SEED = 2_000, 0
SLOW_TEXTS, SLOW_SEED = 10_000, 1
# texts per corpus; "verifier_views" is the views corpus of the math rewards (Math-Verify costs ~30 ms per view
# on this 2-core box, up to the limit for the bombs: the CI run keeps 20 per class, for math_accuracy only)
CI_SIZES = {"hostile": CI_TEXTS, "views": CI_TEXTS, "math_names": 1_000, "countdown_names": 1_000,
            "verifier_views": 340}
SLOW_SIZES = {"hostile": SLOW_TEXTS, "views": SLOW_TEXTS, "math_names": 5_000, "countdown_names": 5_000,
              "verifier_views": 2_000}
BATCH = 64  # completions per reward call in pass A (a GRPO step's worth)

MATH_TIMEOUT = 1.0  # the math rewards' per-item limit (factory option ``timeout``; recipes: reward_timeout)
ITEM_SLACK = 1.0  # on top of the limit for one item: killing the worker, spawning its replacement, a busy box
STARTUP_ALLOWANCE = 20.0  # per worker restart inside one call (the next item waits for the new worker)
CALL_SLACK = 2.0
TEXT_ITEM_BOUND = 1.0  # seconds, the other rewards (observed: milliseconds; 7 MB texts included)
TEXT_CALL_BOUND = 5.0
TOKENIZE_MAX_CHARS = 200_000  # longer texts get a length-consistent stand-in id list (only len() matters)

ENV_REWARDS = ("env_return", "env_success")
TEXT_REWARDS = [name for name in rewards.available() if name not in ENV_REWARDS]

MATH_GOLDS = ("42", "\\frac{1}{2}", "x^2+1")
MATH_NAMES = ("\\boxed{42}", "Answer: 42", "\\boxed{\\frac{1}{2}}", "$\\boxed{x^2+1}$", "\\boxed{0.5}", "\\boxed{41}",
              "The answer is \\boxed{x^{2} + 1}.", "\\fbox{42}")
COUNTDOWN_GOLDS = (
    encode_answer(24, [3, 4, 5, 6], "(3 + 5 - 4) * 6"),
    encode_answer(10, [1, 2, 3, 4], "1 + 2 + 3 + 4"),
    encode_answer(98, [44, 19, 35], None),
)
COUNTDOWN_NAMES = ("(3 + 5 - 4) * 6", "1 + 2 + 3 + 4", "44 + 19 + 35", "3 + 4 + 5 + 6", "6 / (5 - 5) + 3 + 4",
                   "-3 + 4", "3 ** 4 + 5 - 6", "8 / (3 - 8 / 3)", "__import__('os')")

OVERLONG = dict(max_completion_length=1024, overlong_buffer_len=256, overlong_penalty_factor=1.0)

# Hand-written cases. The first ones are regressions: a repetition loop of whole turns made
# answer_format_penalty's lazy fullmatch backtrack quadratically (5.3 s for one 194k-character completion,
# minutes for a batch) before rewards/format.py counted the tags first.
EDGE_CASES: tuple[tuple[str, str], ...] = (
    ("repeated_turns", "<think>a</think><answer>b</answer>" * 5_700 + "x"),
    ("repeated_turns", "<think>" + "a</think><answer>b</answer>" * 7_000 + "x"),
    ("repeated_turns", "<think>a</think><answer>b</answer>" * 5_700),
    ("repeated_turns", "<think>" + "</think>" * 20_000 + "<answer>b" + "</answer>" * 20_000 + "x"),
    ("repeated_turns", "<think>" + "</think> \n" * 15_000 + "<answer>b" + "</answer>  " * 15_000 + "x"),
    ("repeated_turns", " " * 100_000 + "<think>a</think>" + " " * 50_000 + "<answer>b</answer>" + " " * 40_000),
    ("repeated_turns", "<think>a</think><answer>\\boxed{42}</answer>\n" * 4_000),
    ("math_edge", "<think>t</think>\\boxed{" + "9" * 1_999 + "}"),  # just under MAX_PRED_CHARS: parsed
    ("math_edge", "<think>t</think>\\boxed{" + "9" * 2_001 + "}"),  # just over: scored wrong without parsing
    ("math_edge", "<think>t</think>\\boxed{0." + "0" * 1_990 + "1}"),
    ("math_edge", "<think>t</think>\\boxed{\\frac{1}{2}} \\boxed{"),  # last box unbalanced: no answer
    ("math_edge", "<think>t</think>Answer: \\boxed{\\frac{1}{2}}"),
    ("math_edge", "<think>t</think>\\boxed{42\\}"),
    ("math_edge", "<think>t</think>\\boxed{\\\\}"),
    ("math_edge", "<think>t</think>\\boxed{\ud800}"),  # a lone surrogate (TRL never decodes one; JSON path)
    ("math_edge", "\\boxed 42"),
    ("math_edge", "**Answer:** \\frac12"),
    ("countdown_edge", "<think>t</think><answer>" + "(" * 150 + "3" + ")" * 150 + "</answer>"),
    ("countdown_edge", "<think>t</think><answer>" + "1+" * 99 + "1</answer>"),
    ("countdown_edge", "<think>t</think><answer>" + "(" * 99 + "3+4+5+6" + ")" * 99 + "</answer>"),
    ("countdown_edge", "<think>t</think><answer>3 + 4 + 5 + 6\r\n</answer>"),
    ("countdown_edge", "<think>t</think><answer>\u0663 + 4 + 5 + 6</answer>"),
    ("countdown_edge", "<think>t</think><answer>" + "9" * 199 + "</answer>"),
    ("countdown_edge", "<think>t</think><answer>(3 + 5 - 4) * 6</answer><answer>"),
    ("countdown_edge", "<think>t</think><answer>3/(5-5)+4+6</answer>"),
)


def _noop(*args, **kwargs) -> None:
    return None


# --- corpora ---------------------------------------------------------------------------------------------


def _defuse(text: str) -> str:
    """The text with its think tags made inert, so strip_think keeps the answer slot it is put in."""
    return text.replace("<think>", "<th1nk>").replace("</think>", "</th1nk>")


def _view(index: int, text: str) -> str:
    payload = _defuse(text[:1_900])
    kind = index % 3
    if kind == 0:
        return "<think>t</think>\\boxed{" + payload + "}"
    if kind == 1:
        return "<think>t</think>\nAnswer: " + payload.replace("\n", " ")[-250:]
    return "<think>t</think><answer>" + payload[:300] + "</answer>"


@functools.lru_cache(maxsize=None)
def corpus(name: str, n: int, seed: int) -> tuple[tuple[str, str], ...]:
    """``(class, text)`` pairs of the named corpus (module doc)."""
    if name == "hostile":
        return tuple(hostile_outputs(n, seed))
    if name == "math_names":
        return tuple(hostile_outputs(n, seed + 1000, action_names=MATH_NAMES))
    if name == "countdown_names":
        return tuple(hostile_outputs(n, seed + 2000, action_names=COUNTDOWN_NAMES))
    if name == "views":
        return tuple((cls, _view(i, text)) for i, (cls, text) in enumerate(hostile_outputs(n, seed)))
    if name == "edge":
        return EDGE_CASES
    raise KeyError(name)


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from trainer.tools.assets import build_qwen3_tokenizer

    return build_qwen3_tokenizer()


@functools.lru_cache(maxsize=None)
def token_ids(name: str, n: int, seed: int) -> tuple[list[int], ...]:
    """``completion_ids`` per text: the Qwen3 tokenizer's ids (texts up to TOKENIZE_MAX_CHARS of the hostile
    corpus), else a stand-in of one id per 4 UTF-8 bytes (the rewards only take ``len()``)."""
    texts = [text for _, text in corpus(name, n, seed)]
    out: list[list[int] | None] = [None] * len(texts)
    real = [i for i, t in enumerate(texts) if name == "hostile" and len(t) <= TOKENIZE_MAX_CHARS]
    if real:
        encoded = _tokenizer()([texts[i] for i in real], add_special_tokens=False)["input_ids"]
        for i, ids in zip(real, encoded):
            out[i] = list(ids)
    for i, t in enumerate(texts):
        if out[i] is None:
            out[i] = [15] * (len(t.encode("utf-8", "surrogatepass")) // 4)
    return tuple(out)


# --- what each reward must return --------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    options: Callable[[float], dict]  # factory options, given the math time limit
    allowed: frozenset | None  # the scores the docstring allows; None: checked against an oracle instead
    wrong: float | None = None  # the score of a time-out (verifier rewards)
    uses_verifier: bool = False
    golds: tuple = MATH_GOLDS
    corpora: tuple[str, ...] = ("hostile", "math_names", "countdown_names", "views", "edge")
    slow_only: tuple[str, ...] = ()  # corpora left out of the CI run (time budget)


SPECS: dict[str, Spec] = {
    "boxed_format": Spec(lambda t: {}, frozenset({0.0, 1.0})),
    "think_format": Spec(lambda t: {}, frozenset({0.0, 1.0})),
    "answer_format_penalty": Spec(lambda t: {}, frozenset({0.0, -0.1})),
    "countdown": Spec(lambda t: {}, frozenset({0.0, 0.1, 1.0}), golds=COUNTDOWN_GOLDS),
    "ragen_countdown": Spec(lambda t: {}, frozenset({-0.1, 0.0, 0.1, 1.0}), golds=COUNTDOWN_GOLDS),
    "math_accuracy": Spec(lambda t: {"timeout": t}, frozenset({0.0, 1.0}), wrong=0.0, uses_verifier=True,
                          corpora=("hostile", "math_names", "views", "edge")),
    # the GRPODropout authors' whole-text grading: up to two answers per completion go to Math-Verify
    "math_accuracy_full_text": Spec(lambda t: {"timeout": t}, frozenset({0.0, 1.0}), wrong=0.0, uses_verifier=True,
                                    corpora=("hostile", "math_names", "views", "edge"), slow_only=("views",)),
    "dapo_accuracy": Spec(lambda t: {"timeout": t}, frozenset({-1.0, 1.0}), wrong=-1.0, uses_verifier=True,
                          corpora=("hostile", "math_names", "views", "edge"), slow_only=("views",)),
    "overlong_penalty": Spec(lambda t: dict(OVERLONG), None),
    # other trainers' names (rewards/foreign.py): open-r1's format and TRL's own regex and overlong objects
    "format": Spec(lambda t: {}, frozenset({0.0, 1.0})),
    "think_format_reward": Spec(lambda t: {}, frozenset({0.0, 1.0})),
    "get_soft_overlong_punishment": Spec(lambda t: {}, None),  # TRL's formula, in [-1, 0]
    # TRL's and open-r1's accuracy rewards grade whole completions in the verifier worker (grade_batch, which the
    # spy above does not see): their hard limit is tested in tests/verifier/test_foreign_accuracy.py, not fuzzed here
    "accuracy_reward": Spec(lambda t: {"timeout": t}, frozenset({0.0, 1.0}), wrong=0.0, corpora=()),
    "reasoning_accuracy_reward": Spec(lambda t: {"timeout": t}, frozenset({0.0, 1.0}), wrong=0.0, corpora=()),
    "accuracy": Spec(lambda t: {"timeout": t}, frozenset({0.0, 1.0}), wrong=0.0, corpora=()),
}


def _expected_overlong(ids: list[int]) -> float:
    return overlong_value(len(ids), OVERLONG["max_completion_length"], OVERLONG["overlong_buffer_len"],
                          OVERLONG["overlong_penalty_factor"])


# --- the verifier spy -------------------------------------------------------------------------------------

_ORIGINAL_VERIFY_BATCH = verifier.verify_batch


class VerifierSpy:
    """Wraps ``rewards.math.verify_batch``: per call, which items went to a worker and which got None."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[bool], list]] = []

    def __call__(self, pairs, timeout=verifier.DEFAULT_TIMEOUT, **clock):
        results = _ORIGINAL_VERIFY_BATCH(pairs, timeout, **clock)
        sent = []
        for pred, gold in pairs:
            p = "" if pred is None else str(pred).strip()
            g = "" if gold is None else str(gold).strip()
            sent.append(
                bool(p) and bool(g) and len(p) <= verifier.MAX_PRED_CHARS and len(g) <= verifier.MAX_GOLD_CHARS
            )
        self.calls.append((sent, list(results)))
        return results


# --- the runner ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    items: int = 0
    calls: int = 0
    exceptions: int = 0
    verified: int = 0  # items that reached a Math-Verify worker (pass A)
    limit_items: Counter = field(default_factory=Counter)  # class -> items at the limit in pass A or B
    exempt: int = 0  # items left out of the determinism check (at the limit in a pass)
    worst_item: tuple[float, str] = (0.0, "")
    worst_call: tuple[float, int] = (0.0, 0)
    seconds: float = 0.0
    corpora: dict[str, int] = field(default_factory=dict)  # corpus -> texts


RESULTS: dict[tuple[str, str], Row] = {}  # (run, reward) -> Row, printed at the end of the module


def _kwargs(spec: Spec, entries, ids, idx: list[int], chat: bool) -> dict:
    texts = [entries[i][1] for i in idx]
    if chat:
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        prompts = [[{"role": "user", "content": f"Question {i}"}] for i in idx]
    else:
        completions, prompts = texts, [f"Question {i}" for i in idx]
    return dict(prompts=prompts, completions=completions, completion_ids=[ids[i] for i in idx],
                answer=[spec.golds[i % len(spec.golds)] for i in idx],
                solution=[spec.golds[i % len(spec.golds)] for i in idx], trainer_state=None, log_extra=_noop,
                log_metric=_noop)


def _check_scores(name: str, spec: Spec, scores, idx: list[int], ids, where: str, failures: list[str]) -> bool:
    if not isinstance(scores, list) or len(scores) != len(idx):
        failures.append(f"{where}: expected a list of {len(idx)} scores, got {type(scores).__name__} "
                        f"of length {len(scores) if hasattr(scores, '__len__') else '?'}")
        return False
    ok = True
    for i, s in zip(idx, scores):
        if type(s) is not float or not math.isfinite(s):
            failures.append(f"{where} item {i}: score {s!r} is not a finite float")
            ok = False
        elif spec.allowed is not None and s not in spec.allowed:
            failures.append(f"{where} item {i}: score {s!r} not in {sorted(spec.allowed)}")
            ok = False
        elif name == "get_soft_overlong_punishment" and not -1.0 <= s <= 0.0:
            failures.append(f"{where} item {i}: {s!r} outside TRL's [-1, 0]")
            ok = False
        elif name == "overlong_penalty" and s != _expected_overlong(ids[i]):
            failures.append(f"{where} item {i}: {s!r} != DAPO's {_expected_overlong(ids[i])!r} for {len(ids[i])} ids")
            ok = False
    return ok


def fuzz_reward(name: str, corpus_name: str, n: int, seed: int, row: Row, failures: list[str],
                monkeypatch: pytest.MonkeyPatch, timeout: float = MATH_TIMEOUT) -> None:
    """Both passes of one reward over one corpus (module doc); problems are appended to ``failures``."""
    spec = SPECS[name]
    fn = rewards.get_reward(name, **spec.options(timeout))
    entries = corpus(corpus_name, n, seed)
    ids = token_ids(corpus_name, n, seed)
    spy = VerifierSpy()
    if spec.uses_verifier:
        monkeypatch.setattr(rmath, "verify_batch", spy)
    started = time.perf_counter()
    a_scores: dict[int, float] = {}
    at_limit: dict[int, str] = {}  # index -> class, at the limit in pass A or B

    def timed_call(idx: list[int], chat: bool, where: str):
        kwargs = _kwargs(spec, entries, ids, idx, chat)
        spy.calls.clear()
        if spec.uses_verifier:
            verifier.warmup()  # untimed: a worker killed by the previous call may still be starting
        t0 = time.perf_counter()
        try:
            scores = fn(**kwargs)
        except Exception as e:  # noqa: BLE001 - recorded, asserted at the end of the test
            row.exceptions += 1
            failures.append(f"{where}: raised {type(e).__name__}: {str(e)[:300]}")
            return None, time.perf_counter() - t0, [], []
        dt = time.perf_counter() - t0
        row.calls += 1
        sent, results = ([False] * len(idx), [True] * len(idx))
        if spec.uses_verifier:
            first = [c for c in spy.calls if len(c[0]) == len(idx)]
            if not first:
                failures.append(f"{where}: the reward did not call verify_batch with its {len(idx)} items")
            else:
                sent, results = first[0]
        if not _check_scores(name, spec, scores, idx, ids, where, failures):
            return None, dt, sent, results
        return scores, dt, sent, results

    # pass A: TRL-sized batches, alternately plain strings and chat message lists
    for b, start in enumerate(range(0, len(entries), BATCH)):
        idx = list(range(start, min(len(entries), start + BATCH)))
        where = f"{name} on {corpus_name}[{start}:{idx[-1] + 1}] (pass A, {'chat' if b % 2 else 'plain'})"
        scores, dt, sent, results = timed_call(idx, chat=b % 2 == 1, where=where)
        row.worst_call = max(row.worst_call, (dt, len(idx)))
        hits = [i for i, s, r in zip(idx, sent, results) if s and r is None]
        row.verified += sum(sent)
        if spec.uses_verifier:
            bound = sum(sent) * timeout + len(hits) * STARTUP_ALLOWANCE + CALL_SLACK
        else:
            bound = TEXT_CALL_BOUND
        if dt > bound:
            failures.append(f"{where}: took {dt:.2f} s > {bound:.2f} s "
                            f"({sum(sent)} verified, {len(hits)} at the limit)")
        for i in hits:
            at_limit[i] = entries[i][0]
        if scores is not None:
            a_scores.update(zip(idx, scores))
            for i, s in zip(idx, scores):
                if i in hits and s != spec.wrong:
                    failures.append(f"{where} item {i}: timed out but scored {s!r}, not {spec.wrong!r}")

    # pass B: one completion per call, in the other format than pass A gave it
    for i, (cls, _) in enumerate(entries):
        chat = (i // BATCH) % 2 == 0
        where = f"{name} on {corpus_name}[{i}] ({cls}, pass B, {'chat' if chat else 'plain'})"
        scores, dt, sent, results = timed_call([i], chat=chat, where=where)
        row.worst_item = max(row.worst_item, (dt, cls))
        hit = bool(sent and sent[0] and results[0] is None)
        bound = timeout + ITEM_SLACK if (spec.uses_verifier and sent and sent[0]) else TEXT_ITEM_BOUND
        if dt > bound:
            failures.append(f"{where}: took {dt:.2f} s > {bound:.2f} s")
        if hit:
            at_limit[i] = cls
            if scores is not None and scores[0] != spec.wrong:
                failures.append(f"{where}: timed out but scored {scores[0]!r}, not {spec.wrong!r}")
        if scores is None or i not in a_scores:
            continue
        if i in at_limit:
            row.exempt += 1
        elif scores[0] != a_scores[i]:
            failures.append(f"{where}: not deterministic: {a_scores[i]!r} in a batch, {scores[0]!r} alone "
                            f"(text {entries[i][1][:120]!r})")
    row.items += len(entries)
    row.limit_items.update(at_limit.values())
    row.seconds += time.perf_counter() - started
    monkeypatch.undo()


def _prepare_golds() -> None:
    """Every math gold must parse; then mark them checked so that a time-out does not trigger the reward's
    one-off gold check (an extra round trip waiting for the replacement worker, inside a timed call)."""
    for gold in MATH_GOLDS:
        assert _ORIGINAL_VERIFY_BATCH([(gold, gold)], 30.0) == [True], gold
    rmath._checked_golds.update(MATH_GOLDS)


def _run(run: str, name: str, sizes: dict[str, int], seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SPECS[name]
    if spec.uses_verifier:
        _prepare_golds()
    row = RESULTS.setdefault((run, name), Row())
    failures: list[str] = []
    for corpus_name in spec.corpora:
        if run == "ci" and corpus_name in spec.slow_only:
            continue
        n = sizes["verifier_views" if spec.uses_verifier and corpus_name == "views" else corpus_name] \
            if corpus_name != "edge" else len(EDGE_CASES)
        fuzz_reward(name, corpus_name, n, seed, row, failures, monkeypatch)
        row.corpora[corpus_name] = n
    assert row.exceptions == 0 and not failures, (
        f"{len(failures)} problems, the first ones:\n" + "\n".join(failures[:25]))


# --- the tests ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def summary_table():
    yield
    if not RESULTS:
        return
    lines = ["", f"reward fuzz summary (math limit {MATH_TIMEOUT} s per item; batches of {BATCH}; pass A + pass B)",
             f"{'run':5} {'reward':22} {'texts':>7} {'calls':>6} {'exc':>4} {'verified':>8} {'at limit':>8} "
             f"{'exempt':>6} {'worst s/item':>12} {'(class)':22} {'worst s/call':>12} {'total s':>8}"]
    for (run, name), r in sorted(RESULTS.items()):
        lines.append(f"{run:5} {name:22} {r.items:7d} {r.calls:6d} {r.exceptions:4d} {r.verified:8d} "
                     f"{sum(r.limit_items.values()):8d} {r.exempt:6d} {r.worst_item[0]:12.3f} {r.worst_item[1]:22} "
                     f"{r.worst_call[0]:12.3f} {r.seconds:8.1f}")
    for (run, name), r in sorted(RESULTS.items()):
        lines.append(f"  {run} {name}: texts per corpus {r.corpora}")
    for (run, name), r in sorted(RESULTS.items()):
        if r.limit_items:
            lines.append(f"  {run} {name}: at the time limit by class: {dict(r.limit_items.most_common())}")
    print("\n".join(lines))


def test_every_text_reward_is_fuzzed():
    """A new text reward must get a Spec here (its kwargs and allowed scores), or this fails."""
    assert set(TEXT_REWARDS) == set(SPECS), f"add a Spec for {sorted(set(TEXT_REWARDS) ^ set(SPECS))}"
    assert set(ENV_REWARDS) <= set(rewards.available())


def test_corpora_cover_every_class():
    for key, n in CI_SIZES.items():
        name = "views" if key == "verifier_views" else key
        entries = corpus(name, n, CI_SEED)
        assert len(entries) == n and set(CLASSES) <= {cls for cls, _ in entries}, name
    assert corpus("hostile", CI_TEXTS, CI_SEED) == corpus("hostile", CI_TEXTS, CI_SEED)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_fuzz_text_reward(name, monkeypatch):
    _run("ci", name, CI_SIZES, CI_SEED, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SPECS))
def test_fuzz_text_reward_slow(name, monkeypatch):
    _run("slow", name, SLOW_SIZES, SLOW_SEED, monkeypatch)


def test_format_penalty_repetition_loop_is_linear():
    """Regression: the repetition loops of EDGE_CASES score in milliseconds, with the old scores."""
    f = rewards.get_reward("answer_format_penalty")
    texts = [t for cls, t in EDGE_CASES if cls == "repeated_turns"]
    t0 = time.perf_counter()
    scores = f(completions=texts)
    assert time.perf_counter() - t0 < 1.0  # was 5 s for the first text alone
    assert scores == [-0.1, -0.1, -0.1, -0.1, 0.0, 0.0, -0.1]  # as the old evaluation order gave (5+ s)
    # the old evaluation order (regex first), on short texts where it is fast: the same scores
    short = [t[:3_000] for t in texts]
    short += ["<think>a</think><answer>b</answer>" * 3, " <think>a</think>\n<answer> b </answer>\n"]
    for text in short:
        m = rformat._STRUCTURED.fullmatch(text)
        old = m is not None and m.group(2).strip() != "" and text.count("<think>") == 1 and text.count("<answer>") == 1
        assert f(completions=[text]) == [0.0 if old else -0.1], text[:80]


def test_clear_errors_without_the_columns():
    """Missing inputs are recipe errors: KeyError / ValueError naming what is missing, never an odd crash."""
    comps = ["<think>a</think><answer>1</answer>"]
    for name in ("math_accuracy", "math_accuracy_full_text", "dapo_accuracy", "countdown"):
        with pytest.raises(KeyError, match="answer"):
            rewards.get_reward(name)(prompts=["q"], completions=comps, completion_ids=[[1]])
        with pytest.raises(ValueError, match="entries for 1 completions"):
            rewards.get_reward(name)(prompts=["q"], completions=comps, completion_ids=[[1]], answer=["1", "2"])
    with pytest.raises(ValueError, match="countdown JSON"):
        rewards.get_reward("countdown")(completions=comps, answer=["not json"])
    with pytest.raises(ValueError, match="max_completion_length"):
        rewards.get_reward("overlong_penalty")(completions=comps, completion_ids=[[1]])
    with pytest.raises(ValueError, match="completion_ids"):
        rewards.get_reward("overlong_penalty", **OVERLONG)(completions=comps)


_GARBAGE_EXTRAS = {
    "None": None, "str": "abc", "numeric str": "1.5", "str False": "False", "nan": float("nan"),
    "inf": float("inf"), "list": [1], "dict": {}, "object": object(), "bytes": b"1", "complex": 1 + 1j,
    "huge int": 10**400, "bool": True, "negative": -3.5,
}


def test_env_rewards_missing_and_garbage_extras():
    """env_return / env_success: a missing extra is a KeyError naming it; a garbage value either raises
    TypeError / ValueError / OverflowError (float()'s own, clear errors) or gives a float; hostile texts
    do not matter (they score the extras, never the text)."""
    texts = [text for _, text in corpus("hostile", 2 * len(CLASSES), CI_SEED)]
    for name, key in (("env_return", "episode_return"), ("env_success", "success")):
        fn = rewards.get_reward(name)
        with pytest.raises(KeyError, match=key):
            fn(prompts=["q"] * len(texts), completions=texts, completion_ids=[[1]] * len(texts))
        with pytest.raises(KeyError, match=key):  # the other reward's extra does not do
            other = "success" if key == "episode_return" else "episode_return"
            fn(completions=texts, **{other: [1.0] * len(texts)})
        values = [float(i % 3) - 1.0 for i in range(len(texts))]
        out = fn(completions=texts, completion_ids=[[1]] * len(texts), **{key: values}, answer=["x"] * len(texts))
        assert out == (values if name == "env_return" else [float(v != 0.0) for v in values])
        assert all(type(s) is float for s in out)
        behaviour = {}
        for label, value in _GARBAGE_EXTRAS.items():
            try:
                scores = fn(completions=texts[:1], **{key: [value]})
            except (TypeError, ValueError, OverflowError) as e:
                behaviour[label] = type(e).__name__
                continue
            assert len(scores) == 1 and type(scores[0]) is float, (label, scores)
            behaviour[label] = scores[0]
        with pytest.raises(TypeError):  # not a sequence at all
            fn(completions=texts[:1], **{key: None})
        print(f"\n{name} on garbage {key!r} values: {behaviour}")
