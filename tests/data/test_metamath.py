"""trainer.data metamathqa loader: MetaMathQA rows from a local fixture in the real hub schema, offline."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before datasets is imported: it reads the flag at import time

import logging  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
from harness import write_rows  # noqa: E402

from trainer.data import DatasetUnavailableError, list_task_datasets, load_task_dataset  # noqa: E402
from trainer.data.metamath import METAMATH_TEMPLATE, extract_metamath_answer, load_metamathqa  # noqa: E402

JANET = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
    "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck "
    "egg. How much in dollars does she make every day at the farmers' market?"
)

# (query, response, type, original_question) in MetaMathQA's shape: the response's last line is the label.
ROWS = [
    (
        "What is the value of $\\frac{1}{4} + \\frac{1}{4}$?",
        "Adding the fractions gives $\\frac{1}{4} + \\frac{1}{4} = \\frac{2}{4} = \\boxed{\\frac{1}{2}}$.\n"
        "The answer is: \\frac{1}{2}",
        "MATH_AnsAug",
        "What is $\\frac{1}{4} + \\frac{1}{4}$?",
    ),
    (
        "Janet has 16 eggs a day, eats 3 and bakes with 4. At $2 an egg, how much does she make daily?",
        "She has 16 - 3 - 4 = 9 eggs left.\nShe makes 9 * $2 = $18.\n#### 18\nThe answer is: 18  ",
        "GSM_Rephrased",
        JANET,
    ),
    (
        JANET,
        "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18 every day.\n#### 18\n"
        "The answer is: 18\n",
        "GSM_AnsAug",
        JANET,  # same original_question as the row above
    ),
    (
        "If $x^2 = 49$ and $x > 0$, what is the value of $x$?",
        "Taking the positive square root, $x = \\boxed{7}$.",  # no "The answer is:" line: dropped
        "MATH_AnsAug",
        "Let $x^2 = 49$ with $x > 0$. Find $x$.",
    ),
    (
        "A number X is doubled to give 14. What is the value of unknown variable X?",
        "We have 2X = 14, so X = 7.\nThe answer is: 7\nThis explanation continues after the label.",  # not last
        "GSM_SV",
        "A number is doubled to give 14. What is the number?",
    ),
    (
        "Simplify $\\sqrt{50}$.",
        "$\\sqrt{50} = \\sqrt{25 \\cdot 2} = 5\\sqrt{2}$.\nThe answer is:  5\\sqrt{2} \t\n\n",
        "MATH_Rephrased",
        "Simplify $\\sqrt{50}$.",
    ),
]
KEPT = [0, 1, 2, 5]  # rows with a parsable last line
GOLD = {0: "\\frac{1}{2}", 1: "18", 2: "18", 5: "5\\sqrt{2}"}


def _write(path, rows=ROWS) -> str:
    return write_rows([dict(zip(("query", "response", "type", "original_question"), r)) for r in rows], path)


@pytest.fixture(params=["jsonl", "parquet"])
def fixture_path(request, tmp_path):
    return _write(tmp_path / f"metamath.{request.param}")


def _load(path, tmp_path, **kw):
    return load_task_dataset("metamathqa", path=path, cache_dir=str(tmp_path / "cache"), **kw)


def _user(prompt):
    return prompt[-1]["content"]


def test_registered_and_column_contract(fixture_path, tmp_path):
    assert "metamathqa" in list_task_datasets()
    ds = _load(fixture_path, tmp_path)
    assert ds.column_names == ["prompt", "answer", "source"] and len(ds) == len(KEPT)
    assert set(ds["source"]) == {"metamathqa"}
    for row, i in zip(ds, KEPT):
        assert [m["role"] for m in row["prompt"]] == ["user"]
        assert _user(row["prompt"]) == METAMATH_TEMPLATE.format(problem=ROWS[i][0])
        assert _user(row["prompt"]).endswith("put your final answer within \\boxed{}.")
    custom = _load(fixture_path, tmp_path, prompt_template="Q: {problem}", system_prompt="Be brief.", source="mm")
    assert _user(custom[0]["prompt"]) == "Q: " + ROWS[0][0] and custom[0]["prompt"][0]["content"] == "Be brief."
    assert set(custom["source"]) == {"mm"}


def test_answer_extraction(fixture_path, tmp_path):
    ds = _load(fixture_path, tmp_path)
    assert ds["answer"] == [GOLD[i] for i in KEPT]  # LaTeX intact, trailing spaces/tabs/newlines stripped
    assert extract_metamath_answer("a\nThe answer is: \\frac{3}{4} \n") == "\\frac{3}{4}"
    assert extract_metamath_answer("The answer is: 1\nThe answer is: 2") == "2"  # last line wins
    assert extract_metamath_answer("The answer is: 2\nmore text") is None  # label not on the last line
    assert extract_metamath_answer("The answer is:   ") is None  # empty label
    assert extract_metamath_answer("The answer is:5") is None  # RAGEN's pattern needs ": "
    assert extract_metamath_answer(None) is None
    assert extract_metamath_answer("The answer is: {x | x > 0}") == "{x | x > 0}"


def test_dropped_count_in_description(fixture_path, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainer.data"):
        ds = _load(fixture_path, tmp_path)
    desc = ds.info.description
    assert desc.startswith("metamathqa: ") and "read 6 rows" in desc
    assert "dropped 2 rows without a parsable 'The answer is:' last line" in desc and "kept 4 rows" in desc
    assert any("dropped 2 rows" in r.getMessage() for r in caplog.records)


def test_types_filter_and_error(fixture_path, tmp_path):
    ds = _load(fixture_path, tmp_path, types=["GSM_Rephrased", "MATH_AnsAug"])
    assert ds["answer"] == [GOLD[0], GOLD[1]]  # the MATH_AnsAug row without a label is still dropped
    assert "3 rows of types ['GSM_Rephrased', 'MATH_AnsAug']" in ds.info.description
    assert _load(fixture_path, tmp_path, types="GSM_AnsAug")["prompt"][0][-1]["content"].startswith(JANET)
    with pytest.raises(ValueError) as e:
        _load(fixture_path, tmp_path, types=["GSM_AnsAug", "MATH_FOBAR"])
    msg = str(e.value)
    assert "['MATH_FOBAR']" in msg
    assert "['GSM_AnsAug', 'GSM_Rephrased', 'GSM_SV', 'MATH_AnsAug', 'MATH_Rephrased']" in msg
    with pytest.raises(ValueError, match="non-empty"):
        _load(fixture_path, tmp_path, types=[])


def test_dedupe_original(fixture_path, tmp_path):
    ds = _load(fixture_path, tmp_path, dedupe_original=True)
    assert [_user(p) for p in ds["prompt"]] == [METAMATH_TEMPLATE.format(problem=ROWS[i][0]) for i in (0, 1, 5)]
    assert "dropped 1 rows repeating an original_question" in ds.info.description
    # After the type filter the GSM_AnsAug row is the first (only) one of its original question.
    only = _load(fixture_path, tmp_path, types=["GSM_AnsAug"], dedupe_original=True)
    assert len(only) == 1 and _user(only[0]["prompt"]).startswith(JANET)
    # The first augmentation of an original question without a label does not hide a later one with one.
    rows = [ROWS[3], (ROWS[3][0] + " ", "x = 7.\nThe answer is: 7", "MATH_Rephrased", ROWS[3][3])]
    ds2 = _load(_write(tmp_path / "unlabelled_first.jsonl", rows), tmp_path, dedupe_original=True)
    assert ds2["answer"] == ["7"]
    # Default: duplicates kept.
    assert len(_load(fixture_path, tmp_path)) == len(KEPT)


def test_common_kwargs_and_missing_columns(fixture_path, tmp_path):
    kw = dict(num_samples=2, shuffle=True, seed=3)
    a = _load(fixture_path, tmp_path, **kw)
    assert len(a) == 2 and a.to_list() == _load(fixture_path, tmp_path, **kw).to_list()
    assert _load(fixture_path, tmp_path, num_samples=1)["answer"] == [GOLD[0]]
    short = _load(fixture_path, tmp_path, prompt_template="{problem}", max_prompt_chars=40)
    assert [_user(p) for p in short["prompt"]] == [ROWS[i][0] for i in KEPT if len(ROWS[i][0]) <= 40]
    with pytest.raises(ValueError, match=r"missing expected column\(s\) \['response'\]"):
        _load(_write(tmp_path / "bad.jsonl", [r[:1] for r in ROWS]), tmp_path)
    # type / original_question are only required by the options that read them.
    two_cols = _write(tmp_path / "two.parquet", [r[:2] for r in ROWS])
    assert len(load_metamathqa(two_cols, cache_dir=str(tmp_path / "cache"))) == len(KEPT)
    with pytest.raises(ValueError, match=r"\['original_question'\]"):
        _load(two_cols, tmp_path, dedupe_original=True)


def test_hub_id_offline_fails_fast(tmp_path):
    # An empty cache_dir guarantees "not cached" even on a machine that once downloaded the dataset.
    t0 = time.monotonic()
    with pytest.raises(DatasetUnavailableError) as e:
        load_task_dataset("metamathqa", cache_dir=str(tmp_path / "empty_cache"))
    assert time.monotonic() - t0 < 20
    msg = str(e.value)
    assert "meta-math/MetaMathQA" in msg and "HF_HUB_OFFLINE" in msg and "path=" in msg
