"""trainer.data: task-dataset loaders on local files with the real hub schemas, offline."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before datasets is imported: it reads the flag at import time

import logging  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
from harness import write_rows  # noqa: E402

from trainer.data import (  # noqa: E402
    DAPO_TEMPLATE,
    DatasetUnavailableError,
    list_task_datasets,
    load_task_dataset,
    strip_dapo_instruction,
)

PROBLEMS = [
    ("What is $1+1$?", "2"),
    ("Find the number of positive divisors of $36$.", "9"),
    ("Let $x^2 = 49$ with $x > 0$. Find $x$.", "7"),
    ("Compute $\\binom{5}{2}$.", "10"),  # braces in the problem must survive str.format
    ("How many primes are below 20?", "8"),
]


def _dapo_rows(copies: int = 3) -> list[dict]:
    """Rows in the real DAPO-Math-17k schema; the copies interleave like the hub's 100x repetition and
    carry distinct extra_info.index values (so index cannot be the dedup key)."""
    rows = []
    for c in range(copies):
        for i, (problem, gold) in enumerate(PROBLEMS):
            rows.append(
                {
                    "data_source": "math_dapo",
                    "prompt": [{"content": DAPO_TEMPLATE.format(problem=problem), "role": "user"}],
                    "ability": "MATH",
                    "reward_model": {"ground_truth": gold, "style": "rule-lighteval/MATH_v2"},
                    "extra_info": {"index": f"idx-{c}-{i}"},
                }
            )
    return rows




def _user(messages: list[dict]) -> str:
    assert messages[-1]["role"] == "user"
    return messages[-1]["content"]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_dapo_dedup_strip_and_rewrap(tmp_path, suffix, caplog):
    path = write_rows(_dapo_rows(3), tmp_path / f"dapo{suffix}")
    with caplog.at_level(logging.INFO, logger="trainer.data"):
        ds = load_task_dataset("dapo_math_17k", path=path, cache_dir=str(tmp_path / "cache"),
                               prompt_template=DAPO_TEMPLATE, system_prompt=None)
    assert ds.column_names == ["prompt", "answer", "source"]
    assert len(ds) == 5
    assert ds["answer"][:] == [g for _, g in PROBLEMS]  # first occurrences, original order
    assert set(ds["source"]) == {"dapo_math_17k"}
    for row, (problem, _) in zip(ds, PROBLEMS):
        assert row["prompt"] == [{"role": "user", "content": DAPO_TEMPLATE.format(problem=problem)}]
        assert strip_dapo_instruction(row["prompt"][0]["content"]) == problem
    assert "dropped 10 duplicates" in ds.info.description
    assert "10 duplicates dropped" in caplog.text
    # The raw problem really was unwrapped: a bare template gives it back alone.
    bare = load_task_dataset(
        "dapo_math_17k", path=path, prompt_template="{problem}", cache_dir=str(tmp_path / "cache")
    )
    assert [_user(p) for p in bare["prompt"]] == [p for p, _ in PROBLEMS]


# The GRPODropout authors' training rows 0 and 5 as their prepare script wrote them
# (hexuandeng/GRPODropout@4ad3b3b:data/dapo17k/dapo17k_verl_train_view.json): system prompt + raw problem.
AUTHORS_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
AUTHORS_ROWS = [
    ("Let $S$ be the set of triples $(a,b,c)$ of non-negative integers such that $a+b+c$ is even. The value of the "
     "sum\n\\[ \\sum_{(a,b,c) \\in S} \\frac{1}{2^a 3^b 5^c} \\]\ncan be expressed as $\\frac{m}{n}$, where $m$ and "
     "$n$ are relatively prime positive integers. Compute $m+n$.", "37"),
    ("For which $n$ is $n^4 + 6n^3 + 11n^2 + 3n + 31$ a perfect square?", "10"),
]


@pytest.mark.parametrize("wrapped", [False, True])
def test_dapo_default_prompt_is_the_grpodropout_authors(tmp_path, wrapped):
    """Default loader output = the authors' training messages, byte for byte, from a Processed-schema copy whose
    prompt is the raw problem or still carries DAPO's "Answer:" wrapper (both circulate)."""
    rows = [{"prompt": DAPO_TEMPLATE.format(problem=p) if wrapped else p, "solution": g} for p, g in AUTHORS_ROWS]
    ds = load_task_dataset(
        "dapo_math_17k", path=write_rows(rows, tmp_path / "en.parquet"), cache_dir=str(tmp_path / "c")
    )
    assert ds["prompt"][:] == [[{"role": "system", "content": AUTHORS_SYSTEM}, {"role": "user", "content": p}]
                               for p, _ in AUTHORS_ROWS]
    assert ds["answer"][:] == [g for _, g in AUTHORS_ROWS]


def test_dapo_default_view_is_processed_en(tmp_path):
    """The hub view the recipes train on: open-r1's Processed repo, English config (offline: the error names both)."""
    with pytest.raises(DatasetUnavailableError, match=r"open-r1/DAPO-Math-17k-Processed.*config='en'"):
        load_task_dataset("dapo_math_17k", cache_dir=str(tmp_path / "empty_cache"))


def test_dapo_expected_rows_guards_the_view(tmp_path):
    path = write_rows(_dapo_rows(2), tmp_path / "d.parquet")  # 10 rows read, 5 after deduplication
    kw = dict(path=path, cache_dir=str(tmp_path / "c"))
    assert len(load_task_dataset("dapo_math_17k", expected_rows=10, **kw)) == 5
    with pytest.raises(ValueError, match=r"expected_rows=14116 but .* has 10 rows"):
        load_task_dataset("dapo_math_17k", expected_rows=14116, **kw)


def test_dapo_dedup_on_text_not_index(tmp_path):
    rows = _dapo_rows(1)
    # Same index, different problem -> both kept; an unwrapped copy of a wrapped problem -> dropped.
    rows[1]["extra_info"]["index"] = rows[0]["extra_info"]["index"]
    rows.append(dict(rows[2], prompt=[{"content": PROBLEMS[2][0], "role": "user"}]))
    ds = load_task_dataset("dapo_math_17k", path=write_rows(rows, tmp_path / "d.jsonl"), cache_dir=str(tmp_path / "c"))
    assert len(ds) == 5 and "dropped 1 duplicates" in ds.info.description


def test_dapo_processed_schema(tmp_path):
    # open-r1's create_dataset.py: prompt = source_prompt[0]["content"] (still wrapped), solution = gold.
    rows = [
        {
            "prompt": r["prompt"][0]["content"],
            "solution": r["reward_model"]["ground_truth"],
            "data_source": r["data_source"],
            "source_prompt": r["prompt"],
            "ability": r["ability"],
            "reward_model": r["reward_model"],
            "extra_info": r["extra_info"],
        }
        for r in _dapo_rows(2)
    ]
    ds = load_task_dataset(
        "dapo_math_17k",
        path=write_rows(rows, tmp_path / "p.parquet"),
        cache_dir=str(tmp_path / "c"),
        prompt_template="{problem}",
    )
    assert [_user(p) for p in ds["prompt"]] == [p for p, _ in PROBLEMS]
    assert ds["answer"][:] == [g for _, g in PROBLEMS]
    assert "processed schema" in ds.info.description


def test_deepmath_difficulty_range(tmp_path):
    rows = [
        {"question": f"Q{d}", "final_answer": f"A{d}", "difficulty": d, "topic": "Mathematics -> Algebra",
         "r1_solution_1": "s", "r1_solution_2": "s", "r1_solution_3": "s"}
        for d in (4.0, 5.0, 5.5, 6.5, 7.0, 7.5, 9.0)
    ]
    path = write_rows(rows, tmp_path / "deepmath.parquet")
    ds = load_task_dataset(
        "deepmath_103k", path=path, min_difficulty=5, max_difficulty=7, cache_dir=str(tmp_path / "c")
    )
    assert ds["answer"][:] == ["A5.0", "A5.5", "A6.5", "A7.0"]  # inclusive at both ends
    assert "\\boxed{}" in _user(ds[0]["prompt"]) and _user(ds[0]["prompt"]).startswith("Q5.0")
    assert len(load_task_dataset("deepmath_103k", path=path, min_difficulty=7.5, cache_dir=str(tmp_path / "c"))) == 2
    assert len(load_task_dataset("deepmath_103k", path=path, cache_dir=str(tmp_path / "c"))) == 7
    no_diff = write_rows([{k: v for k, v in r.items() if k != "difficulty"} for r in rows], tmp_path / "nd.jsonl")
    with pytest.raises(ValueError, match="difficulty"):
        load_task_dataset("deepmath_103k", path=no_diff, max_difficulty=7, cache_dir=str(tmp_path / "c"))


def test_json_loader_custom_and_default_columns(tmp_path):
    rows = [{"q": "2+2?", "gold": 4}, {"q": "3*3?", "gold": 9}, {"q": "no gold", "gold": None}]
    path = write_rows(rows, tmp_path / "mine.jsonl")
    ds = load_task_dataset("json", path=path, problem_column="q", answer_column="gold", cache_dir=str(tmp_path / "c"))
    assert ds["answer"][:] == ["4", "9"]  # numbers become strings; the row without gold is dropped
    assert set(ds["source"]) == {"mine"} and _user(ds[0]["prompt"]).startswith("2+2?")
    q = write_rows([{"question": "Why?", "answer": "because"}], tmp_path / "qa.json")
    assert _user(load_task_dataset("json", path=q, cache_dir=str(tmp_path / "c"))[0]["prompt"]).startswith("Why?")


def _expression(messages: list[dict]) -> str:
    return re.fullmatch(r"What is (.+)\? Be brief.*", _user(messages), re.S).group(1)


def test_arithmetic_seeded_and_correct():
    a = load_task_dataset("arithmetic", num_samples=50, seed=3)
    assert a.to_list() == load_task_dataset("arithmetic", num_samples=50, seed=3).to_list()
    assert a["prompt"][:] != load_task_dataset("arithmetic", num_samples=50, seed=4)["prompt"][:]
    assert a["prompt"][:] != load_task_dataset("arithmetic", num_samples=50, seed=3, split="test")["prompt"][:]
    assert len(load_task_dataset("arithmetic")) == 1000
    for row in a:
        expr = _expression(row["prompt"])
        nums = [int(t) for t in expr.split()[::2]]
        assert len(nums) == 2 and all(0 <= n <= 9 for n in nums) and set(expr.split()[1::2]) <= {"+", "-"}
        assert row["answer"] == str(eval(expr)) and int(row["answer"]) >= 0  # noqa: S307 - our own expression
        assert "\\boxed{}" in _user(row["prompt"])


def test_arithmetic_difficulty_knobs():
    ds = load_task_dataset(
        "arithmetic", num_samples=200, num_operands=4, max_value=50, operators=("*", "-"), allow_negative=True
    )
    ops_seen = set()
    for row in ds:
        toks = _expression(row["prompt"]).split()
        assert len(toks) == 7 and all(0 <= int(n) <= 50 for n in toks[::2])
        ops_seen |= set(toks[1::2])
        assert row["answer"] == str(eval(" ".join(toks)))  # noqa: S307 - precedence: * before -
    assert ops_seen == {"*", "-"}
    assert any(int(a) < 0 for a in ds["answer"])
    with pytest.raises(ValueError, match="operators"):
        load_task_dataset("arithmetic", operators=("/",))
    with pytest.raises(ValueError, match="num_operands"):
        load_task_dataset("arithmetic", num_operands=1)


def test_champ_offline():
    ds = load_task_dataset("champ")
    assert len(ds) == 270 and ds.column_names == ["prompt", "answer", "source"]
    assert all(a.strip() for a in ds["answer"]) and "@@" not in "".join(ds["answer"])
    assert ds[0]["answer"] == "239" and "\\boxed{}" in _user(ds[0]["prompt"])
    numeric = load_task_dataset("champ", numeric_only=True)
    assert 0 < len(numeric) < 270 and all(re.fullmatch(r"-?\d+(\.\d+)?(/\d+)?", a) for a in numeric["answer"])
    assert len(load_task_dataset("champ", categories=["Combinatorics"])) == 40


def test_missing_column_message(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "reward_model"} for r in _dapo_rows(1)]
    with pytest.raises(ValueError) as e:
        load_task_dataset(
            "dapo_math_17k", path=write_rows(rows, tmp_path / "bad.parquet"), cache_dir=str(tmp_path / "c")
        )
    msg = str(e.value)
    assert "dapo_math_17k" in msg and "'reward_model'" in msg and "columns found" in msg and "extra_info" in msg
    with pytest.raises(ValueError, match=r"missing expected column\(s\) \['answer'\].*columns found: \['problem'\]"):
        load_task_dataset(
            "json", path=write_rows([{"problem": "x"}], tmp_path / "x.jsonl"), cache_dir=str(tmp_path / "c")
        )


def test_system_prompt_placement():
    ds = load_task_dataset("arithmetic", num_samples=3, system_prompt="You are terse.")
    for p in ds["prompt"]:
        assert [m["role"] for m in p] == ["system", "user"] and p[0]["content"] == "You are terse."
    for sp in (None, ""):
        messages = load_task_dataset("arithmetic", num_samples=3, system_prompt=sp)[0]["prompt"]
        assert [m["role"] for m in messages] == ["user"]


def test_sampling_filters_and_templates(tmp_path):
    path = write_rows(_dapo_rows(2), tmp_path / "d.parquet")
    kw = dict(path=path, cache_dir=str(tmp_path / "c"), prompt_template="{problem}", system_prompt=None)
    first2 = load_task_dataset("dapo_math_17k", num_samples=2, **kw)
    assert first2["answer"][:] == ["2", "9"]
    s1 = load_task_dataset("dapo_math_17k", num_samples=3, shuffle=True, seed=1, **kw)
    assert s1.to_list() == load_task_dataset("dapo_math_17k", num_samples=3, shuffle=True, seed=1, **kw).to_list()
    assert set(s1["answer"]) <= {g for _, g in PROBLEMS}
    short = load_task_dataset("dapo_math_17k", max_prompt_chars=30, **kw)
    assert [_user(p) for p in short["prompt"]] == [p for p, _ in PROBLEMS if len(p) <= 30]
    with pytest.raises(ValueError, match="prompt_template"):
        load_task_dataset("arithmetic", prompt_template="no placeholder")
    with pytest.raises(ValueError, match="doubled"):
        load_task_dataset("arithmetic", prompt_template="{problem} in \\boxed{}")


def test_registry_errors(tmp_path):
    assert {"dapo_math_17k", "deepmath_103k", "json", "arithmetic", "champ"} <= set(list_task_datasets())
    with pytest.raises(ValueError, match="registered"):
        load_task_dataset("gsm9k")
    with pytest.raises(TypeError, match="num_operand"):
        load_task_dataset("arithmetic", num_operand=3)
    with pytest.raises(FileNotFoundError):
        load_task_dataset("json", path=str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize(
    "name,hub_id",
    [("dapo_math_17k", "open-r1/DAPO-Math-17k-Processed"), ("deepmath_103k", "zwhe99/DeepMath-103K")],
)
def test_hub_id_offline_fails_fast(tmp_path, name, hub_id):
    # An empty cache_dir guarantees "not cached" even on a machine that once downloaded the dataset.
    t0 = time.monotonic()
    with pytest.raises(DatasetUnavailableError) as e:
        load_task_dataset(name, cache_dir=str(tmp_path / "empty_cache"))
    assert time.monotonic() - t0 < 20
    msg = str(e.value)
    assert hub_id in msg and "HF_HUB_OFFLINE" in msg and "path=" in msg
