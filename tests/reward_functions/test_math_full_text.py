"""``math_accuracy_full_text``: the GRPODropout authors' training reward, against hand-written completions.

Expected scores are read off the authors' grader, hexuandeng/GRPODropout@4ad3b3b:verl/examples/grpo_dropout/
reward.py (``compute_score_batch_gt_math``, the training and validation reward of train.sh:77-78), not off winnow:
verl's batch reward manager decodes the whole response with ``skip_special_tokens=True``; Qwen3's ``<think>`` /
``</think>`` are not special tokens, so the think block, finished or not, is part of the graded text. Per
completion the grader accepts (a) verl math_dapo's Minerva check: the last ``Answer: X`` in the last 300 characters
(reward.py:147-149) or (b) the extracted answer (reward.py:140, 158-159): the last complete ``\\boxed{}`` anywhere
(reward.py:92-94), else only with no box the answer phrases of the last 4 non-empty lines (reward.py:37-58, 96-98).
Each case names the line that decides it. The gold answers are integers, where verl's string equality and
Math-Verify agree; the ``answer`` column is winnow's default ``math_accuracy`` on the same text.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

import rewards  # noqa: E402
from rewards.math_rewards import full_text_candidates, make_math_accuracy  # noqa: E402

FILLER = ("y" * 100 + "\n") * 5  # 505 characters of 5 lines: pushes a line out of both windows

# (case, completion, authors' score (full_text), winnow default score (answer)); gold "34" throughout.
CASES = [
    # reward.py:92-94: the last box anywhere -- the think block was cut by the length limit, the box still counts
    ("unfinished think, boxed inside", "<think>\nSo the total is \\boxed{34}. Wait, let me check the", 1.0, 0.0),
    # reward.py:92-94; the answer part after </think> holds the same box
    ("finished think, boxed answer", "<think>\nwork\n</think>\n\nThe answer is \\boxed{34}.", 1.0, 1.0),
    # reward.py:92-94: a box inside a finished think block counts; the answer part has none
    ("answer only inside think", "<think>\nSo \\boxed{34}.\n</think>\n\nI am done.", 1.0, 0.0),
    # reward.py:63 (rfind): the LAST box is 12, the 34 in the think block is earlier; no Answer: line
    ("think box right, final box wrong", "<think>\n\\boxed{34}\n</think>\n\\boxed{12}", 0.0, 0.0),
    # reward.py:63: the last box is the final answer
    ("think box wrong, final box right", "<think>\n\\boxed{12}\n</think>\n\\boxed{34}", 1.0, 1.0),
    # reward.py:96-98 with the pattern of reward.py:43 ("answer is X") on the last line; no box anywhere
    ("unfinished think, answer phrase", "<think>\nLet me see.\nSo the answer is 34", 1.0, 0.0),
    # reward.py:147-149: the Minerva Answer: line (last 300 characters) is right, whatever the box says
    ("Answer: line beats a wrong box", "<think>\nhm\n</think>\n\\boxed{35}\nAnswer: 34", 1.0, 0.0),
    # reward.py:147 (math_dapo keeps only the last 300 characters) and reward.py:38-39 (last 4 lines): out of both
    ("Answer: line out of both windows", "Answer: 34\n" + FILLER, 0.0, 0.0),
    # reward.py:41 captures "** 34"; normalised it is "**34", not 34 (the Minerva check alike, reward.py:147)
    ("Markdown answer line, no box", "<think>\nok\n</think>\n**Final Answer:** 34", 0.0, 1.0),
    # reward.py:69-85: an empty box is found, so the marker fallback is never tried; its answer is ""
    ("empty box blocks the phrase", "\\boxed{}\nThe answer is 34", 0.0, 0.0),
    # reward.py:89-90: nothing to grade
    ("empty completion", "", 0.0, 0.0),
    # reward.py:63-67: the last box never closes (cut off); no phrase matches the last line
    ("truncated box", "<think>\nit is \\boxed{3", 0.0, 0.0),
    # reward.py:63-65: verl math's fallback takes "\boxed 34" up to a "$"
    ("space-form box", "<think>\nhence $\\boxed 34$", 1.0, 0.0),
]


@pytest.fixture(scope="module")
def scores():
    full = rewards.get_reward("math_accuracy_full_text")
    answer = rewards.get_reward("math_accuracy")
    texts = [c[1] for c in CASES]
    gold = ["34"] * len(texts)
    return full(prompts=["p"] * len(texts), completions=texts, answer=gold), answer(
        prompts=["p"] * len(texts), completions=texts, answer=gold
    )


@pytest.mark.parametrize("i", range(len(CASES)), ids=[c[0] for c in CASES])
def test_full_text_grading_matches_the_authors(scores, i):
    name, text, authors, _ = CASES[i]
    assert scores[0][i] == authors, (name, full_text_candidates(text))


@pytest.mark.parametrize("i", range(len(CASES)), ids=[c[0] for c in CASES])
def test_default_grading_is_unchanged(scores, i):
    assert scores[1][i] == CASES[i][3], CASES[i][0]


def test_conversational_reasoning_is_graded_too():
    """TRL's response parser may move the reasoning into ``reasoning_content``; it is part of the graded text."""
    f = rewards.get_reward("math_accuracy_full_text")
    msgs = [[{"role": "assistant", "reasoning_content": "so \\boxed{34}", "content": ""}]]
    assert f(prompts=["p"], completions=msgs, answer=["34"]) == [1.0]


def test_registration_and_options():
    f = rewards.get_reward("math_accuracy_full_text")
    assert f.__name__ == "math_accuracy_full_text"  # TRL's metric name and dynamic_sampling_metric
    assert rewards.get_reward("math_accuracy_full_text", timeout=3.0).__name__ == "math_accuracy_full_text"
    assert make_math_accuracy(grade="full_text").__name__ == "math_accuracy_full_text"
    with pytest.raises(ValueError, match="grade must be one of"):
        make_math_accuracy(grade="everything")
