"""trainer.eval benchmarks and grading: hub-schema fixtures offline, prompts, option letters, correctness."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before datasets is imported: it reads the flag at import time

import re  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
from harness import write_rows  # noqa: E402

from trainer.eval.benchmarks import (  # noqa: E402
    BENCHMARKS,
    CHOICE_PROMPT,
    MATH_PROMPT,
    DatasetUnavailableError,
    EvalItem,
    load_benchmark,
    render_prompt,
)
from trainer.eval.grading import extract_choice, extract_final_answer, grade  # noqa: E402

LIMIT = 2.0  # per-item verification limit in these tests




# ----------------------------------------------------------------------------- fixtures in the hub schemas
# Each entry: hub schema rows, file suffix, and the expected (id, question prefix, gold, choices) per item.

ARC_CHOICES_4 = ["Planetary density will decrease.", "Planetary years will become longer.",
                 "Planetary days will become shorter.", "Planetary gravity will become stronger."]  # fmt: skip
MMLU_OPTIONS = ["Safe practices, Fear, Jealousy, Trivial", "Unsafe practices, Distress, Joy, Trivial",
                "Safe practices, Wants, Jealousy, Trivial", "Safe practices, Distress, Fear, Trivial",
                "Unsafe practices, Wants, Jealousy, Serious", "Safe practices, Distress, Jealousy, Serious",
                "Safe practices, Wants, Fear, Serious", "Unsafe practices, Wants, Fear, Trivial",
                "Unsafe practices, Distress, Fear, Serious", "Unsafe practices, Fear, Jealousy, Serious"]  # fmt: skip

FIXTURES = {
    "gsm8k": (
        [
            {"question": "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
                         "muffins for her friends every day with four. She sells the remainder at the farmers' market "
                         "daily for $2 per fresh duck egg. How much in dollars does she make every day?",
             "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 "
                       "every day at the farmer's market.\n#### 18"},
            {"question": "Josh buys a house for $80,000 and puts in $50,000 in repairs. This increased the value of "
                         "the house by 150%. How much profit did he make?",
             "answer": "The cost of the house and repairs came out to 80,000+50,000=$<<80000+50000=130000>>130,000\n"
                       "He increased the value by 80,000*1.5=<<80000*1.5=120000>>120,000\nSo the new value is "
                       "120,000+80,000=$<<120000+80000=200000>>200,000\nSo he made a profit of "
                       "200,000-130,000=$<<200000-130000=70000>>70,000\n#### 70,000"},
        ],
        ".jsonl",
        [("gsm8k-0", "Janet's ducks", "18", ()), ("gsm8k-1", "Josh buys", "70000", ())],
    ),
    "math500": (
        [
            {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your "
                        "answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$",
             "solution": "We have that $r = \\sqrt{0^2 + 3^2} = 3.$ ... "
                         "$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
             "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
             "unique_id": "test/precalculus/807.json"},
            {"problem": "If $f(x) = \\frac{3x-2}{x-2}$, what is the value of $f(-2) +f(-1)+f(0)$? Express your "
                        "answer as a common fraction.",
             "solution": "... $\\boxed{\\frac{14}{3}}$.", "answer": "\\frac{14}{3}", "subject": "Algebra",
             "level": 3, "unique_id": "test/algebra/2584.json"},
        ],
        ".parquet",
        [("test/precalculus/807.json", "Convert the point", "\\left( 3, \\frac{\\pi}{2} \\right)", ()),
         ("test/algebra/2584.json", "If $f(x)", "\\frac{14}{3}", ())],
    ),
    "olympiadbench": (
        [
            {"id": 1606, "subfield": "Combinatorics", "context": None, "is_multiple_answer": False,
             "question": "Let $T=8$. A cube has edges of length $T$. Compute the number of unit cubes that touch "
                         "at least one face of the large cube.",
             "solution": ["The interior has $(T-2)^3$ cubes..."], "final_answer": ["$296$"], "unit": None,
             "answer_type": "Numerical", "error": None, "question_type": "Open-ended", "subject": "Math",
             "language": "English", "modality": "Text-only"},
            {"id": 2231, "subfield": "Algebra", "context": None, "is_multiple_answer": True,
             "question": "Find all real numbers $x$ such that $x^2-2x-3=0$.",
             "solution": ["Factor: $(x-3)(x+1)=0$."], "final_answer": ["$-1$", "$3$"], "unit": None,
             "answer_type": "Numerical", "error": None, "question_type": "Open-ended", "subject": "Math",
             "language": "English", "modality": "Text-only"},
            {"id": 2500, "subfield": "Algebra", "context": None, "is_multiple_answer": False,
             "question": "Compute the probability that a fair coin shows heads twice in two tosses.",
             "solution": ["Independent tosses."], "final_answer": ["$\\frac{1}{4}$"], "unit": None,
             "answer_type": "Numerical", "error": None, "question_type": "Open-ended", "subject": "Math",
             "language": "English", "modality": "Text-only"},
        ],
        ".parquet",
        [("1606", "Let $T=8$", "296", ()), ("2231", "Find all real", "-1, 3", ()),
         ("2500", "Compute the probability", "\\frac{1}{4}", ())],
    ),
    "amc23": (
        [
            {"id": 0, "question": "Cities $A$ and $B$ are $45$ miles apart. Alicia lives in $A$ and Beth lives in "
                                  "$B$. Alicia bikes towards $B$ at 18 miles per hour. Leaving at the same time, Beth "
                                  "bikes toward $A$ at 12 miles per hour. How many miles from City $A$ will they be "
                                  "when they meet?",
             "answer": 27.0, "url": "https://artofproblemsolving.com/wiki/index.php/2023_AMC_12A_Problems/Problem_1"},
            {"id": 1, "question": "Positive real numbers $x$ and $y$ satisfy $y^3=x^2$ and $(y-x)^2=4y^2$. What is "
                                  "$x+y$?",
             "answer": 36.0, "url": "https://artofproblemsolving.com/wiki/index.php/2023_AMC_12A_Problems/Problem_2"},
            {"id": 2, "question": "What is half of five?", "answer": 2.5, "url": "synthetic"},
        ],
        ".jsonl",
        [("0", "Cities $A$", "27", ()), ("1", "Positive real", "36", ()), ("2", "What is half", "2.5", ())],
    ),
    "aime24": (
        [
            {"id": 60, "problem": "Every morning Aya goes for a $9$-kilometer-long walk and stops at a coffee shop "
                                  "afterwards. ... Find the number of minutes the walk takes her.",
             "solution": "...", "answer": "204",
             "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1", "year": "2024"},
            {"id": 61, "problem": "Let $ABC$ be a triangle inscribed in circle $\\omega$. ... Find $m + n$.",
             "solution": "...", "answer": "113",
             "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_2", "year": "2024"},
        ],
        ".parquet",
        [("60", "Every morning Aya", "204", ()), ("61", "Let $ABC$", "113", ())],
    ),
    "aime25": (
        [
            {"problem_idx": 1, "problem": "Find the sum of all integer bases $b>9$ for which $17_b$ is a divisor of "
                                          "$97_b$.", "answer": 70, "problem_type": ["Number Theory"]},
            {"problem_idx": 2, "problem": "On $\\triangle ABC$ points $A, D, E, B$ lie in that order on side "
                                          "$\\overline{AB}$ ... Find the area of the heptagon $AFNBCEM$.",
             "answer": 588, "problem_type": ["Geometry"]},
        ],
        ".parquet",
        [("1", "Find the sum", "70", ()), ("2", "On $\\triangle", "588", ())],
    ),
    "hmmt25_feb": (
        [
            {"problem_idx": 1, "problem": "Compute the sum of the positive divisors (including $1$) of $9!$ that "
                                          "have units digit $1$.", "answer": "103", "problem_type": ["Number Theory"]},
            {"problem_idx": 2, "problem": "Let $a$ and $b$ be positive reals with $ab = 23$ ... Compute $a$.",
             "answer": "\\frac{9 \\sqrt{23}}{23}", "problem_type": ["Algebra"]},
        ],
        ".jsonl",
        [("1", "Compute the sum", "103", ()), ("2", "Let $a$", "\\frac{9 \\sqrt{23}}{23}", ())],
    ),
    "hmmt25_nov": (
        [
            {"problem_idx": 1, "problem": "Compute the number of ordered pairs $(a,b)$ of positive integers with "
                                          "$a+b=10$.", "answer": "9", "problem_type": ["Combinatorics"]},
            {"problem_idx": 2, "problem": "Compute $\\sqrt{2}\\cdot\\sqrt{8}$.", "answer": "4",
             "problem_type": ["Algebra"]},
        ],
        ".parquet",
        [("1", "Compute the number", "9", ()), ("2", "Compute $\\sqrt", "4", ())],
    ),
    "arc_c": (
        [
            {"id": "Mercury_7175875", "question": "An astronomer observes that a planet rotates faster after a "
                                                  "meteorite impact. Which is the most likely effect of this increase "
                                                  "in rotation?",
             "choices": {"text": ARC_CHOICES_4, "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
            {"id": "NYSEDREGENTS_2015_4_8", "question": "Which object is the best conductor of electricity?",
             "choices": {"text": ["a wax crayon", "a plastic spoon", "a rubber eraser", "an iron nail"],
                         "label": ["1", "2", "3", "4"]}, "answerKey": "4"},
            {"id": "Mercury_SC_408547", "question": "Which of these is a renewable resource?",
             "choices": {"text": ["coal", "oil", "wind", "natural gas", "uranium"],
                         "label": ["A", "B", "C", "D", "E"]}, "answerKey": "C"},
        ],
        ".parquet",
        [("Mercury_7175875", "An astronomer", "C", tuple(ARC_CHOICES_4)),
         ("NYSEDREGENTS_2015_4_8", "Which object", "D", ("a wax crayon", "a plastic spoon", "a rubber eraser",
                                                         "an iron nail")),
         ("Mercury_SC_408547", "Which of these", "C", ("coal", "oil", "wind", "natural gas", "uranium"))],
    ),
    "mmlu_pro": (
        [
            {"question_id": 70, "question": "Typical advertising regulatory bodies suggest, for example that adverts "
                                            "must not: encourage _________, cause unnecessary ________ or _____, and "
                                            "must not cause _______ offence.",
             "options": MMLU_OPTIONS, "answer": "I", "answer_index": 8, "cot_content": "",
             "category": "business", "src": "ori_mmlu-business_ethics"},
            {"question_id": 71, "question": "Managers are entrusted to run the company in the best interest of "
                                            "________. Specifically, they have a duty to act for the benefit of the "
                                            "company, as well as a duty of ________ and of _______.",
             "options": ["Shareholders, Diligence, Self-interest", "Shareholders, Self-interest, Care and Skill",
                         "Stakeholders, Care and skill, Self-interest", "Stakeholders, Diligence, Care and Skill"],
             "answer": "D", "answer_index": 3, "cot_content": "", "category": "business",
             "src": "ori_mmlu-business_ethics"},
        ],
        ".jsonl",
        [("70", "Typical advertising", "I", tuple(MMLU_OPTIONS)),
         ("71", "Managers are", "D", ("Shareholders, Diligence, Self-interest",
                                      "Shareholders, Self-interest, Care and Skill",
                                      "Stakeholders, Care and skill, Self-interest",
                                      "Stakeholders, Diligence, Care and Skill"))],
    ),
    "supergpqa": (
        [
            {"uuid": "ed8b1fe0d1b6489a8c5b2a0d8f0e2b55",
             "question": "Which of the following is the most stable conformation of cyclohexane?",
             "options": ["Boat", "Twist-boat", "Chair", "Half-chair", "Planar"], "answer": "Chair",
             "answer_letter": "C", "discipline": "Science", "field": "Chemistry", "subfield": "Organic Chemistry",
             "difficulty": "easy", "is_calculation": False},
            {"uuid": "0f3a9c2e7d8b4e1fa6c5b4d3e2f1a0b9",
             "question": "A body moves with constant speed $v$ on a circle of radius $r$. Its acceleration is",
             "options": ["0", "$v/r$", "$v^2/r$", "$v r$"], "answer": "$v^2/r$", "answer_letter": "C",
             "discipline": "Science", "field": "Physics", "subfield": "Mechanics", "difficulty": "easy",
             "is_calculation": True},
        ],
        ".parquet",
        [("ed8b1fe0d1b6489a8c5b2a0d8f0e2b55", "Which of the following", "C",
          ("Boat", "Twist-boat", "Chair", "Half-chair", "Planar")),
         ("0f3a9c2e7d8b4e1fa6c5b4d3e2f1a0b9", "A body moves", "C", ("0", "$v/r$", "$v^2/r$", "$v r$"))],
    ),
}
HUB_BENCHMARKS = sorted(FIXTURES)
KINDS = {"arc_c": "choice", "mmlu_pro": "choice", "supergpqa": "choice"}


def test_every_hub_benchmark_has_a_fixture():
    hub = {name for name, spec in BENCHMARKS.items() if spec.hub_id is not None}
    assert hub == set(FIXTURES)
    assert {name for name, spec in BENCHMARKS.items() if spec.hub_id is None} == {"champ", "arithmetic"}


@pytest.mark.parametrize("name", HUB_BENCHMARKS)
def test_load_local_fixture_in_hub_schema(tmp_path, name):
    rows, suffix, expected = FIXTURES[name]
    path = write_rows(rows, tmp_path / f"{name}{suffix}")
    items = load_benchmark(name, path=path, cache_dir=str(tmp_path / "c"))
    assert len(items) == len(expected)
    kind = KINDS.get(name, "math")
    for item, (item_id, question_prefix, gold, choices) in zip(items, expected):
        assert isinstance(item, EvalItem)
        assert (item.benchmark, item.id, item.gold, item.kind, item.choices) == (name, item_id, gold, kind, choices)
        assert item.question.startswith(question_prefix)
    # num_samples keeps the first n, deterministically
    first = load_benchmark(name, path=path, num_samples=1, cache_dir=str(tmp_path / "c"))
    assert first == items[:1]


def test_gsm8k_without_marker_is_dropped_and_ids_keep_row_index(tmp_path, caplog):
    rows = [
        {"question": "No final answer here.", "answer": "Some reasoning but no marker"},
        {"question": "What is 1,000 + 234?", "answer": "1,000+234=1,234\n#### 1,234"},
    ]
    path = write_rows(rows, tmp_path / "g.jsonl")
    items = load_benchmark("gsm8k", path=path, cache_dir=str(tmp_path / "c"))
    assert [(i.id, i.gold) for i in items] == [("gsm8k-1", "1234")]
    assert "dropped 1 of 2" in caplog.text


def test_choice_rows_with_bad_gold_are_dropped(tmp_path):
    rows = [
        {"question_id": 1, "question": "Pick one.", "options": ["x", "y", "z"], "answer": "E", "answer_index": 4},
        {"question_id": 2, "question": "Pick two.", "options": ["x", "y", "z"], "answer": "b", "answer_index": 1},
    ]
    items = load_benchmark("mmlu_pro", path=write_rows(rows, tmp_path / "m.jsonl"), cache_dir=str(tmp_path / "c"))
    assert [(i.id, i.gold) for i in items] == [("2", "B")]  # out-of-range letter dropped, lower case normalised


def test_missing_column_names_the_benchmark(tmp_path):
    rows = [{"question": "q", "choices": ["a", "b"], "answer": "A"}]  # "choices", not MMLU-Pro's "options"
    with pytest.raises(ValueError, match=r"mmlu_pro: missing expected column\(s\) \['options'\]"):
        load_benchmark("mmlu_pro", path=write_rows(rows, tmp_path / "bad.jsonl"), cache_dir=str(tmp_path / "c"))


def test_unknown_benchmark_lists_names():
    with pytest.raises(ValueError) as e:
        load_benchmark("gsm9k")
    assert "gsm8k" in str(e.value) and "supergpqa" in str(e.value) and "champ" in str(e.value)


@pytest.mark.parametrize("name", HUB_BENCHMARKS)
def test_hub_id_offline_fails_fast(tmp_path, name):
    t0 = time.monotonic()
    with pytest.raises(DatasetUnavailableError) as e:
        load_benchmark(name, cache_dir=str(tmp_path / "empty_cache"))
    assert time.monotonic() - t0 < 20
    assert BENCHMARKS[name].hub_id in str(e.value) and "path=" in str(e.value)


def test_champ_offline():
    items = load_benchmark("champ")
    assert len(items) == 270 and len({i.id for i in items}) == 270
    first = items[0]
    assert (first.id, first.gold, first.kind) == ("P_Combinatorics_1", "239", "math")
    assert first.question.startswith("Let a string consist of digit 1, 2, 3.")
    assert all("boxed" not in i.question and "@@" not in i.gold for i in items)  # raw problem, cleaned answer
    assert load_benchmark("champ", num_samples=5) == items[:5]
    with pytest.raises(ValueError, match="path"):
        load_benchmark("champ", path="x.jsonl")


def test_arithmetic_offline_is_seeded():
    items = load_benchmark("arithmetic", num_samples=20, seed=3)
    assert len(items) == 20 and [i.id for i in items[:2]] == ["arithmetic-0", "arithmetic-1"]
    for item in items:
        m = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", item.question)
        assert m, item.question
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        assert item.gold == str(a + b if op == "+" else a - b) and item.kind == "math"
    assert load_benchmark("arithmetic", num_samples=20, seed=3) == items
    assert load_benchmark("arithmetic", num_samples=5, seed=3) == items[:5]
    assert load_benchmark("arithmetic", num_samples=20, seed=4) != items


def test_render_prompts():
    math_item = EvalItem("math500", "t1", "Compute $\\binom{5}{2}$.", "10", "math")
    assert render_prompt(math_item) == [
        {"role": "user",
         "content": "Compute $\\binom{5}{2}$.\n\nPlease reason step by step, and put your final answer within "
                    "\\boxed{}."}
    ]  # fmt: skip
    assert render_prompt(math_item)[0]["content"] == MATH_PROMPT.format(question=math_item.question)
    choice = EvalItem("arc_c", "c1", "Which is a metal?", "B", "choice", ("wood", "iron", "glass"))
    content = render_prompt(choice)[0]["content"]
    assert content.startswith("Which is a metal?\n\nA. wood\nB. iron\nC. glass\n\n")
    assert '"Answer: X"' in content and "A, B, C" in content and "D" not in content.split("\n\n")[-1]
    assert render_prompt(choice, template="Q: {question}\n{options}")[0]["content"] == (
        "Q: Which is a metal?\nA. wood\nB. iron\nC. glass"
    )
    assert "{options}" in CHOICE_PROMPT
    with pytest.raises(ValueError, match="question"):
        render_prompt(math_item, template="no placeholder")


# ----------------------------------------------------------------------------- grading

CHOICE_CASES = [
    # (text, num_choices, expected)
    ("Answer: B", 4, "B"),
    ("answer: c", 4, "C"),  # lower case normalised
    ("The answer is (d).", 4, "D"),
    ("The correct answer is B.", 4, "B"),
    ("**Final Answer:** (A)", 4, "A"),
    ("So the result is $\\boxed{C}$.", 4, "C"),
    ("\\boxed{\\text{(b)}}", 4, "B"),
    ("<think>Answer: A ... no wait</think>\nAnswer: D", 4, "D"),  # think block ignored
    ("<think>I am sure. Answer: A", 4, None),  # unclosed think: no answer
    ("First guess: Answer: A. On reflection, Answer: C", 4, "C"),  # last answer wins
    ("The answer is (B). Hmm.\n\\boxed{D}", 4, "D"),  # last across patterns
    ("Answer: E", 4, None),  # out-of-range letter rejected
    ("Answer: E", 5, "E"),
    ("Answer: J", 10, "J"),
    ("Answer: B\nAnswer: F", 4, "B"),  # an out-of-range later match does not count
    ("Let me think.\nB", 4, "B"),  # a lone letter as the whole final line
    ("Reasoning...\n**(c)**", 4, "C"),
    ("Reasoning...\nE", 4, None),
    ("the answer is a multiple of three", 4, None),  # English "a" is not option A
    ("Answer: Apple", 4, None),
    ("I have no idea.", 4, None),
    ("", 4, None),
    (None, 4, None),
    (12345, 4, None),
    ("Answer: B", 0, None),
    ("x" * 1_000_000, 4, None),  # garbage
    ([{"role": "assistant", "content": "Answer: c"}], 4, "C"),  # conversational completion
]


@pytest.mark.parametrize("text,num_choices,expected", CHOICE_CASES)
def test_extract_choice(text, num_choices, expected):
    assert extract_choice(text, num_choices) == expected


def test_extract_choice_on_huge_input():
    huge = "answer " * 150_000 + "Answer: B" + " " * 100_000
    assert extract_choice(huge, 4) == "B"
    assert extract_choice("\\boxed{" * 100_000, 4) is None


def test_extract_final_answer():
    math_item = EvalItem("aime24", "1", "q", "204", "math")
    choice = EvalItem("arc_c", "2", "q", "B", "choice", ("x", "y", "z"))
    assert extract_final_answer(math_item, "<think>\\boxed{1}</think> so \\boxed{ 204 }") == "204"
    assert extract_final_answer(math_item, "blah\nAnswer: 17") == "17"  # DAPO Answer: line
    assert extract_final_answer(math_item, "no answer at all") == ""
    assert extract_final_answer(math_item, "<think>unfinished \\boxed{3}") == ""
    as_messages = [{"role": "assistant", "content": "\\boxed{\\frac{1}{2}}"}]
    assert extract_final_answer(math_item, as_messages) == "\\frac{1}{2}"
    assert extract_final_answer(choice, "The answer is (c)") == "C"
    assert extract_final_answer(choice, "Answer: D") == ""


def test_grade_math_and_choice():
    half = EvalItem("math500", "m1", "q", "1/2", "math")
    nine = EvalItem("gsm8k", "m2", "q", "9", "math")
    choice = EvalItem("mmlu_pro", "c1", "q", "C", "choice", ("a", "b", "c", "d"))
    pairs = [
        (half, "The answer is \\boxed{\\frac12}."),
        (half, "\\boxed{\\frac{1}{3}}"),
        (nine, "<think>maybe \\boxed{8}</think> \\boxed{9}"),
        (nine, "<think>\\boxed{9}</think> \\boxed{8}"),
        (choice, "Answer: c"),
        (choice, "Answer: B"),
        (choice, "Answer: G"),
        (half, [{"role": "assistant", "content": "\\boxed{0.5}"}]),
    ]
    assert grade(pairs, timeout=LIMIT) == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert grade([], timeout=LIMIT) == []


def test_grade_garbage_is_zero():
    half = EvalItem("math500", "m1", "q", "1/2", "math")
    choice = EvalItem("arc_c", "c1", "q", "A", "choice", ("a", "b"))
    garbage = ["x" * 1_000_000, "\\boxed{" + "9" * 1_000_000 + "}", "<think>" + "y" * 1_000_000, "\\boxed{" * 100_000]
    scores = grade([(half, g) for g in garbage] + [(choice, g) for g in garbage], timeout=LIMIT)
    assert scores == [0.0] * (2 * len(garbage))


def test_grade_large_batch_keeps_order():
    # Enough math items to split the batch across verifier workers: results must stay aligned.
    items = [EvalItem("arithmetic", f"a{i}", "q", str(i), "math") for i in range(80)]
    completions = [f"\\boxed{{{i if i % 3 else i + 1}}}" for i in range(80)]
    assert grade(list(zip(items, completions)), timeout=LIMIT) == [0.0 if i % 3 == 0 else 1.0 for i in range(80)]


def test_grade_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        grade([(EvalItem("x", "1", "q", "1", "essay"), "1")])
