"""Math rewards: the verifier's equivalence table, answer extraction, hard time limits, reward functions."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import rewards  # noqa: E402
from rewards import verifier  # noqa: E402
from rewards.math import (  # noqa: E402
    extract_answer_line,
    extract_boxed,
    make_dapo_accuracy,
    make_math_accuracy,
    make_think_format,
)

LIMIT = 1.0  # short limit keeps the timeout tests fast
MARGIN = 1.5
# Slow within every bound of the pre-filter: bare braces exactly MAX_PRED_DEPTH deep, which Math-Verify's parser does
# not finish within 5 s (number bombs such as 9^{9^{9^{9}}} score False before any worker now: rewards/magnitude.py)
BOMB = "{" * verifier.MAX_PRED_DEPTH + "1" + "}" * verifier.MAX_PRED_DEPTH

# (gold, prediction, verifier result). The table documents the verifier as it is: rows where Math-Verify
# departs from the mathematically right answer are kept with its actual result and a "LIMITATION" comment.
TABLE = [
    # fractions, decimals, \frac variants
    ("\\frac{1}{2}", "0.5", True), ("0.5", "\\frac{1}{2}", True), ("1/2", "\\frac12", True),
    ("\\frac{1}{2}", "\\dfrac{1}{2}", True), ("\\frac{1}{2}", "\\tfrac{1}{2}", True),
    ("\\frac{1}{2}", "\\frac{2}{4}", True), ("\\frac{1}{3}", "0.333", False),
    ("\\frac{1}{3}", "0.3333333", True),  # floats are compared after rounding (float_rounding=6)
    ("3", "3.0", True), ("3", "3.0000001", False), ("3", "3.01", False),
    # radicals
    ("2\\sqrt{2}", "\\sqrt{8}", True), ("\\sqrt{8}", "2\\sqrt{2}", True), ("\\sqrt{2}", "\\sqrt2", True),
    ("\\sqrt{2}", "1.41421356", True), ("\\sqrt{2}", "\\sqrt{3}", False),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True),
    # intervals and sets
    ("(0,1]", "(0,1]", True), ("(0,1]", "(0,1)", False), ("(0,1]", "[0,1]", False),
    ("[2, \\infty)", "[2,\\infty)", True), ("(-\\infty, 0) \\cup (1, \\infty)", "(-\\infty,0)\\cup(1,\\infty)", True),
    ("\\{1,2\\}", "\\{2,1\\}", True), ("\\{1,2\\}", "\\{1,3\\}", False), ("1,2", "2,1", True),
    # units and LaTeX variants
    ("5", "5 \\text{ cm}", True), ("5", "5\\,\\mathrm{cm}", True), ("5", "5 cm", True), ("5\\text{ cm}", "5", True),
    ("5", "\\text{5}", True),
    ("5", "\\text{5 cm}", False),  # LIMITATION: a unit inside the same \text{} is not stripped
    ("(1,2)", "\\left(1,2\\right)", True), ("10", "1\\!0", True), ("10", "10~", True),
    ("90^\\circ", "90", True), ("90", "90^{\\circ}", True), ("\\text{(A)}", "A", True),
    ("2", "$2$", True), ("2", "2.", True), ("2", "\\boxed{2}", True),
    # integers with commas, negatives
    ("1000", "1,000", True), ("1,000", "1000", True), ("1000000", "1,000,000", True), ("1000", "1{,}000", True),
    ("1000", "1\\,000", False),  # LIMITATION: a thin-space thousands separator is not understood
    ("-3", "-3", True), ("-3", "3", False), ("-\\frac{1}{2}", "\\frac{-1}{2}", True), ("-\\frac{1}{2}", "-0.5", True),
    # pi, percentages, ratios
    ("2\\pi", "6.283185", True), ("\\pi/2", "\\frac{\\pi}{2}", True), ("2\\pi", "\\pi", False),
    ("50\\%", "50", True), ("50", "50\\%", True),
    ("0.5", "50\\%", True),  # LIMITATION: a percentage matches both 50 and 0.5 (either scale is accepted)
    ("50\\%", "0.5", True),  # LIMITATION: same, gold side
    ("\\frac{1}{2}", "1:2", True),  # a ratio is read as a quotient
    # expressions, equations, wrong answers, empties
    ("42", "41", False), ("42", "x = 42", True), ("x=42", "42", True), ("7", "seven", False),
    ("x^2+2x+1", "(x+1)^2", True), ("x^2+2x+1", "(y+1)^2", False), ("e", "\\exp(1)", True),
    ("1", "\\sin^2 x + \\cos^2 x", True),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    ("2", "", False), ("2", "\\frac{}{}", False), ("", "2", None),  # empty gold: unscorable
]


@pytest.fixture(scope="module")
def table_results():
    verifier.warmup()
    return verifier.verify_batch([(pred, gold) for gold, pred, _ in TABLE], timeout=5.0)


@pytest.mark.parametrize("row", range(len(TABLE)), ids=[f"{g}|{p}" for g, p, _ in TABLE])
def test_equivalence_table(table_results, row):
    gold, pred, expected = TABLE[row]
    assert table_results[row] is expected, (gold, pred)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{\\frac{a}{b^{2}}} done", "\\frac{a}{b^{2}}"),  # nested braces
        ("\\boxed{1} then \\boxed{2}", "2"),  # last wins
        ("\\boxed{1} then \\fbox{3}", "3"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are literal
        ("\\boxed{a\\\\}", "a\\\\"),  # "\\" is a line break, not an escaped brace
        ("answer \\boxed 7 end", "7"),
        ("$\\boxed 7$", "7"),
        ("\\boxed {5}", "5"),
        ("\\boxed{1} and \\boxed{2", None),  # last box unbalanced (truncated): no answer
        ("\\boxed{}", None), ("\\boxed", None), ("no box here", None), ("", None), (None, None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("work\nAnswer: 42", "42"),
        ("Answer: 1\nmore\nanswer:  $\\frac{1}{2}$ \n", "$\\frac{1}{2}$"),  # last occurrence, case-insensitive
        ("**Final Answer:** 7", "7"),
        ("Answer: 5" + "x" * 400, None),  # outside the last 300 characters
        ("Answer:   \n", None), ("", None), (None, None),
    ],
)
def test_extract_answer_line(text, expected):
    assert extract_answer_line(text) == expected


def test_registry_and_names():
    assert {"math_accuracy", "think_format", "dapo_accuracy"} <= set(rewards.available())
    for name in ("math_accuracy", "think_format", "dapo_accuracy"):
        assert rewards.get_reward(name).__name__ == name
    assert make_math_accuracy(timeout=3.0).__name__ == "math_accuracy"


def test_math_accuracy_strings_and_conversations():
    f = rewards.get_reward("math_accuracy")
    completions = [
        "<think>maybe \\boxed{3}</think>So \\boxed{\\dfrac{1}{2}}.",  # boxed inside think is ignored
        "<think>it is \\boxed{0.5}</think>I give up.",  # only the think block has an answer
        "<think>still thinking \\boxed{0.5}",  # never closed: no answer
        [{"role": "assistant", "content": "The answer is \\boxed{1/2}"}],
        [{"role": "assistant", "content": [{"type": "text", "text": "Answer: 0.5"}]}],
        [{"role": "assistant", "reasoning_content": "\\boxed{0.5}", "content": "no idea"}],
        [{"role": "assistant", "content": None}],
        "\\boxed{0.6}",
        "",
    ]
    scores = f(prompts=["p"] * 9, completions=completions, answer=["\\frac{1}{2}"] * 9)
    assert scores == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(KeyError):
        f(prompts=["p"], completions=["\\boxed{1}"])


def test_dapo_accuracy():
    f = rewards.get_reward("dapo_accuracy")
    completions = ["Answer: 12", "so\nAnswer: $12$", "\\boxed{12}", "Answer: 13", "nothing", "Answer: \\boxed{12}"]
    assert f(prompts=None, completions=completions, answer=["12"] * 6) == [1.0, 1.0, 1.0, -1.0, -1.0, 1.0]


@pytest.mark.parametrize(
    "completion, score",
    [
        ("<think>reason</think>So \\boxed{3}", 1.0),
        ("\n<think>\nreason\n</think>\n\nAnswer: 3\n", 1.0),
        ("<think>reason</think>", 0.0),  # no answer
        ("<think>reason</think>the answer is 3", 0.0),  # answer without box / Answer: line
        ("<think>  </think>\\boxed{3}", 0.0),  # blank reasoning
        ("\\boxed{3}", 0.0),  # no think block
        ("<think>a</think><think>b</think>\\boxed{3}", 0.0),  # two blocks
        ("<think>a</think>\\boxed{3}</think>", 0.0),  # stray tag
        ("text <think>a</think>\\boxed{3}", 0.0),  # text before the block
        ("<think>a</think>\\boxed{3", 0.0),  # unbalanced box
        ([{"role": "assistant", "reasoning_content": "r", "content": "\\boxed{3}"}], 1.0),
    ],
)
def test_think_format(completion, score):
    assert rewards.get_reward("think_format")(prompts=None, completions=[completion]) == [score]


def test_think_format_open_tag_in_prompt():
    f = make_think_format(open_tag_in_prompt=True)
    assert f(completions=["reason</think>\\boxed{1}", "<think>r</think>\\boxed{1}", "\\boxed{1}"]) == [1.0, 1.0, 0.0]


def test_garbage_scores_zero_and_is_deterministic():
    f = make_math_accuracy(timeout=LIMIT)
    garbage = [
        (b"\xff\xfe\x80 " * 50 + b"\\boxed{\xc3\x28}").decode("utf-8", errors="replace"),  # invalid UTF-8
        "\ud800\\boxed{\udfff}",  # lone surrogates
        "\\boxed{" + "9" * 1500 + "}", "\\boxed{1e999999}",  # huge numbers
        "\\boxed{\\frac{\\frac{}{}}{\\sqrt[}{}}", "\\boxed{}}}}", "\x00\\boxed{\x00}", "\\boxed{\\begin{pmatrix}}",
        "\\boxed{\\left(}", "\\boxed{\\mathrm{\\text{\\textbf{}}}}",  # random LaTeX
        [{"role": "tool", "content": "\\boxed{1}"}], 12345, None,  # no assistant message, not text at all
    ]
    first = f(prompts=None, completions=garbage, answer=["1"] * len(garbage))
    assert first == [0.0] * len(garbage)
    assert make_dapo_accuracy(timeout=LIMIT)(completions=garbage, answer=["1"] * len(garbage)) == [-1.0] * len(garbage)
    good = ["\\boxed{1}", "\\boxed{2}", "Answer: 1"]
    assert f(completions=good, answer=["1"] * 3) == f(completions=good, answer=["1"] * 3) == [1.0, 0.0, 1.0]


def _timed(fn, *args):
    t = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t


def test_bomb_is_cut_at_the_limit_and_worker_recovers():
    verifier.warmup()
    before = set(verifier._worker_pids())
    result, elapsed = _timed(verifier.verify_answer, BOMB, "1", LIMIT)
    assert result is None and elapsed < LIMIT + MARGIN
    after = set(verifier._worker_pids())
    # the stuck worker was killed and replaced; other pooled workers (the pool grows to MAX_WORKERS when
    # threads verify concurrently, e.g. the eval grader) are untouched
    assert len(before - after) == 1 and len(after) == len(before)
    assert verifier.verify_answer("2", "2", LIMIT) is True


def test_bomb_in_reward_batch_scores_zero_and_rest_is_scored():
    f = make_math_accuracy(timeout=LIMIT)
    scores, elapsed = _timed(
        lambda: f(completions=["\\boxed{1}", f"\\boxed{{{BOMB}}}", "\\boxed{1}"], answer=["1"] * 3)
    )
    assert scores == [1.0, 0.0, 1.0] and elapsed < LIMIT + MARGIN + 1.0  # + one worker restart


def test_megabyte_completion_is_cheap():
    f = make_math_accuracy(timeout=LIMIT)
    huge = ["x" * 1_000_000, "\\boxed{" + "9" * 1_000_000 + "}", "<think>" + "y" * 1_000_000, "\\boxed{" * 100_000]
    scores, elapsed = _timed(lambda: f(completions=huge, answer=["1"] * 4))
    assert scores == [0.0] * 4 and elapsed < 0.5
    result, elapsed = _timed(verifier.verify_answer, "1" * 1_000_000, "1", LIMIT)
    assert result is False and elapsed < 0.5


def _in_thread(fn):
    box = {}
    th = threading.Thread(target=lambda: box.update(out=fn()))
    th.start()
    th.join(30)
    return box["out"]


def test_non_main_thread_is_bounded():
    assert _in_thread(lambda: verifier.verify_answer("0.5", "\\frac{1}{2}", LIMIT)) is True
    (result, elapsed) = _in_thread(lambda: _timed(verifier.verify_answer, BOMB, "1", LIMIT))
    assert result is None and elapsed < LIMIT + MARGIN


def test_several_threads_at_once():
    pairs = [("0.5", "\\frac{1}{2}"), ("3", "4"), ("2\\sqrt{2}", "\\sqrt{8}"), ("x", "y")]
    out: dict = {}

    def work(k):
        out[k] = _timed(verifier.verify_batch, pairs if k else [(BOMB, "1")] + pairs, LIMIT)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert out[0][0] == [None, True, False, True, False]
    assert all(out[k][0] == [True, False, True, False] for k in range(1, 6))
    # Threads beyond MAX_WORKERS queue, so a call's wall time includes waiting: bound it loosely.
    assert max(elapsed for _, elapsed in out.values()) < 2 * (LIMIT + MARGIN)


def test_limit_holds_while_process_is_busy():
    stop = threading.Event()

    def spin():  # holds the GIL as much as a pure-Python loop can
        while not stop.is_set():
            sum(range(1000))

    spinners = [threading.Thread(target=spin) for _ in range(2)]
    for th in spinners:
        th.start()
    try:
        result, elapsed = _timed(verifier.verify_answer, BOMB, "1", LIMIT)
        assert result is None and elapsed < LIMIT + MARGIN
        assert verifier.verify_answer("0.5", "\\frac{1}{2}", LIMIT) is True
    finally:
        stop.set()
        for th in spinners:
            th.join()


def _alive(pid):
    try:  # a killed worker may linger as a zombie until init reaps it: that counts as dead
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_workers_do_not_outlive_the_process(how):
    """A worker stuck on the bomb dies when its process exits normally (atexit) or is SIGKILLed (pdeathsig)."""
    root = Path(__file__).resolve().parents[2]
    code = (
        f"import sys, threading, time; sys.path.insert(0, {str(root)!r})\n"
        "from rewards import verifier as v\nv.warmup(); print(v._worker_pids()[0], flush=True)\n"
        f"threading.Thread(target=v.verify_answer, args=({BOMB!r}, '1', 60.0), daemon=True).start()\n"
        f"time.sleep(0.3)\n{'' if how == 'exit' else 'time.sleep(60)'}\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    if how == "sigkill":
        time.sleep(0.5)  # the worker is now stuck in sympy, deaf to its pipes: only PR_SET_PDEATHSIG can stop it
        proc.kill()
    proc.wait(timeout=20)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
