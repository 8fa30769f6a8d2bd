"""Issue 19 items 8, 9, 10: precision that only bites on a GPU run, checked on the CPU.

- Teacher scoring computes its LM head in float32 even for a bf16 teacher (the old bf16 product rounded logits of
  16-40 by up to 0.1 before the float32 log-softmax), honours ``cast_lm_head_to_fp32`` and the logit scale of the
  Cohere / Granite families, against a hand computation or the model's own forward.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, CohereConfig, GraniteConfig, Qwen3Config

from trainer.methods.uecr.teacher import load_teacher, score_tokens
from trainer.tools.assets import make_tiny_qwen3

VOCAB = 512


def _ids(rows: int = 2, length: int = 12, vocab: int = VOCAB):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    return ids, mask


def _tiny(config_cls, **extra):
    torch.manual_seed(0)
    config = config_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, **extra)
    return AutoModelForCausalLM.from_config(config).eval()


def test_bf16_teacher_scores_with_a_float32_head():
    """A bf16 model with logits of ~16-40: scores equal the float32 head on the bf16 backbone's hidden states
    (the hand reference), and differ from the bf16 product by far more than the tolerance (so the test can fail)."""
    model = _tiny(Qwen3Config, head_dim=8).to(torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(120.0)  # realistic logit magnitudes for a trained LM
    ids, mask = _ids()
    T = 8
    with torch.no_grad():  # each row's own tokens: one row per forward, trimmed to it, as the scorer runs them
        hidden = torch.cat([model.model(input_ids=ids[r : r + 1, mask[r].bool()]).last_hidden_state[:, -T - 1 : -1]
                            for r in range(ids.shape[0])])
        logits32 = F.linear(hidden.float(), model.lm_head.weight.float())
        logits16 = F.linear(hidden, model.lm_head.weight).float()
    assert logits32.abs().amax() > 16, "the check needs logits in the range where bf16 rounding shows"
    lsm = torch.log_softmax(logits32, -1)
    want = lsm.gather(-1, ids[:, -T:].unsqueeze(-1)).squeeze(-1)
    want_h = -(lsm.exp() * lsm).sum(-1)
    rounded = torch.log_softmax(logits16, -1).gather(-1, ids[:, -T:].unsqueeze(-1)).squeeze(-1)
    out = score_tokens(model, ids, mask, T, with_entropy=True, chunk_tokens=5, micro_batch_size=1)
    bf16_error = float((rounded - want).abs().max())
    assert bf16_error > 0.02  # what the bf16 head got wrong, in nats (measured 0.13 here)
    torch.testing.assert_close(out["logps"][0], want, rtol=0, atol=bf16_error / 100)
    torch.testing.assert_close(out["entropy"], want_h, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config_cls, extra", [(CohereConfig, dict(logit_scale=0.0625)),
                                               (GraniteConfig, dict(logits_scaling=8.0))])
def test_logit_scale_families_score_as_their_own_forward(config_cls, extra):
    """Cohere multiplies its logits by ``logit_scale``, Granite divides by ``logits_scaling``: the chunked head must
    give the model's own forward's log-probs (unscaled logits would be 8-16x too sharp)."""
    model = _tiny(config_cls, **extra)
    ids, mask = _ids()
    T = 7
    with torch.no_grad():
        lsm = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, -T - 1 : -1].float(), -1)
    want = lsm.gather(-1, ids[:, -T:].unsqueeze(-1)).squeeze(-1)
    out = score_tokens(model, ids, mask, T, with_entropy=True, chunk_tokens=4)
    torch.testing.assert_close(out["logps"][0], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["entropy"], -(lsm.exp() * lsm).sum(-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tied", [False, True])
def test_teacher_head_follows_cast_lm_head_to_fp32(tmp_path, tied):
    """``cast_lm_head_to_fp32: true`` casts the teacher's head like TRL casts the policy's; the rest stays bf16 and a
    tied teacher still runs (its embedding outputs go back to bf16)."""
    path = make_tiny_qwen3(tmp_path / "teacher", seed=5, tie_word_embeddings=tied)
    accelerator = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None),
                                  prepare_model=lambda model, evaluation_mode: model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    dtypes = {}
    for flag in (False, True):
        args = SimpleNamespace(teacher_model_name_or_path=str(path), teacher_revision=None, teacher_dtype="bfloat16",
                               cast_lm_head_to_fp32=flag)
        teacher = load_teacher(args, accelerator, tokenizer)
        dtypes[flag] = (teacher.lm_head.weight.dtype, teacher.model.layers[0].mlp.up_proj.weight.dtype)
        ids, mask = _ids(vocab=1000)
        assert torch.isfinite(score_tokens(teacher, ids, mask, 5)["logps"][0]).all()
    assert dtypes[False] == (torch.bfloat16, torch.bfloat16)
    assert dtypes[True] == (torch.float32, torch.bfloat16)
