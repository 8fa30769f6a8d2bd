"""The ``<think>`` prefill (issue 20 item 2): RAGEN's generation prompt ends with ``<think>`` and each reply is
parsed with it prepended (mll-lab-nu/RAGEN@20daedc ragen/llm_agent/ctx_manager.py:1259-1263, 1406), so a reply
``reasoning</think><answer>Right</answer>`` is a valid move there.

The oracle for what RAGEN accepts is its own parser, copied here from ``_parse_response`` (ctx_manager.py:196-221,
enable_think=True, action separator "||", 2 actions per turn)."""

from __future__ import annotations

import re

import pytest
import torch
from harness import BASE_ARGS, prompt_dataset, tiny_model_path
from line_env import Line
from test_rollout import CHATML, Recording, Scripted, make_trainer
from transformers import AutoTokenizer

from envs import available, register_env
from envs.episode import Episode, EpisodeSettings
from trainer.config.core import WinnowConfig
from trainer.rollout.multi_turn import ChatTokens, MultiTurnRollout

if "test-line" not in available():
    register_env("test-line")(Line)

SPECIAL = ["<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>"]


def ragen_actions(response: str, max_actions: int = 2) -> list[str]:
    """RAGEN's parse of a raw reply (the '<think>' prefix added as get_env_inputs does, ctx_manager.py:1406)."""
    match = re.search(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", "<think>" + response, re.DOTALL)
    if not match:
        return []
    action_content = match.group(2)
    for token in SPECIAL:
        action_content = action_content.replace(token, "").strip()
    return [a.strip() for a in action_content.split("||") if a.strip()][:max_actions]


REPLIES = [
    "I go right.</think><answer>Right</answer>",  # valid only with the prefill
    "\nplan\n</think>\n\n<answer>Right || Right</answer>",
    "<think>again</think><answer>Right</answer>",  # a second opening tag: still parsed by RAGEN's regex
    "no tags at all",
    "x</think> text <answer>Right</answer>",  # text between the blocks
]


@pytest.mark.parametrize("reply", REPLIES)
def test_episode_parse_with_prefill_matches_ragens_parser(reply):
    episode = Episode(Line(), 0, EpisodeSettings())
    record = episode.play("<think>" + reply)
    assert list(record.actions) == ragen_actions(reply)
    assert record.penalty == (0.0 if ragen_actions(reply) else -0.1)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_path())


def test_multi_turn_prefill_is_context_and_replies_without_opening_tag_play(tmp_path, tokenizer):
    """Every context ends with the prefill ids; the mask-1 tokens are exactly the sampled ids (the prefill is never
    trained on); the decoded rollout is the conversation with '<think>' + reply as each assistant turn; a reply
    without its own opening tag moves (RAGEN: valid), and without the prefill the same reply is penalised."""
    settings = EpisodeSettings(max_turns=3)
    reply = "I go right.</think><answer>Right || Right</answer>"
    chat = ChatTokens(tokenizer, CHATML)
    prefill_ids = tokenizer("<think>", add_special_tokens=False)["input_ids"]
    rollout = MultiTurnRollout("test-line", {}, settings, 40, 0.5, chat, prefill="<think>")
    trainer = make_trainer(tmp_path, rollout)
    trainer.model.train()
    rollout.backend = Recording(Scripted(tokenizer, reply))
    out = rollout([trainer.train_dataset[0]["prompt"]], trainer)
    assert out["success"] == [True] and out["num_turns"] == [2] and out["penalised_turns"] == [0]
    completion, mask = out["completion_ids"][0], out["env_mask"][0]
    contexts = [c for call, _, _ in rollout.backend.calls for c in call]
    assert len(contexts) == 2 and all(c[-len(prefill_ids):] == prefill_ids for c in contexts)
    sampled = [t for t, m in zip(completion, mask) if m]
    assert sampled == rollout.backend.inner.ids * 2
    episode = Episode(Line(), 0, settings)
    messages = episode.first_messages()
    for _ in range(2):
        episode.play("<think>" + reply)
        messages.append({"role": "assistant", "content": "<think>" + reply})
        if not episode.done:
            messages.append(episode.next_user_message())
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=CHATML)
    assert tokenizer.decode(out["prompt_ids"][0] + completion) + "\n" == rendered

    plain = MultiTurnRollout("test-line", {}, settings, 40, 0.5, chat)
    plain.backend = Scripted(tokenizer, reply)
    out = plain([trainer.train_dataset[0]["prompt"]], trainer)
    assert out["success"] == [False] and out["penalised_turns"] == out["num_turns"] and out["num_turns"][0] >= 2


def test_single_turn_prefill_ends_the_prompt_and_rewards_see_it(tmp_path):
    """TRL's tokenised prompt gets the prefill ids appended (the model samples after them, they are not in the
    completion), and the reward functions receive '<think>' + the decoded completion."""
    from trainer.grpo_trainer import WinnowGRPOTrainer

    seen = []

    def recorder(completions, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    args = WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, think_prefill=True)
    trainer = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[recorder], args=args,
                                train_dataset=prompt_dataset())
    tok = trainer.processing_class
    prefill_ids = tok("<think>", add_special_tokens=False)["input_ids"]
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    torch.manual_seed(0)
    inputs = trainer._prepare_inputs(batch)
    for ids, mask in zip(inputs["prompt_ids"], inputs["prompt_mask"]):
        assert ids[mask.bool()].tolist()[-len(prefill_ids):] == prefill_ids
    texts = tok.batch_decode(inputs["completion_ids"], skip_special_tokens=True)
    assert len(seen) == len(texts) and all(s.startswith("<think>") for s in seen)
    assert sorted(s[len("<think>"):] for s in seen) == sorted(texts)


def test_prompt_bound_counts_the_prefill(tmp_path):
    """``max_prompt_tokens`` bounds the prompt the model is given, the think prefill included (issue 32 item C.4): the
    server's context is max_prompt_tokens + max_completion_length, so a prompt whose chat template alone sits at the
    bound would overflow it by the prefill. Anchored to the trainer's own tokenisation (TRL's ``_tokenize_prompts``
    plus the prefill ids): every prompt the filter keeps fits the bound there, and the bound is tight (without the
    prefill the filter keeps the prompt it now drops)."""
    from datasets import Dataset

    from trainer.build import filter_long_prompts
    from trainer.grpo_trainer import WinnowGRPOTrainer

    texts = ["Add 2 and 3.", "Add 2 and 3, then double the sum, then subtract one from it.",
             "Add 2 and 3, then double the sum, then subtract one from it, and then say the result in words."]
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in texts], "answer": ["5", "9", "9"]})
    args = WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, think_prefill=True)
    trainer = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[lambda completions, **kw: [0.0] * len(
        completions)], args=args, train_dataset=data)
    tok = trainer.processing_class

    def model_lengths(rows) -> list[int]:
        return [len(ids) for ids in trainer._tokenize_prompts(list(rows["prompt"]))[0]]

    full = model_lengths(data)
    bound = len(tok.apply_chat_template(data[1]["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"])
    assert full[1] > bound >= full[0], (full, bound)  # the middle prompt's template alone is exactly at the bound

    kept = filter_long_prompts(data, tok, bound, {}, prefill="<think>")
    assert len(kept) == 1 and max(model_lengths(kept)) <= bound
    assert len(filter_long_prompts(data, tok, bound, {})) == 2  # without the prefill that prompt fits
