"""The GRPODropout evaluation preset against the authors' eval code (hexuandeng/GRPODropout@4ad3b3b):
the expected strings are copied from eval/prompts/qwen/math.py, eval/prompts/qwen/qa.py and
eval/utils/parser.py, and the final prompt tokens are checked against a hand-written Qwen3 chat string."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainer.eval.benchmarks import EvalItem, render_prompt
from trainer.eval.generation import chat_prompt_ids
from trainer.eval.prompts import prompt_messages
from trainer.eval.runner import EvalConfig, _config_record, _question

ROOT = Path(__file__).resolve().parents[2]

# eval/prompts/qwen/math.py L1 and qa.py L1 / L4, copied verbatim (raw-string backslash kept as one backslash)
UPSTREAM_MATH_SYSTEM = r"""Please reason step by step, and put your final answer within \boxed{}."""
UPSTREAM_QA_SYSTEM = (
    "Answer the following multiple-choice question. Think step by step and then finish your answer with "
    '"The answer is (X)" where X is the correct letter choice.'
)
UPSTREAM_QA_FORMAT = "Question: {question}\n\nSolution:"


def upstream_choice_question(question: str, options: list[tuple[str, str]]) -> str:
    """eval/utils/parser.py parse_question (L86-90) with _format_choices (L76-83), transcribed."""
    lines = [f"{label.strip().upper()}. {text.strip()}" for label, text in options if label.strip() and text.strip()]
    return f"{question.strip()}\n\n{chr(10).join(lines)}".strip()


MATH = EvalItem("aime24", "60", "  Find the number of ordered pairs $(x,y)$.\n", "12", "math")
CHOICE = EvalItem("arc_c", "Mercury_7175875", "Which is the most likely effect of this increase in rotation?",
                  "C", "choice", ("Planetary density will decrease. ", "Planetary years will become longer.",
                                  "Planetary days will become shorter.", "Planetary gravity will become stronger."))


def test_math_messages_are_the_authors():
    # build_prompt_for_example (eval/eval.py): math sets get the raw question, parse_question strips it
    assert prompt_messages(MATH, "grpodropout") == [
        {"role": "system", "content": UPSTREAM_MATH_SYSTEM},
        {"role": "user", "content": "Find the number of ordered pairs $(x,y)$."},
    ]


def test_choice_messages_are_the_authors():
    question = upstream_choice_question(CHOICE.question, list(zip("ABCD", CHOICE.choices)))
    assert prompt_messages(CHOICE, "grpodropout") == [
        {"role": "system", "content": UPSTREAM_QA_SYSTEM},
        {"role": "user", "content": UPSTREAM_QA_FORMAT.format(question=question)},
    ]


def test_default_preset_is_unchanged():
    for item in (MATH, CHOICE):
        assert prompt_messages(item) == render_prompt(item)


def test_prompt_tokens_match_a_hand_written_qwen3_chat(tiny_model):
    """What the model reads: the authors pass apply_chat_template(tokenize=False, add_generation_prompt=True,
    enable_thinking=True) text to vLLM; Qwen3's template renders it as below (no BOS, nothing after the
    assistant header in thinking mode)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    cfg = EvalConfig.from_dict(yaml.safe_load((ROOT / "configs" / "eval" / "grpodropout.yaml").read_text()))
    assert cfg.prompt == "grpodropout" and cfg.chat_template_kwargs == {"enable_thinking": True}
    ids = chat_prompt_ids(tok, _question(MATH, cfg).messages, cfg.chat_template_kwargs)
    text = (f"<|im_start|>system\n{UPSTREAM_MATH_SYSTEM}<|im_end|>\n"
            "<|im_start|>user\nFind the number of ordered pairs $(x,y)$.<|im_end|>\n<|im_start|>assistant\n")
    assert ids == tok.encode(text, add_special_tokens=False)


def test_preset_is_recorded_and_unknown_presets_fail():
    raw = yaml.safe_load((ROOT / "configs" / "eval" / "grpodropout.yaml").read_text())
    cfg = EvalConfig.from_dict(raw)
    assert _config_record(cfg, cfg.systems[0])["prompt"] == "grpodropout"
    assert "prompt" not in _config_record(EvalConfig.from_dict({**raw, "prompt": "default"}), cfg.systems[0])
    with pytest.raises(ValueError, match="prompt"):
        EvalConfig.from_dict({**raw, "prompt": "grpo-dropout"})
