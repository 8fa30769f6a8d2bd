"""The frozen teacher: chunked T=1 scoring equals unchunked scoring, alignment with the sampled ids, vocabulary
checks, and the frozen state. (Through the trainer: tests/methods/test_uecr_trainer.py.)"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

from trainer.methods.uecr.teacher import TeacherVocabularyError, check_vocabulary, score_tokens
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


def padded_batch():
    """Five rows laid out as TRL pads a generation batch, wider than any of them: prompts left-padded to 8 columns
    (the longest real prompt has 5 tokens), completions right-padded to 12 (the longest has 9). Row micro-batches
    of 2 are then {0, 1}: 5 + 9 = 14 positions, {2, 3}: 5 + 7 = 12, {4}: 4 + 6 = 10 -- not 8 + 12 = 20."""
    g = torch.Generator().manual_seed(1)
    prompts, completions, P, T = [5, 3, 5, 2, 4], [9, 4, 7, 2, 6], 8, 12
    ids = torch.randint(100, 5000, (5, P + T), generator=g)
    mask = torch.zeros_like(ids)
    for r, (p, c) in enumerate(zip(prompts, completions)):
        mask[r, P - p : P + c] = 1
    ids[mask == 0] = 0
    return ids, mask, T


OWN_LONGEST = [14, 12, 10]  # padded_batch's micro-batches of 2: their own longest prompt + completion


def forward_widths(model) -> list[int]:
    """Positions of every backbone forward of ``model`` from now on (a hook on the module the scorer runs)."""
    from trainer.methods.uecr.teacher import _core

    widths: list[int] = []
    _core(model).base_model.register_forward_pre_hook(
        lambda mod, a, kw: widths.append(int(kw["input_ids"].shape[1])), with_kwargs=True)
    return widths


def test_row_micro_batches_pay_for_their_own_longest_row(teacher_path):
    """A micro-batch of rows is cut to its own longest prompt and completion, not the generation batch's padded
    width (a 16k-token row padded every forward of the UECR recipes to 18,432 positions); the scores stay those of
    the full-width unchunked forward."""
    model = AutoModelForCausalLM.from_pretrained(teacher_path).eval()
    ids, mask, T = padded_batch()
    with torch.no_grad():
        ref_lp, ref_h = reference_scores(model, ids, mask, T)
    widths = forward_widths(model)
    out = score_tokens(model, ids, mask, T, with_entropy=True, micro_batch_size=2)
    assert widths == OWN_LONGEST
    assert out["padded"] == 2 * 14 + 2 * 12 + 10 < ids.numel()
    valid = mask[:, -T:].bool()
    assert torch.allclose(out["logps"][0][valid], ref_lp[valid], atol=1e-5)
    assert torch.allclose(out["entropy"][valid], ref_h[valid], atol=1e-5)


def test_scoring_leaves_the_models_own_forward_in_place(teacher_path):
    """Scoring runs inside the root's forward by swapping it for one call (TRL's forward redirection): afterwards a
    plain model runs its class's forward again (TRL puts it back as the bound method) and a model with TRL's fused LM
    head (an instance-level forward) keeps that one, still working."""
    from trl.trainer.utils import add_fused_lm_head

    plain = AutoModelForCausalLM.from_pretrained(teacher_path).eval()
    ids, mask, T = padded_batch()
    score_tokens(plain, ids, mask, T)
    assert plain.forward.__func__ is type(plain).forward and plain.forward.__self__ is plain
    fused = AutoModelForCausalLM.from_pretrained(teacher_path).eval()
    add_fused_lm_head(fused)
    patched = fused.forward
    out = score_tokens(fused, ids, mask, T)
    assert fused.forward == patched
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        trl = fused(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs[:, -T:]
    valid = mask[:, -T:].bool()
    assert torch.allclose(out["logps"][0][valid], trl[valid], atol=1e-5)


def test_teacher_under_zero3_engages_the_prefetch_trace(tmp_path, teacher_path):
    """Under a real DeepSpeed ZeRO-3 engine (one CPU process, gloo; built as TRL's prepare_deepspeed builds the
    teacher's) every scoring forward goes through the root module, whose forward pre-hook is the only place ZeRO-3
    resets its fetch trace (deepspeed/runtime/zero/parameter_offload.py:304-308): one reset per forward and a
    complete trace afterwards, so later forwards prefetch (partitioned_param_coordinator.py:422). Calling the
    backbone directly left the trace invalid (0 resets). Widths are the micro-batches' own longest rows and the
    scores those of the plain model's full-logit forward."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "zero3.pt"
    worker = Path(__file__).with_name("zero3_teacher_worker.py")
    done = subprocess.run([sys.executable, str(worker), teacher_path, str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(out)
    assert got["partitioned"] and got["forwards"] == 3
    assert got["resets"] == got["forwards"] and got["complete"]
    assert got["widths"] == OWN_LONGEST
    model = AutoModelForCausalLM.from_pretrained(teacher_path).eval()
    ids, mask, T = padded_batch()
    with torch.no_grad():
        ref_lp, ref_h = reference_scores(model, ids, mask, T)
        ref_lp07, _ = reference_scores(model, ids, mask, T, temperature=0.7)
    valid = mask[:, -T:].bool()
    assert torch.allclose(got["logps"][0][valid], ref_lp[valid], atol=1e-5)
    assert torch.allclose(got["logps"][1][valid], ref_lp07[valid], atol=1e-5)
    assert torch.allclose(got["entropy"][valid], ref_h[valid], atol=1e-5)


def test_trust_remote_code_and_revision_reach_every_teacher_loader(teacher_path, monkeypatch):
    """The policy's trust_remote_code (GRPOConfig) and teacher_revision reach the teacher's config, tokenizer and
    weights, as they reach the policy's (a remote-code teacher would otherwise fail to load or prompt)."""
    from types import SimpleNamespace

    from transformers import AutoConfig, PreTrainedModel

    from trainer.methods.uecr.teacher import load_teacher

    seen = []
    loaders = {cls: cls.from_pretrained.__func__ for cls in (AutoConfig, AutoTokenizer, PreTrainedModel)}

    def recording(cls_key):
        def load(cls, *a, **k):
            seen.append((cls_key.__name__, k.get("trust_remote_code"), k.get("revision")))
            return loaders[cls_key](cls, *a, **k)
        return classmethod(load)

    for cls in loaders:
        monkeypatch.setattr(cls, "from_pretrained", recording(cls))
    args = SimpleNamespace(teacher_model_name_or_path=teacher_path, teacher_revision="main", teacher_dtype="float32",
                           trust_remote_code=True, cast_lm_head_to_fp32=False)
    accelerator = SimpleNamespace(state=SimpleNamespace(), prepare_model=lambda model, evaluation_mode: model)
    student = AutoTokenizer.from_pretrained(teacher_path)
    seen.clear()
    load_teacher(args, accelerator, student)
    assert {name for name, _, _ in seen} == {"AutoConfig", "AutoTokenizer", "PreTrainedModel"}, seen
    assert all(remote is True and revision == "main" for _, remote, revision in seen), seen
