"""Countdown: the seeded generator, the solver, the loader (generated / local Jiayi-Pan schema / hub offline)
and the ``countdown`` reward (RAGEN's 0 / 0.1 / 1.0 rule, safe parsing, garbage)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before datasets is imported: it reads the flag at import time

import json  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import datasets  # noqa: E402
import pytest  # noqa: E402

import rewards  # noqa: E402
from rewards.countdown import (  # noqa: E402
    equation_numbers,
    evaluate_equation,
    extract_equation,
    make_countdown,
    parse_equation,
    score_equation,
)
from trainer.data import DatasetUnavailableError, list_task_datasets, load_task_dataset  # noqa: E402
from trainer.data.countdown import COUNTDOWN_HUB_ID, COUNTDOWN_TEMPLATE, format_problem, solve  # noqa: E402

GOLD = json.dumps({"target": 24, "numbers": [3, 4, 5, 6], "solution": "((3 + 5) - 4) * 6"})
RIGHT, WRONG_VALUE = "(3 + 5 - 4) * 6", "3 + 4 + 5 + 6"


def _gold(row_answer: str) -> dict:
    return json.loads(row_answer)


def _user(messages: list[dict]) -> str:
    assert messages[-1]["role"] == "user"
    return messages[-1]["content"]


def _reward(completions, gold=GOLD, **options):
    f = rewards.get_reward("countdown", **options)
    return f(prompts=[[{"role": "user", "content": "p"}]] * len(completions), completions=completions,
             completion_ids=[[1]] * len(completions), answer=[gold] * len(completions))


# ----------------------------------------------------------------------------------------------- loader


def test_registered():
    assert "countdown" in list_task_datasets() and "countdown" in rewards.available()


def test_generator_is_deterministic():
    a = load_task_dataset("countdown", num_samples=50, seed=3)
    assert a.to_list() == load_task_dataset("countdown", num_samples=50, seed=3).to_list()
    assert a["answer"][:] != load_task_dataset("countdown", num_samples=50, seed=4)["answer"][:]
    assert a["answer"][:] != load_task_dataset("countdown", num_samples=50, seed=3, split="test")["answer"][:]
    # A longer run starts with the same rows: row i does not depend on num_samples.
    assert load_task_dataset("countdown", num_samples=80, seed=3)["answer"][:50] == a["answer"][:]


def test_generated_rows_are_solvable_and_solution_checks():
    ds = load_task_dataset("countdown", num_samples=200, num_numbers=[3, 4], seed=7)
    assert ds.column_names == ["prompt", "answer", "source"] and len(ds) == 200
    assert set(ds["source"]) == {"countdown"}
    sizes = Counter()
    for row in ds:
        g = _gold(row["answer"])
        target, numbers, solution = g["target"], g["numbers"], g["solution"]
        sizes[len(numbers)] += 1
        assert 1 <= target <= 1000 and all(1 <= n <= 99 for n in numbers)
        assert _user(row["prompt"]) == COUNTDOWN_TEMPLATE.format(problem=f"Target: {target}, nums: {numbers}")
        # The stored solution is a valid equation, uses each number once and hits the target exactly.
        assert Counter(equation_numbers(parse_equation(solution))) == Counter(numbers)
        assert evaluate_equation(solution) == target
        assert score_equation(solution, target, numbers) == 1.0
        assert solve(numbers, target) is not None  # the independent solver agrees
    assert set(sizes) == {3, 4}


def test_generator_options_and_validation():
    ds = load_task_dataset("countdown", num_samples=100, num_numbers=4, max_number=9, max_target=50, operators="+-")
    for a in ds["answer"]:
        g = _gold(a)
        assert len(g["numbers"]) == 4 and max(g["numbers"]) <= 9 and 1 <= g["target"] <= 50
        assert "*" not in g["solution"] and "/" not in g["solution"]
        assert evaluate_equation(g["solution"]) == g["target"]
    for bad in (dict(num_numbers=1), dict(num_numbers=[4, 3]), dict(num_numbers="3"), dict(operators="+^"),
                dict(operators=()), dict(min_number=0), dict(max_target=0), dict(num_samples=-1)):
        with pytest.raises(ValueError):
            load_task_dataset("countdown", **bad)
    with pytest.raises(TypeError, match="accepts"):
        load_task_dataset("countdown", num_number=3)


def test_common_kwargs():
    ds = load_task_dataset("countdown", num_samples=5, prompt_template="{problem}", system_prompt="Be terse.")
    assert len(ds) == 5
    for row in ds:
        g = _gold(row["answer"])
        assert row["prompt"] == [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": format_problem(g["target"], g["numbers"])},
        ]
        assert row["prompt"][1]["content"].startswith("Target: ") and ", nums: [" in row["prompt"][1]["content"]
    shuffled = load_task_dataset("countdown", num_samples=20, shuffle=True, seed=1)
    assert shuffled.to_list() == load_task_dataset("countdown", num_samples=20, shuffle=True, seed=1).to_list()
    # max_prompt_chars drops long prompts (the default template alone is > 300 chars).
    assert len(load_task_dataset("countdown", num_samples=5, max_prompt_chars=100)) == 0
    assert "kept 5 rows" in ds.info.description
    with pytest.raises(ValueError, match="prompt_template"):
        load_task_dataset("countdown", num_samples=2, prompt_template="Target {target}")


def test_solver():
    for numbers, target in [([3, 3, 8, 8], 24), ([1, 3, 4, 6], 24), ([5, 5, 5, 1], 24), ([44, 19, 35], 98),
                            ([2, 4], -2), ([7], 7), ([1, 2, 3], 1)]:
        eq = solve(numbers, target)
        assert eq is not None and evaluate_equation(eq) == target, (numbers, target, eq)
        assert Counter(equation_numbers(parse_equation(eq))) == Counter(numbers)
    assert solve([3, 3, 8, 8], 24) == "8 / (3 - (8 / 3))"  # needs a fractional intermediate
    assert solve([1, 1, 1, 1], 24) is None and solve([7], 8) is None and solve([], 0) is None
    assert solve([3, 4], 12, "+-") is None and solve([3, 4], 12) == "3 * 4"  # RAGEN's +/- filter
    assert solve([7, 11, 13, 17], 9973) is None  # exhaustive over 4 numbers, unsolvable
    with pytest.raises(ValueError, match="unsupported"):
        solve([1, 2], 3, "+^")


def _write(rows, path) -> str:
    if str(path).endswith(".parquet"):
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


# Rows in the Jiayi-Pan/Countdown-Tasks-3to4 schema (target: int64, nums: list<int64>).
JIAYI_ROWS = [
    {"target": 24, "nums": [3, 3, 8, 8]},  # needs * and /
    {"target": 98, "nums": [44, 19, 35]},  # +/- only
    {"target": 1000, "nums": [1, 2, 3]},  # unsolvable
    {"target": 5, "nums": [-1, 6]},  # a negative number cannot be written without unary minus: invalid
]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_local_file_jiayi_schema(tmp_path, suffix):
    path = _write(JIAYI_ROWS, tmp_path / f"countdown{suffix}")
    kw = dict(path=path, cache_dir=str(tmp_path / "cache"))
    ds = load_task_dataset("countdown", **kw)
    assert ds.column_names == ["prompt", "answer", "source"] and len(ds) == 2
    golds = [_gold(a) for a in ds["answer"]]
    assert [(g["target"], g["numbers"]) for g in golds] == [(24, [3, 3, 8, 8]), (98, [44, 19, 35])]
    for g in golds:
        assert evaluate_equation(g["solution"]) == g["target"]
    assert _user(ds[0]["prompt"]).startswith("Target: 24, nums: [3, 3, 8, 8]\n\n")
    assert "dropped 1 rows not solvable" in ds.info.description
    assert "dropped 1 rows with a non-integer target" in ds.info.description
    # RAGEN's filter: solvable with + and - only.
    plus_minus = load_task_dataset("countdown", operators="+-", **kw)
    assert [_gold(a)["target"] for a in plus_minus["answer"]] == [98]
    # Unchecked: the unsolvable row stays, with no reference solution.
    unchecked = load_task_dataset("countdown", require_solvable=False, **kw)
    assert [_gold(a)["target"] for a in unchecked["answer"]] == [24, 98, 1000]
    assert all(_gold(a)["solution"] is None for a in unchecked["answer"])
    assert len(load_task_dataset("countdown", num_samples=1, **kw)) == 1
    # split slicing works on local files (RAGEN uses the first 20,000 rows: split="train[:20000]").
    assert len(load_task_dataset("countdown", split="train[:2]", **kw)) == 2


def test_local_file_wrong_columns(tmp_path):
    path = _write([{"problem": "x", "answer": "1"}], tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match=r"missing expected column\(s\) \['target', 'nums'\]"):
        load_task_dataset("countdown", path=path, cache_dir=str(tmp_path / "c"))
    with pytest.raises(FileNotFoundError):
        load_task_dataset("countdown", path=str(tmp_path / "missing.parquet"))


def test_hub_id_offline_fails_fast(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(DatasetUnavailableError) as e:
        load_task_dataset("countdown", path=COUNTDOWN_HUB_ID, cache_dir=str(tmp_path / "empty_cache"))
    assert time.monotonic() - t0 < 20
    msg = str(e.value)
    assert COUNTDOWN_HUB_ID in msg and "HF_HUB_OFFLINE" in msg and "path=" in msg


# ----------------------------------------------------------------------------------------------- reward


@pytest.mark.parametrize(
    "completion,expected",
    [
        (f"<think>try things</think><answer>{RIGHT}</answer>", 1.0),
        ("<answer>6*(5+3-4)</answer>", 1.0),
        (f"<answer>\n {RIGHT} \n</answer>", 1.0),
        (f"<answer>{WRONG_VALUE}</answer>", 0.1),  # right numbers, wrong value (18)
        ("<answer>6 * 4 * (5 / 3)</answer>", 0.1),  # 40, exact division
        ("<answer>6 * 4 * (5 // 3)</answer>", 0.0),  # would be 24, but // is not allowed
        (f"<answer>{RIGHT} * 1</answer>", 0.0),  # an extra number
        ("<answer>(3 + 5) * 3</answer>", 0.0),  # numbers differ
        ("<answer>4 * 6</answer>", 0.0),  # not every number used
        (f"<answer>{RIGHT} = 24</answer>", 0.0),  # '=' is not part of an expression
        ("<answer>(-3 + 5 + 4) * 6</answer>", 0.0),  # unary minus
        ("<answer>(+3 + 5 - 4) * 6</answer>", 0.0),  # unary plus
        ("<answer>(3.0 + 5 - 4) * 6</answer>", 0.0),  # float literal
        ("<answer>(03 + 5 - 4) * 6</answer>", 0.0),  # leading zero: a syntax error in Python 3
        ("<answer>(3 + 5 - 4) ** 6</answer>", 0.0),
        ("<answer>(\u0663 + 5 - 4) * 6</answer>", 0.0),  # Arabic-Indic three
        ("<answer>(\uff13 + 5 - 4) * 6</answer>", 0.0),  # full-width three
        ("<answer>__import__('os').system('echo pwned')</answer>", 0.0),
        ("<answer>2**99999</answer>", 0.0),
        ("<answer>9**9**9**9</answer>", 0.0),
        ("<answer>1//1</answer>", 0.0),
        ("<answer>(3 + 5 - 4) * 6 if 1 else 0</answer>", 0.0),
        ("<answer>[3, 4, 5, 6]</answer>", 0.0),
        (RIGHT, 0.0),  # no answer tag
        ("<answer></answer>", 0.0),
        (f"<answer>{RIGHT}", 0.0),  # truncated: never closed
        # the think block is ignored, and an unclosed one leaves no answer
        (f"<think><answer>{RIGHT}</answer></think>I don't know", 0.0),
        (f"<think>maybe <answer>{WRONG_VALUE}</answer></think><answer>{RIGHT}</answer>", 1.0),
        (f"<think>cut off here <answer>{RIGHT}</answer>", 0.0),
        # the last complete answer wins
        (f"<answer>{RIGHT}</answer> wait, no: <answer>{WRONG_VALUE}</answer>", 0.1),
        (f"<answer>{WRONG_VALUE}</answer> wait, no: <answer>{RIGHT}</answer>", 1.0),
        (f"<answer>{RIGHT}</answer> and <answer>3 + 4", 1.0),
    ],
)
def test_reward_table(completion, expected):
    assert _reward([completion]) == [expected]


def test_reward_exact_arithmetic():
    gold = json.dumps({"target": 24, "numbers": [3, 3, 8, 8]})
    assert _reward(["<answer>8 / (3 - 8 / 3)</answer>"], gold) == [1.0]  # 24.000000000000007 in floats
    # RAGEN's float tolerance (1e-5) would accept this (1.000001); exact equality does not.
    near = json.dumps({"target": 1, "numbers": [999999, 1000000]})
    assert _reward(["<answer>1000000 / 999999</answer>"], near) == [0.1]
    zero = json.dumps({"target": 5, "numbers": [2, 2, 5]})
    assert _reward(["<answer>5 / (2 - 2)</answer>", "<answer>5 * (2 / 2)</answer>"], zero) == [0.0, 1.0]


def test_reward_garbage_never_raises_and_is_fast():
    deep = "(" * 10_000 + "1" + ")" * 10_000
    garbage = [
        "", None, 12345, "\x00\xff\ufffd", "🙂" * 1000, "<answer>🙂</answer>", "<answer>" * 10_000,
        "</answer>" * 10_000, "x" * 1_000_000, f"<answer>{deep}</answer>", "<answer>" + "1+" * 100_000 + "1</answer>",
        [{"role": "tool", "content": f"<answer>{RIGHT}</answer>"}],  # no assistant message
    ]
    assert _reward(garbage) == [0.0] * len(garbage)
    # Past the length cap too: the parser's own failures (nesting, recursion) are caught.
    for text in (deep, "1+" * 100_000 + "1", "-" * 10_000 + "1", "(" * 300):
        assert parse_equation(text, max_chars=None) is None or evaluate_equation(text, max_chars=None) is None
    assert extract_equation(None) is None and extract_equation("<answer> 1 + 2 </answer>") == "1 + 2"


def test_reward_options_and_registry():
    completions = [f"<answer>{RIGHT}</answer>", f"<answer>{WRONG_VALUE}</answer>", "<answer>4 * 6</answer>"]
    assert _reward(completions) == [1.0, 0.1, 0.0]
    assert _reward(completions, score=2.0, format_score=0.0) == [2.0, 0.0, 0.0]
    assert make_countdown(score=5, format_score=-1)(None, completions, answer=[GOLD] * 3) == [5.0, -1.0, 0.0]
    # A recipe's reward_timeout is not a countdown option: ignored, the default reward comes back.
    assert rewards.get_reward("countdown", timeout=2.0) is rewards.get_reward("countdown")


def test_reward_chat_messages():
    completions = [
        [{"role": "assistant", "content": f"<think>x</think><answer>{RIGHT}</answer>"}],
        [{"role": "assistant", "content": [{"type": "text", "text": f"<answer>{WRONG_VALUE}</answer>"}]}],
        # TRL split the reasoning off: it becomes a think block again, so an answer in it is ignored
        [{"role": "assistant", "reasoning_content": f"<answer>{RIGHT}</answer>", "content": "no idea"}],
        [{"role": "assistant", "reasoning_content": "hmm", "content": f"<answer>{RIGHT}</answer>"}],
        [{"role": "assistant", "content": None}],
    ]
    assert _reward(completions) == [1.0, 0.1, 0.0, 1.0, 0.0]


def test_reward_gold_errors():
    f = rewards.get_reward("countdown")
    assert f(None, ["<answer>1 + 2</answer>"], answer=[{"target": 3, "numbers": [2, 1]}]) == [1.0]  # a dict
    with pytest.raises(KeyError, match="answer"):
        f(None, ["<answer>1</answer>"])
    with pytest.raises(ValueError, match="entries"):
        f(None, ["<answer>1</answer>"], answer=[GOLD, GOLD])
    for bad in ("24", "not json", json.dumps({"target": "24", "numbers": [1]}), json.dumps({"numbers": [1]})):
        with pytest.raises(ValueError, match="countdown JSON"):
            f(None, ["<answer>1</answer>"], answer=[bad])


def test_dataset_to_reward_end_to_end():
    """Rows from the loader, scored through the registry with TRL's keyword convention."""
    ds = load_task_dataset("countdown", num_samples=16, num_numbers=[3, 4], seed=11)
    f = rewards.get_reward("countdown")
    right = [f"<think>...</think>\n<answer> {_gold(a)['solution']} </answer>" for a in ds["answer"]]
    wrong = [f"<answer>{' + '.join(map(str, _gold(a)['numbers']))} + 0</answer>" for a in ds["answer"]]
    kw = dict(prompts=ds["prompt"][:], completion_ids=[[0]] * len(ds), answer=ds["answer"][:],
              source=ds["source"][:], trainer_state=None)
    assert f(completions=right, **kw) == [1.0] * len(ds)
    assert f(completions=wrong, **kw) == [0.0] * len(ds)
