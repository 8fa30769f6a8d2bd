"""The multi-turn rollout (trainer/rollout/multi_turn.py): token-exact conversations, the loss mask, budgets, extras.

Episodes are played by the tiny random Qwen3 (real ``generate``) or, where the test needs well-formed
Qwen3 answers, by a scripted policy behind the same backend interface. Environment: the ``Line`` walk of
tests/line_env.py (the real Sokoban/FrozenLake runs are in tests/rollout/test_env_rollout_trainer.py)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from harness import BASE_ARGS, reward_token_parity, tiny_model_path
from line_env import Line
from transformers import AutoTokenizer

import rewards
from envs import available, register_env
from envs.episode import Episode, EpisodeSettings
from trainer.config.core import ConfigError, WinnowConfig
from trainer.data.envs import level_dataset
from trainer.rollout.multi_turn import ChatTokens, LocalBackend, MultiTurnRollout, Sample, training_chat_template
from trainer.tools.assets import qwen3_chat_template, qwen3_training_chat_template

if "test-line" not in available():
    register_env("test-line")(Line)

# A ChatML template that renders every message verbatim (SmolLM2's family): with it the decoded rollout
# must equal the rendered conversation for *any* sampled text, garbage included.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CANONICAL = "<think>\nThe goal is to the right.\n</think>\n\n<answer>Right || Right</answer>"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_path())


def make_trainer(tmp_path, rollout, extra_rewards=(), **overrides):
    from trainer.grpo_trainer import WinnowGRPOTrainer

    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "max_completion_length": 160, **overrides})
    return WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[rewards.get_reward("env_return"), *extra_rewards],
                             args=args,
                             train_dataset=level_dataset("test-line", 8, 0), rollout_func=rollout)


class Recording:
    """Wraps a backend and records every context and (cut) sample it returns."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    @contextmanager
    def session(self):
        with self.inner.session():
            yield self

    def generate(self, contexts, max_new_tokens, temperature, stop_ids):
        samples = self.inner.generate(contexts, max_new_tokens, temperature, stop_ids)
        self.calls.append((contexts, samples, temperature))
        return samples


class _Null:
    def __init__(self, backend):
        self.backend = backend

    def __enter__(self):
        return self.backend

    def __exit__(self, *exc):
        return False


class Scripted:
    """A policy that always answers ``text`` (tokenised once) -- well-formed Qwen3 output on demand."""

    def __init__(self, tokenizer, text):
        self.ids = tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]

    def session(self):
        return _Null(self)

    def generate(self, contexts, max_new_tokens, temperature, stop_ids):
        return [Sample(list(self.ids)) for _ in contexts]


def rollout_for(tokenizer, template, settings=None, turn_max_tokens=16):
    chat = ChatTokens(tokenizer, template)
    return MultiTurnRollout("test-line", {}, settings or EpisodeSettings(max_turns=3), turn_max_tokens, 0.5, chat)


def conversation(responses: list[str], settings: EpisodeSettings) -> list[dict[str, str]]:
    """The whole conversation as chat messages, replayed from the responses in pure Python."""
    episode = Episode(Line(), 0, settings)
    messages = episode.first_messages()
    for text in responses:
        episode.play(text)
        messages.append({"role": "assistant", "content": text})
        if not episode.done:
            messages.append(episode.next_user_message())
    return messages


def test_training_template_is_trls_qwen3_variant_and_user_turns_are_its_delta(tokenizer):
    assert training_chat_template(tokenizer) == qwen3_training_chat_template()
    chat = ChatTokens(tokenizer, training_chat_template(tokenizer))
    ids = chat.user_turn_ids({"role": "user", "content": "hello"})
    assert tokenizer.decode(ids) == "\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def test_stock_qwen3_template_is_refused(tokenizer):
    with pytest.raises(ValueError, match="prefix-preserving"):
        ChatTokens(tokenizer, qwen3_chat_template())


def test_qwen3_training_template_conversation_is_token_exact(tmp_path, tokenizer):
    """Well-formed answers: prompt + completion decodes to exactly the training template's conversation."""
    settings = EpisodeSettings(max_turns=3)
    rollout = rollout_for(tokenizer, training_chat_template(tokenizer), settings, turn_max_tokens=40)
    trainer = make_trainer(tmp_path, rollout)
    rollout.backend = Scripted(tokenizer, CANONICAL)
    trainer.model.train()
    out = rollout([trainer.train_dataset[0]["prompt"]], trainer)
    assert out["success"] == [True] and out["num_turns"] == [2]  # 2 + 2 moves, the goal on the third
    expected = tokenizer.apply_chat_template(conversation([CANONICAL] * 2, settings), tokenize=False,
                                             chat_template=training_chat_template(tokenizer))
    decoded = tokenizer.decode(out["prompt_ids"][0] + out["completion_ids"][0])
    # the template closes the last turn with "<|im_end|>\n"; the sample ends at <|im_end|>
    assert decoded + "\n" == expected


def test_sampled_text_is_token_exact_and_the_mask_covers_exactly_the_sampled_tokens(tmp_path, tokenizer):
    """Real sampling (any text): the mask-1 tokens are the sampled ids, the mask-0 runs are the template's
    user turns, and the decoded rollout equals the rendered conversation."""
    settings = EpisodeSettings(max_turns=3)
    rollout = rollout_for(tokenizer, CHATML, settings)
    trainer = make_trainer(tmp_path, rollout, max_completion_length=600)
    trainer.model.train()
    rollout.backend = Recording(LocalBackend(trainer))
    torch.manual_seed(0)
    prompts = [trainer.train_dataset[i]["prompt"] for i in (0, 0, 1, 1)]
    out = rollout(prompts, trainer)
    assert not any(out["truncated"])
    end = rollout.chat.turn_end_id
    for row in range(len(prompts)):
        completion, mask = out["completion_ids"][row], out["env_mask"][row]
        assert len(completion) == len(mask) and len(completion) <= trainer.max_completion_length
        spans = out["turn_spans"][row]
        assert [m for m in mask] == [int(any(a <= k < b for a, b in spans)) for k in range(len(mask))]
        sampled = [completion[a:b] for a, b in spans]
        # each turn's ids are the backend's sample for this row's context, cut at the stop token
        for turn, ids in enumerate(sampled):
            contexts, samples, _ = rollout.backend.calls[turn]
            position = sum(len(out["turn_spans"][r]) > turn for r in range(row))  # live rows, in row order
            assert contexts[position] == out["prompt_ids"][row] + completion[: spans[turn][0]]
            raw = samples[position].ids
            assert ids == (raw[: raw.index(end) + 1] if end in raw else raw[:16])
        texts = [tokenizer.decode(ids[:-1] if ids[-1] == end else ids) for ids in sampled]
        expected = tokenizer.apply_chat_template(conversation(texts, settings), tokenize=False, chat_template=CHATML)
        tail = "\n" if sampled[-1][-1] == end else "<|im_end|>\n"
        assert tokenizer.decode(out["prompt_ids"][row] + completion) + tail == expected


def test_through_the_trainer_loss_mask_extras_and_metrics(tmp_path, tokenizer):
    rollout = rollout_for(
        tokenizer, training_chat_template(tokenizer), EpisodeSettings(max_turns=2), turn_max_tokens=8
    )
    # The random model never answers in format (equal returns): the parity reward gives the update a signal.
    trainer = make_trainer(tmp_path, rollout, extra_rewards=[reward_token_parity], max_steps=1,
                           per_device_train_batch_size=4)
    returned, seen = [], []
    call = rollout.__call__

    class Spy:
        def __call__(self, prompts, t):
            out = call(prompts, t)
            returned.append(out)
            return out

    trainer.rollout_func = Spy()
    original = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: seen.append(original(inputs)) or seen[-1]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    out, batch = returned[0], seen[0]
    for row, mask in enumerate(out["env_mask"]):
        width = len(mask)
        assert batch["tool_mask"][row, :width].tolist() == mask
        assert batch["completion_mask"][row, :width].sum() == width
    assert int(batch["num_items_in_batch"]) == sum(sum(m) for m in out["env_mask"])
    logs = trainer.state.log_history[0]
    returns = torch.tensor(out["episode_return"])
    assert logs["env/return"] == pytest.approx(returns.mean().item(), abs=1e-6)
    assert logs["rewards/env_return/mean"] == pytest.approx(returns.mean().item(), abs=1e-6)
    assert {"env/success_rate", "env/turns", "env/penalised_turn_fraction", "env/env_tokens"} <= set(logs)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_budget_ends_episodes_that_would_not_fit(tmp_path, tokenizer):
    rollout = rollout_for(tokenizer, training_chat_template(tokenizer), EpisodeSettings(max_turns=5))
    trainer = make_trainer(tmp_path, rollout, max_completion_length=60)
    trainer.model.train()
    out = rollout([trainer.train_dataset[0]["prompt"]] * 2, trainer)
    for completion, truncated, turns in zip(out["completion_ids"], out["truncated"], out["num_turns"]):
        assert len(completion) <= 60
        assert truncated and turns < 5  # an env reply is ~100 tokens: the second turn never fits


def test_evaluation_samples_at_the_eval_temperature(tmp_path, tokenizer):
    rollout = rollout_for(tokenizer, training_chat_template(tokenizer), EpisodeSettings(max_turns=1))
    trainer = make_trainer(tmp_path, rollout)
    rollout.backend = Recording(Scripted(tokenizer, CANONICAL))
    trainer.model.eval()
    rollout([trainer.train_dataset[0]["prompt"]], trainer)
    trainer.model.train()
    rollout([trainer.train_dataset[0]["prompt"]], trainer)
    assert [call[2] for call in rollout.backend.calls] == [0.5, 1.0]


def test_configuration_errors(tmp_path, tokenizer):
    rollout = rollout_for(tokenizer, training_chat_template(tokenizer), turn_max_tokens=400)
    trainer = make_trainer(tmp_path, rollout)
    with pytest.raises(ConfigError, match="max_completion_length"):
        rollout([trainer.train_dataset[0]["prompt"]], trainer)
    with pytest.raises(ValueError, match="not an environment level prompt"):
        ok = rollout_for(tokenizer, training_chat_template(tokenizer))
        ok([[{"role": "user", "content": "What is 2 + 3?"}]], make_trainer(tmp_path / "b", ok))
    with pytest.raises(TypeError):
        MultiTurnRollout("test-line", {"no_such_argument": 1}, EpisodeSettings(), 16, 0.5,
                         ChatTokens(tokenizer, training_chat_template(tokenizer)))
