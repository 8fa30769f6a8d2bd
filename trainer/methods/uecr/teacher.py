"""The frozen teacher of UECR-GRPO and the teacher-assisted baselines: loading and token scoring.

``load_teacher`` loads the teacher frozen (eval mode, no grad, dropout off), checks that it reads the student's
token ids, and prepares it the way TRL prepares its reference model: ``prepare_deepspeed`` under DeepSpeed
(ZeRO-3 partitions it over ranks; other stages keep a stage-0 replica), ``accelerator.prepare_model(...,
evaluation_mode=True)`` otherwise.

``score_tokens`` gives per-token log-probs of the sampled tokens at one or more temperatures and the
full-vocabulary entropy at the first, all in float32, from **one** backbone pass: the LM head runs over chunks
of ``chunk_tokens`` positions, so memory never holds (batch, length, vocab) float32 logits (Qwen3's vocabulary
is 151,936; a 16k-token response would need 9.7 GB per sequence). Written here rather than with TRL's fused
LM head because that head bakes one temperature into the model, and UECR needs the old policy at raw T = 1
(the teacher gap) *and* at the sampling temperature (PPO ratios) from the same forward.

Under ZeRO-3 every forward is a collective: all ranks must run the same number of them. Forwards are counted
in rows (micro-batches of ``micro_batch_size``, each trimmed to its own longest prompt and completion) or, with
``token_budget`` (``micro_batch_tokens``), in the token-budget chunks the loss passes use; the count is all-reduced
to the maximum over ranks, so a rank with fewer forwards runs extra dummy forwards instead of leaving the others
waiting.

Each forward (backbone and chunked head) runs inside the model's root forward, as TRL's fused LM head does
(trl==1.16.0:trl/trainer/utils.py ``add_fused_lm_head``, the head gathered inside the forward that
``_get_per_token_logps_and_entropies`` calls): ZeRO-3 resets its parameter-fetch trace only in a forward pre-hook on
the root module (deepspeed==0.19.8:deepspeed/runtime/zero/parameter_offload.py:304-308, ``_start_of_forward_hook`` ->
``reset_step``, the only caller of partitioned_param_coordinator.py:251 ``reset_step``), and prefetches only on a
complete trace (partitioned_param_coordinator.py:422). Calling the backbone directly never fires that hook: the
teacher's trace stays invalid (every layer fetched on demand, none prefetched) and the policy's, recorded in training,
is invalidated by the out-of-trace call (partitioned_param_coordinator.py:203-219).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl.models import prepare_deepspeed
from trl.trainer.utils import maybe_gather_lm_head_ctx

from trainer import trl_contact
from trainer.pipeline.token_budget import equal_forward_fillers, plan_trimmed, row_extents, shortest_row


class TeacherVocabularyError(ValueError):
    """The teacher does not read the student's token ids the same way."""


def check_vocabulary(
    student_tokenizer: Any, teacher_path: str, teacher_config: Any, revision: str | None = None,
    trust_remote_code: bool = False,
) -> None:
    """Refuse a teacher whose tokenizer maps any token differently from the student's, or whose embedding table
    is smaller than the student's vocabulary (its log-probs would be of other tokens). Raises
    :class:`TeacherVocabularyError` with both sizes and the first differing token."""
    student_vocab = student_tokenizer.get_vocab()
    rows = int(getattr(teacher_config.get_text_config(), "vocab_size", 0) or 0)
    if rows < len(student_vocab):
        raise TeacherVocabularyError(
            f"teacher {teacher_path!r} has {rows} embedding rows but the student's tokenizer has {len(student_vocab)} "
            "tokens; teacher and student must share a tokenizer (e.g. both Qwen3)"
        )
    try:
        teacher_tokenizer = AutoTokenizer.from_pretrained(teacher_path, revision=revision,
                                                          trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return  # a checkpoint without tokenizer files: the embedding-size check above is all we can do
    teacher_vocab = teacher_tokenizer.get_vocab()
    if teacher_vocab != student_vocab:
        differing = sorted(set(student_vocab.items()) ^ set(teacher_vocab.items()), key=lambda kv: kv[1])[:1]
        raise TeacherVocabularyError(
            f"teacher {teacher_path!r} tokenizer differs from the student's "
            f"({len(teacher_vocab)} vs {len(student_vocab)} tokens; first difference {differing}); teacher log-probs "
            "would score other tokens. Use a teacher of the student's family"
        )


def load_teacher(args: Any, accelerator: Any, student_tokenizer: Any) -> torch.nn.Module:
    """Load ``args.teacher_model_name_or_path`` frozen and prepared for this launch (see the module docstring)."""
    path, revision = args.teacher_model_name_or_path, args.teacher_revision
    remote = bool(getattr(args, "trust_remote_code", False))  # the policy's setting (GRPOConfig) covers the teacher
    config = AutoConfig.from_pretrained(path, revision=revision, trust_remote_code=remote)
    check_vocabulary(student_tokenizer, path, config, revision, trust_remote_code=remote)
    dtype = "auto" if args.teacher_dtype == "auto" else getattr(torch, args.teacher_dtype)
    model = AutoModelForCausalLM.from_pretrained(path, revision=revision, dtype=dtype, trust_remote_code=remote)
    if getattr(args, "cast_lm_head_to_fp32", False):
        # TRL casts the policy's and the reference model's heads for this flag; the teacher's head follows. (Scoring
        # runs its head matmul in float32 either way; this keeps the weights themselves unrounded.)
        _cast_head_to_fp32(model)
    model.eval()
    model.requires_grad_(False)
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        return prepare_deepspeed(model, accelerator)
    return accelerator.prepare_model(model, evaluation_mode=True)


def _cast_head_to_fp32(model: torch.nn.Module) -> None:
    """The LM head's weights in float32; with tied embeddings the shared table's outputs go back to the model's
    dtype, as TRL does for its own models (trl/trainer/grpo_trainer.py, ``_cast_lm_head_to_fp32``)."""
    original = model.get_output_embeddings().weight.dtype
    model.get_output_embeddings().float()
    if getattr(model.config.get_text_config(), "tie_word_embeddings", False) and original != torch.float32:
        model.get_input_embeddings().register_forward_hook(lambda module, args, output: output.to(original))


def _root_inner(model: Any) -> Any:
    """The module a wrapper's forward calls (DeepSpeedEngine / DDP ``.module``), else the model itself: the root
    ZeRO-3 hooks (deepspeed/runtime/zero/parameter_offload.py:308, ``self.module.register_forward_pre_hook``)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def through_root(model: Any, fn: Any, **inputs: Any) -> Any:
    """``fn()`` run as the forward of ``model``'s root module, called with ``inputs`` (which its hooks see; ``fn``
    takes its own), so the root's forward hooks fire around it (ZeRO-3's trace reset and fetches: see the module
    docstring). TRL's own forward redirection does it (``trl_contact.run_as_forward``: the root's ``forward``
    replaced for the one call, as TRL's distillation trainer runs its loss)."""
    return trl_contact.run_as_forward(model, _root_inner(model), lambda *args, **kwargs: fn(), **inputs)


def _core(model: Any) -> Any:
    """The transformers model inside DeepSpeed / DDP / PEFT wrappers (its forward hooks stay armed)."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module  # DeepSpeedEngine (which forwards attribute lookups, so test the type), DDP
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()  # PEFT: the base model with the adapters injected
    return model


# Vocabulary rows cast to float32 at a time by the head: bounds the transient fp32 copy of a bf16 head (16,384 x 4,096
# x 4 B = 268 MB for Qwen3-8B) instead of a second full copy of the matrix (2.5 GB).
HEAD_VOCAB_BLOCK = 16_384


def logit_scale(text_config: Any) -> float:
    """The multiplier a model applies to its logits before any softcap, resolved as TRL 1.16's fused LM head does
    (trl/trainer/utils.py ``add_fused_lm_head``): ``logit_scale`` (Cohere), ``output_multiplier``,
    ``lm_head_multiplier`` (Falcon-H1), else ``1 / logits_scaling`` (Granite, MiniCPM3; HyperCLOVA X multiplies)."""
    scale = getattr(text_config, "logit_scale", None)
    if scale is None:
        scale = getattr(text_config, "output_multiplier", None)
    if scale is None:
        scale = getattr(text_config, "lm_head_multiplier", None)
    if scale is None and getattr(text_config, "logits_scaling", None) is not None:
        scaling = text_config.logits_scaling
        scale = scaling if getattr(text_config, "model_type", None) == "hyperclovax" else 1 / scaling
    return 1.0 if scale is None else float(scale)


def _head(core: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Float32 logits of ``hidden`` (positions, d): the matmul itself in float32 (a bf16 product would round logits
    of 16-40 by up to 0.06-0.12 before the log-softmax), the model's logit scale and softcap applied as its own
    forward does."""
    text_config = core.config.get_text_config()
    h = hidden.float()
    with torch.autocast(h.device.type, enabled=False):
        if weight.dtype == torch.float32:
            logits = F.linear(h, weight, None if bias is None else bias.float())
        else:
            blocks = []
            for start in range(0, weight.shape[0], HEAD_VOCAB_BLOCK):
                rows = slice(start, start + HEAD_VOCAB_BLOCK)
                blocks.append(F.linear(h, weight[rows].float(), None if bias is None else bias[rows].float()))
            logits = torch.cat(blocks, dim=-1)
    scale = logit_scale(text_config)
    if scale != 1.0:
        logits = logits * scale
    cap = getattr(text_config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


@torch.no_grad()
def score_tokens(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    temperatures: Sequence[float] = (1.0,),
    with_entropy: bool = False,
    chunk_tokens: int = 512,
    micro_batch_size: int = 4,
    token_budget: int | None = None,
    accelerator: Any = None,
) -> dict[str, Any]:
    """Log-probs of the last ``logits_to_keep`` tokens of each row at each temperature (``logps``: a list of
    (B, logits_to_keep) float32 tensors) and, with ``with_entropy``, the full-vocabulary entropy at
    ``temperatures[0]`` (``entropy``). Alignment is TRL's: position t scores token t from the prefix before it.
    ``forwards`` = the number of backbone forwards this rank ran (equal on every rank when ``accelerator`` is
    given); ``padded`` / ``real`` = the tokens those forwards paid for and the unpadded ones.

    Rows go through the backbone ``micro_batch_size`` at a time (each micro-batch trimmed to its own longest prompt
    and completion), or with ``token_budget`` (``micro_batch_tokens``)
    in the token-budget chunks of the loss and old-log-prob passes (trainer/pipeline/token_budget.py): length-sorted,
    padded size within the budget, each chunk trimmed to its own longest row; columns a chunk trimmed away hold 0
    (padding in every one of its rows)."""
    core = _core(model)
    B = input_ids.shape[0]
    if token_budget is None:
        forwards, padded = _row_forwards(input_ids, attention_mask, logits_to_keep, micro_batch_size, accelerator)
    else:
        forwards, padded = _budget_forwards(input_ids, attention_mask, logits_to_keep, token_budget, accelerator)
    logps = [input_ids.new_zeros((B, logits_to_keep), dtype=torch.float32) for _ in temperatures]
    entropy = input_ids.new_zeros((B, logits_to_keep), dtype=torch.float32) if with_entropy else None
    for rows, ids, mask, width in forwards:
        # inside the root's forward: ZeRO-3's trace reset and prefetch engage (module docstring)
        score = functools.partial(_forward_scores, core, ids, mask, width, temperatures, with_entropy, chunk_tokens,
                                  dummy=rows is None)
        out_lp, out_h = through_root(model, score, input_ids=ids, attention_mask=mask)
        if rows is None:  # a dummy: ZeRO-3's collectives in lockstep with ranks that have more rows
            continue
        n_rows = ids.shape[0]
        for k in range(len(temperatures)):
            logps[k][rows, :width] = out_lp[k].view(n_rows, width)
        if with_entropy:
            entropy[rows, :width] = out_h.view(n_rows, width)
    return {"logps": logps, "entropy": entropy, "forwards": len(forwards), "padded": padded,
            "real": int(attention_mask.sum())}


def _forward_scores(core: Any, ids: torch.Tensor, mask: torch.Tensor, width: int, temperatures: Sequence[float],
                    with_entropy: bool, chunk_tokens: int, dummy: bool) -> tuple[list[torch.Tensor], Any]:
    """One backbone forward and the float32 head over the last ``width`` positions' states, in chunks of
    ``chunk_tokens``: (flat log-probs per temperature, flat entropy or None); a dummy only runs the collectives."""
    lm_head = core.get_output_embeddings()
    hidden = core.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    with maybe_gather_lm_head_ctx(lm_head.weight, lm_head.bias):  # a collective too: dummy forwards enter it
        if dummy:
            return [], None
        hidden = hidden[:, -width - 1 : -1]  # state before each kept token
        flat = hidden.reshape(-1, hidden.shape[-1])
        flat_targets = ids[:, -width:].reshape(-1)
        out_lp = [torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device) for _ in temperatures]
        out_h = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device) if with_entropy else None
        for start in range(0, flat.shape[0], chunk_tokens):
            part = slice(start, start + chunk_tokens)
            logits = _head(core, flat[part], lm_head.weight, lm_head.bias)
            for k, temperature in enumerate(temperatures):
                lsm = torch.log_softmax(logits / temperature, dim=-1)
                out_lp[k][part] = lsm.gather(-1, flat_targets[part].unsqueeze(-1)).squeeze(-1)
                if k == 0 and with_entropy:
                    out_h[part] = -(lsm.exp() * lsm).sum(-1)
            del logits
    return out_lp, out_h


def _row_forwards(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, micro_batch_size: int,
                  accelerator: Any) -> tuple[list[tuple], int]:
    """``(rows, ids, mask, width)`` per forward in row micro-batches of ``micro_batch_size``, in order, each trimmed
    to its own longest prompt and completion (a batch padded to its longest row would make every micro-batch pay
    for that row), then dummies (``rows`` None) up to the largest count over ranks; and the padded tokens."""
    B = input_ids.shape[0]
    P = input_ids.shape[1] - logits_to_keep
    p_ext, c_ext = row_extents(attention_mask[:, :P], attention_mask[:, P:])
    n_forwards = math.ceil(B / micro_batch_size)
    if accelerator is not None and accelerator.num_processes > 1:
        n = torch.tensor([n_forwards], device=input_ids.device)
        n_forwards = int(accelerator.reduce(n, reduction="max"))
    out, padded = [], 0
    for f in range(n_forwards):
        rows = list(range(f * micro_batch_size, min((f + 1) * micro_batch_size, B)))
        if rows:
            out.append(_trimmed(input_ids, attention_mask, P, rows, max(p_ext[r] for r in rows),
                                max(max(c_ext[r] for r in rows), 1)))
            padded += out[-1][1].numel()
            continue
        ids = input_ids[:1] if B else input_ids.new_zeros((1, logits_to_keep + 1))
        out.append((None, ids, attention_mask[:1] if B else torch.ones_like(ids), logits_to_keep))
    return out, padded


def _trimmed(input_ids: torch.Tensor, attention_mask: torch.Tensor, P: int, rows: list[int], p_keep: int,
             c_keep: int) -> tuple:
    """``(rows, ids, mask, width)`` of ``rows`` with the last ``p_keep`` prompt columns (at least one: the state
    before the first completion token) and the first ``c_keep`` completion columns."""
    index = torch.tensor(rows, device=input_ids.device)
    cols = slice(P - min(max(p_keep, 1), P), P + c_keep)
    return index, input_ids[index, cols], attention_mask[index, cols], c_keep


def _budget_forwards(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, budget: int,
                     accelerator: Any) -> tuple[list[tuple], int]:
    """:func:`_row_forwards` over token-budget chunks (the planner of the loss and old-log-prob passes): ``rows`` a
    row index, ``ids`` / ``mask`` trimmed to the chunk's longest prompt and longest completion, ``width`` that
    completion width; dummies are the shortest row, trimmed."""
    P = input_ids.shape[1] - logits_to_keep
    p_ext, c_ext = row_extents(attention_mask[:, :P], attention_mask[:, P:])
    plan, stats = plan_trimmed(p_ext, c_ext, budget)
    out = [_trimmed(input_ids, attention_mask, P, *chunk) for chunk in plan]
    fillers = equal_forward_fillers(accelerator, len(out), input_ids.device)
    if fillers:
        if len(p_ext):
            r = shortest_row(p_ext, c_ext)
            _, ids, mask, width = _trimmed(input_ids, attention_mask, P, [r], p_ext[r], max(c_ext[r], 1))
        else:  # no rows on this rank at all
            ids = input_ids.new_zeros((1, 2))
            mask, width = torch.ones_like(ids), 1
        out += [(None, ids, mask, width)] * fillers
    return out, stats["padded"]
