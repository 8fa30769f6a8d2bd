"""The frozen teacher: chunked T=1 scoring equals unchunked scoring, alignment with the sampled ids, vocabulary
checks, and the frozen state. (Through the trainer: tests/methods/test_uecr_trainer.py.)"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

from trainer.methods.teacher import TeacherVocabularyError, check_vocabulary, score_tokens
from trainer.tools.assets import make_tiny_qwen3


@pytest.fixture(scope="module")
def teacher_path() -> str:
    """A tiny Qwen3 of another size and seed than the student (teacher and student need not share an architecture)."""
    return str(make_tiny_qwen3(seed=7, hidden_size=32, intermediate_size=64))


def batch(tokenizer, rows: int = 3, prompt: int = 5, completion: int = 9):
    """Left-padded prompts + right-padded completions of different lengths, as TRL lays them out."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 5000, (rows, prompt + completion), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding of prompt 0
    ids[0, :2] = tokenizer.pad_token_id
    mask[1, prompt + 4 :] = 0  # a short completion
    ids[1, prompt + 4 :] = tokenizer.pad_token_id
    return ids, mask, completion


def reference_scores(model, ids, mask, T, temperature=1.0):
    """Unchunked: full (B, L, V) logits in float32 -- what chunking must equal."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -T - 1 : -1].float() / temperature
    lsm = torch.log_softmax(logits, dim=-1)
    logps = lsm.gather(-1, ids[:, -T:].unsqueeze(-1)).squeeze(-1)
    return logps, -(lsm.exp() * lsm).sum(-1)


@pytest.mark.parametrize("chunk_tokens, micro_batch_size", [(1, 1), (7, 2), (4096, 8)])
def test_chunked_scores_equal_unchunked(teacher_path, chunk_tokens, micro_batch_size):
    model = AutoModelForCausalLM.from_pretrained(teacher_path).eval()
    tok = AutoTokenizer.from_pretrained(teacher_path)
    ids, mask, T = batch(tok)
    with torch.no_grad():
        ref_lp, ref_h = reference_scores(model, ids, mask, T)
        ref_lp07, _ = reference_scores(model, ids, mask, T, temperature=0.7)
    out = score_tokens(model, ids, mask, T, temperatures=(1.0, 0.7), with_entropy=True, chunk_tokens=chunk_tokens,
                       micro_batch_size=micro_batch_size)
    assert out["logps"][0].dtype == torch.float32 and out["entropy"].shape == (3, T)
    valid = mask[:, -T:].bool()
    assert torch.allclose(out["logps"][0][valid], ref_lp[valid], atol=1e-5)
    assert torch.allclose(out["logps"][1][valid], ref_lp07[valid], atol=1e-5)  # both temperatures, one forward
    assert torch.allclose(out["entropy"][valid], ref_h[valid], atol=1e-5)
    assert out["forwards"] == -(-3 // micro_batch_size)
    # the full-vocabulary entropy is bounded by log V and the log-probs are of the sampled ids
    assert float(out["entropy"].max()) <= torch.log(torch.tensor(151936.0)) + 1e-4


def test_vocabulary_check_refuses_a_smaller_or_different_vocabulary(tmp_path, teacher_path):
    student_tok = AutoTokenizer.from_pretrained(teacher_path)
    small = Qwen3Config(
        vocab_size=1000, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
    )
    with pytest.raises(TeacherVocabularyError, match="1000 embedding rows"):
        check_vocabulary(student_tok, teacher_path, small)
    # same size, one token remapped in the teacher's tokenizer
    other = make_tiny_qwen3(tmp_path / "other", seed=1)
    t = AutoTokenizer.from_pretrained(other)
    t.add_tokens(["<winnow-extra-token>"])
    t.save_pretrained(other)
    with pytest.raises(TeacherVocabularyError, match="tokenizer differs"):
        check_vocabulary(student_tok, str(other), AutoModelForCausalLM.from_pretrained(other).config)
    # same family
    check_vocabulary(student_tok, teacher_path, AutoModelForCausalLM.from_pretrained(teacher_path).config)
