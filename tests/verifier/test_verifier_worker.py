"""The math verifier's worker processes: what environment they get, and the bounds one batch is held to.

Real worker processes throughout (no mocks). Each test that measures or inspects workers runs on a private pool
(:func:`private_pool`, swapped in for the module's shared one and closed afterwards), started after the test set
its environment and warmed before anything is timed: the times below then hold no worker start-up, and the bound
asserted is the one :func:`rewards.verifier.verify_batch` promises -- ``batch_timeout`` (or the per-item
``timeout`` per worker) plus MARGIN for killing overrunning workers (SIGKILL + reap, milliseconds) and a busy
machine's scheduling of the parent. ``_Pool.started`` counts the items a worker began on: what cost worker time.
"""

import math
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from rewards import verifier
from rewards.magnitude import too_big
from rewards.math_rewards import extract_final_answer, make_math_accuracy

LIMIT = 1.0  # per-item limit where it should end an item (short keeps the tests fast)
MARGIN = 1.5
FLOOD = "\\boxed{" + "(" * 600 + ")" * 600 + "}"  # 1.2k characters: under MAX_PRED_CHARS, 600 deep
# Slips past the bracket bounds (exactly MAX_PRED_DEPTH deep) and still never parses in time: bare braces cost the
# parser ~1.3 s at 10 deep, ~5 s at 14 deep on a 2-core box; 20 deep does not finish within 5 s.
DEEP_BRACES = "{" * verifier.MAX_PRED_DEPTH + "1" + "}" * verifier.MAX_PRED_DEPTH
BOMB = DEEP_BRACES  # the slow item that reaches a worker (number bombs do not: test_number_bombs_never_reach_a_worker)
ORDINARY = [("\\frac12", "0.5", True), ("3", "3", True), ("4", "5", False), ("2\\sqrt2", "\\sqrt8", True)]
SECRETS = {
    "WANDB_API_KEY": "wandb-secret-0123456789", "HF_TOKEN": "hf_secretsecretsecret", "AWS_SECRET_ACCESS_KEY": "s3cr3t",
    "OPENAI_API_KEY": "sk-secret", "GITHUB_TOKEN": "ghp_secret", "DB_PASSWORD": "hunter2", "MY_SERVICE_SECRET": "s3c",
    "PYTHONPATH": "/nonexistent/shadow",  # ignored under -I anyway, and not passed either
}
# Real answers, deep and bracket-heavy as real answers get: the bounds must never touch them.
REAL_ANSWERS = [
    ("\\frac{2+\\sqrt{3}}{4}", "\\left(\\frac{\\sqrt{2+\\sqrt{3}}}{2}\\right)^{2}", True),
    ("\\sqrt{2+\\sqrt{2+\\sqrt{2+\\sqrt{2}}}}", "\\sqrt{2+\\sqrt{2+\\sqrt{2+\\sqrt{2}}}}", True),
    ("\\left[-\\frac{1}{2}, \\frac{3}{2}\\right)", "[-\\frac{1}{2},\\frac{3}{2})", True),
    ("\\begin{pmatrix}\\frac{1}{2}&\\frac{1}{3}\\\\\\frac{1}{4}&\\frac{1}{5}\\end{pmatrix}",
     "\\begin{pmatrix}\\frac{1}{2}&\\frac{1}{3}\\\\\\frac{1}{4}&\\frac{1}{5}\\end{pmatrix}", True),
    ("(1,2),(3,4),(5,6)", "(1,2),(3,4),(5,6)", True),
    ("2^{2^{2^{2}}}", "65536", True),
]


@pytest.fixture
def private_pool(monkeypatch):
    """A fresh pool of two workers in place of the shared one (no worker started yet); closed afterwards."""
    pool = verifier._Pool(2)
    monkeypatch.setitem(verifier._STATE, "pool", pool)
    yield pool
    pool.close()


def _warm(pool) -> set[int]:
    """Start every worker of ``pool`` and wait until all are ready; their pids."""
    workers = [pool.acquire() for _ in range(pool.size)]
    for w in workers:
        pool.release(w)
    return {w.proc.pid for w in workers}


def _timed(fn, *args, **kwargs):
    t = time.monotonic()
    out = fn(*args, **kwargs)
    return out, time.monotonic() - t


def _alive(pid: int) -> bool:
    try:  # a killed worker may linger as a zombie until reaped: that counts as dead
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _proc_environ(raw: bytes) -> dict[str, str]:
    """A process's start-up environment from its ``/proc/<pid>/environ``. glibc's loader (2.36 here) cuts
    GLIBC_TUNABLES at each ":" in the process's own copy, so the pieces after the first come back as separate
    ``glibc.*=`` entries: they are joined again."""
    env: dict[str, str] = {}
    key = None
    for entry in raw.decode("utf-8", "surrogateescape").split("\0"):
        if not entry:
            continue
        if key == "GLIBC_TUNABLES" and entry.startswith("glibc."):
            env[key] += ":" + entry
            continue
        key, _, value = entry.partition("=")
        env[key] = value
    return env


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/environ")
def test_worker_gets_only_the_allowlisted_environment(private_pool, monkeypatch, tmp_path):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "C.UTF-8")  # allowlisted ones pass, unchanged
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert verifier.verify_batch([("0.5", "\\frac{1}{2}"), ("3", "4")]) == [True, False]  # it works on that
    assert private_pool.idle, "the batch's workers went back to the pool"
    expected = {k: os.environ[k] for k in verifier._ENV_ALLOW if k in os.environ}
    assert {"LANG", "TMPDIR", "PATH"} <= set(expected)
    for worker in private_pool.idle:
        raw = Path(f"/proc/{worker.proc.pid}/environ").read_bytes()
        env = _proc_environ(raw)
        assert env == expected  # the allowlist is all there is: no HOME, no WANDB_*, HF_*, AWS_*, ...
        for name, value in SECRETS.items():
            assert name not in env and value.encode() not in raw, name


def test_bracket_bounds_keep_real_answers_and_stop_floods():
    for gold, pred, _ in REAL_ANSWERS + ORDINARY:
        for s in (gold, pred):
            assert not verifier._over_nested(s, verifier.MAX_PRED_DEPTH, verifier.MAX_PRED_BRACKETS), s
    assert not verifier._over_nested(DEEP_BRACES, verifier.MAX_PRED_DEPTH, verifier.MAX_PRED_BRACKETS)
    assert verifier._over_nested("{" + DEEP_BRACES + "}", verifier.MAX_PRED_DEPTH, verifier.MAX_PRED_BRACKETS)
    flat = "+".join(["(1)"] * (verifier.MAX_PRED_BRACKETS + 1))  # shallow, but more brackets than any answer
    assert len(flat) <= verifier.MAX_PRED_CHARS and verifier._over_nested(flat, 1000, verifier.MAX_PRED_BRACKETS)
    assert not verifier._over_nested("(0,1]" * 50, 1, 1000)  # mixed pairs close each other: depth 1
    assert verifier.verify_batch([(g, p) for g, p, _ in REAL_ANSWERS], timeout=10.0) == [e for *_, e in REAL_ANSWERS]
    deep_gold = "{" * (verifier.MAX_GOLD_DEPTH + 1) + "1" + "}" * (verifier.MAX_GOLD_DEPTH + 1)
    assert verifier.verify_batch([("1", deep_gold), (FLOOD[7:-1], "1")]) == [None, False]  # not sent anywhere


def test_bracket_flood_never_reaches_a_worker(private_pool):
    """8 completions of ``\\boxed{`` + 600 nested parentheses (the old code: one full limit each, 8 s here, 18.7 s
    at the default 2 s limit) score 0 without any worker time; the ordinary ones in the same batch are scored."""
    pred = extract_final_answer(FLOOD)
    assert pred == "(" * 600 + ")" * 600 and len(pred) <= verifier.MAX_PRED_CHARS  # only the nesting bound stops it
    _warm(private_pool)
    reward = make_math_accuracy(timeout=LIMIT)
    completions = [FLOOD] * 8 + [f"\\boxed{{{p}}}" for _, p, _ in ORDINARY]
    golds = ["1"] * 8 + [g for g, _, _ in ORDINARY]
    scores, elapsed = _timed(reward, completions=completions, answer=golds)
    assert scores == [0.0] * 8 + [1.0 if e else 0.0 for *_, e in ORDINARY]
    assert private_pool.started == len(ORDINARY)  # the floods never reached a worker
    assert elapsed <= verifier.batch_deadline(len(ORDINARY), LIMIT, private_pool.size) + MARGIN


def test_one_batch_runs_on_every_worker(private_pool):
    """Two bombs in one batch run at once, one per worker: both warmed workers are killed at the per-item limit, and
    the batch takes one limit, not two (a batch of n items on w workers: ceil(n / w) limits at most)."""
    timeout = 2.0
    pids = _warm(private_pool)
    results, elapsed = _timed(verifier.verify_batch, [(BOMB, "1"), (BOMB, "1")], timeout, batch_timeout=60.0)
    assert results == [None, None] and private_pool.started == 2
    assert not any(_alive(pid) for pid in pids)  # both workers took a bomb (on one worker, the other would live)
    assert elapsed <= math.ceil(2 / private_pool.size) * timeout + MARGIN
    assert verifier.verify_batch([("2", "2"), ("3", "3")], LIMIT) == [True, True]  # the replacements work


def test_batch_deadline_holds_past_the_bracket_bounds(private_pool):
    """Answers inside the bracket bounds that still never parse in time (DEEP_BRACES), with a per-item limit that
    cannot end them: the batch deadline does. The ordinary items before them are scored; each worker began one
    slow item and was killed at the deadline; the other slow items never reached a worker."""
    _warm(private_pool)
    pairs = [(p, g) for g, p, _ in ORDINARY] + [(DEEP_BRACES, "1")] * 6
    batch_timeout = 1.5
    results, elapsed = _timed(verifier.verify_batch, pairs, 60.0, batch_timeout=batch_timeout)
    assert results == [e for *_, e in ORDINARY] + [None] * 6
    assert private_pool.started == len(ORDINARY) + private_pool.size
    assert elapsed <= batch_timeout + MARGIN


def test_default_batch_deadline_bounds_a_batch_of_bombs(private_pool):
    """8 bombs at a 1 s limit took 8 s one after another; the default deadline (batch_deadline: 3 s for 8 items on 2
    workers) ends the batch, and each bomb a worker began held it for a whole limit, so some never started."""
    _warm(private_pool)
    deadline = verifier.batch_deadline(8, LIMIT, private_pool.size)
    assert deadline < 8 * LIMIT
    results, elapsed = _timed(verifier.verify_batch, [(BOMB, "1")] * 8, LIMIT)
    assert results == [None] * 8
    assert elapsed <= deadline + MARGIN
    assert private_pool.started <= private_pool.size * math.ceil(deadline / LIMIT) < 8


def test_batch_timeout_is_validated():
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="batch_timeout"):
            verifier.verify_batch([("1", "1")], LIMIT, batch_timeout=bad)


# Inputs inside the character and bracket bounds that built enormous numbers in the parser: each held a worker for its
# whole limit (8 of them: 6.0-6.5 s a math_accuracy / dapo_accuracy call at the default 2 s limit on this 2-core box).
NUMBER_BOMBS = ["9^{9^{9^{9}}}", "9^{9^{9}}", "2^" * 30 + "2", "100000000!", "(10^6)!", "\\binom{10^8}{5\\cdot10^7}",
                "\\prod_{k=1}^{1000000} k", "\\sum_{n=1}^{10^{9}} n", "x^{9^{9^9}}", "2^{-10^{8}}", "3+9^{9^{9}}"]
# Large but cheap (measured, one item each: 0.01-0.8 s) or symbolic: these still go to a worker and verify.
BIG_ANSWERS = [("2^{2^{10}}", "2^{1024}", True), ("1000!", "1000!", True),
               ("\\binom{100}{50}", "\\binom{100}{50}", True), ("2^{2^n}+1", "2^{2^n}+1", True),
               ("x^{10^8}", "x^{100000000}", True), ("\\sum_{k=1}^{n} k^2", "\\sum_{k=1}^{n} k^2", True)]


def test_number_bombs_never_reach_a_worker(private_pool):
    """A batch of number bombs scores False with no worker time; real answers, large ones among them, still verify
    (the pre-filter, rewards/magnitude.py, follows each numeric sub-expression's size)."""
    for bomb in NUMBER_BOMBS:
        assert too_big(bomb), bomb
    for gold, pred, _ in REAL_ANSWERS + ORDINARY + BIG_ANSWERS:
        assert not too_big(gold) and not too_big(pred), (gold, pred)
    assert not too_big("10^{10^{6}}") and not too_big("2^{10^{7}}") and not too_big("100000!")  # at the bounds
    garbage = ["}}}))", "^^^!!", "!" * 50, "\\frac\\frac", "^" * 1900, "2^" * 900 + "1", "", "₀!", "❻^{⑹}", "2^{₀}"]
    for text in garbage:
        too_big(text)  # never raises
    _warm(private_pool)
    results, elapsed = _timed(verifier.verify_batch, [(b, "1") for b in NUMBER_BOMBS], LIMIT)
    assert results == [False] * len(NUMBER_BOMBS) and private_pool.started == 0
    assert elapsed < 0.5
    assert verifier.verify_batch([(p, g) for g, p, _ in BIG_ANSWERS], 10.0) == [e for *_, e in BIG_ANSWERS]


def test_the_call_clock_counts_the_wait_for_a_worker(private_pool):
    """Every worker is held by another caller: the call returns at its own batch_timeout with its items unscored
    and none started (it used to wait for a worker first and only then start its clock)."""
    _warm(private_pool)
    held = [private_pool.acquire() for _ in range(private_pool.size)]
    # handed back after 4 s at the latest, so a call that waits for a worker off its clock fails instead of hanging
    give_back = threading.Timer(4.0, lambda: [private_pool.release(w) for w in held])
    give_back.start()
    try:
        results, elapsed = _timed(verifier.verify_batch, [("1", "1"), ("2", "2")], LIMIT, batch_timeout=0.5)
        assert results == [None, None] and private_pool.started == 0
        assert elapsed <= 0.5 + MARGIN
        past = time.monotonic() - 1.0
        assert verifier.grade_batch([("\\boxed{1}", "1")], "trl", LIMIT, deadline=past) == [None]
    finally:
        give_back.join()
    assert verifier.verify_batch([("1", "1")], LIMIT) == [True]


def test_a_reward_call_keeps_one_clock_through_restarts_and_the_gold_check(private_pool):
    """Back-to-back math_accuracy calls over 8 slow items each: a call kills its overrunning workers at its
    deadline, so the next one meets replacements still starting, and each checks its unseen golds after the batch.
    Both used to run past the call's deadline (3.2-3.5 s a call against 3.0 here); now the wait and the check are on
    the call's clock, so four calls take four deadlines and a few ms per kill."""
    _warm(private_pool)
    reward = make_math_accuracy(timeout=LIMIT)
    calls = 4
    deadline = verifier.batch_deadline(8, LIMIT, private_pool.size)
    t0 = time.monotonic()
    for k in range(calls):
        scores = reward(completions=["\\boxed{" + BOMB + "}"] * 8, answer=[f"{k}{j}" for j in range(8)])
        assert scores == [0.0] * 8
    assert time.monotonic() - t0 <= calls * deadline + 1.0
