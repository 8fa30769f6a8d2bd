"""Analytic per-GPU memory of a training process, by phase, for the preflight (``launch/train.py --dry-run``).

Counted in bytes from the model shape and the recipe (no GPU, nothing loaded); each term is named so a user sees
what dominates. Assumptions, stated once:

- model states (AdamW, mixed precision): bf16 weights 2 B/param, gradients 4 B/param when DeepSpeed accumulates in
  fp32 (``data_types.grad_accum_dtype``, launch/deepspeed/*.json) or 2 B in bf16, fp32 master weights 4 B and Adam's
  two moments 8 B. ZeRO-3 divides all of it by the data-parallel size; ZeRO-2 divides gradients and optimizer state;
  DDP keeps everything (float32 weights, gradients and moments: 16 B/param, since bf16 weights need fp32 masters);
- ZeRO-3 also holds gathered parameters: two transformer layers (current + prefetch) and, around the LM head, the
  whole output matrix in bf16;
- the reference model (beta > 0) and the frozen teacher hold bf16 weights, partitioned under ZeRO-3;
- activations with gradient checkpointing: every layer's input (rows x length x hidden x 2 B) plus one layer
  recomputed in backward -- q, k, v, o, the MLP's gate/up/activation and their gradients, ~2 x (4h + 3i) values per
  position -- and, with SDPA, the 4-D boolean attention mask (rows x length^2 bytes; flash-attention needs none);
- TRL's fused LM head holds one (4,096 tokens x 32,768 vocabulary rows) tile in bf16 and its float32 copy; the
  teacher's scoring chunk holds ``teacher_chunk_tokens`` x vocabulary float32 logits three times (logits,
  log-softmax, probabilities);
- four terms of the backward a first 8B run showed the estimate missing (each formula at its function, with the
  library line it comes from): the float32 RMSNorm inputs autograd keeps in the recomputed layer and at the final
  norm (:func:`rmsnorm_fp32_inputs`), SDPA's repeated key/value heads (:func:`repeat_kv_copies`), SDPA's own
  float copy of the boolean mask (:func:`float_attention_mask`) and the float32 ``grad_weight`` of TRL's fused
  head with its bf16 cast (:func:`fused_head_grad_weight`); the teacher's no-grad forward pays the two attention
  terms too;
- ZeRO-3's gradient reduce bucket (HF's ``auto`` size, hidden^2 elements) with ``overlap_comm`` on, as
  launch/deepspeed/zero3.json sets it (DeepSpeed's own stage-3 default): the bucket plus two buckets of gradients
  whose reduce is still in flight (:func:`reduce_buckets`);
- a fixed 3 GB for the CUDA context, NCCL buffers and allocator fragmentation (the launcher asks the allocator for
  expandable segments, which keeps fragmentation down, launch/train.py);
- with ``micro_batch_tokens`` (trainer/pipeline/token_budget.py) a forward holds at most ``max(budget, length)``
  padded tokens (a single row longer than the budget runs alone), whatever the row count: the policy backward and
  the teacher's scoring are counted for that many tokens, i.e. ``max(budget, length) / length`` rows of ``length``
  (the SDPA mask, rows x length^2, is then at most tokens x length).

Every term of a phase is counted as held at once. In the policy backward that is an upper bound: the fused head's
``grad_weight`` and the final norm's inputs are freed before the first layer is recomputed. :func:`tight_phases`
names the phases whose total comes within a margin of the usable budget, with the terms that dominate them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9
RUNTIME_OVERHEAD = 3 * GB


def fused_head_tile() -> tuple[int, int]:
    """TRL's fused LM head tile: (tokens, vocabulary rows), as TRL 1.16 sizes it (read in trainer/trl_contact.py)."""
    from trainer import trl_contact  # heavy: torch (trl_contact); the estimate itself is arithmetic

    return trl_contact.fused_head_tile()


@dataclass(frozen=True)
class Shape:
    """What the estimate needs from a causal LM's config."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    max_positions: int | None = None

    @property
    def params(self) -> int:
        """Parameter count: embeddings (+ an untied head), attention and SwiGLU MLP per layer, norms."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer layer."""
        return (self.params - self.vocab * self.hidden * (1 if self.tied else 2) - self.hidden) // self.layers


def shape_from_config(config: dict) -> Shape:
    """A :class:`Shape` from a ``config.json`` mapping (Qwen2/Qwen3/Llama field names)."""
    heads = config["num_attention_heads"]
    return Shape(
        hidden=config["hidden_size"], layers=config["num_hidden_layers"], heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads, intermediate=config["intermediate_size"],
        vocab=config["vocab_size"], tied=bool(config.get("tie_word_embeddings", False)),
        max_positions=config.get("max_position_embeddings"),
    )


@dataclass(frozen=True)
class Launch:
    """The launch the estimate is for."""

    world: int  # training processes (data-parallel size)
    zero_stage: int  # 0 = DDP / one process, 2 or 3 = DeepSpeed ZeRO
    fp32_grad_accum: bool = True
    flash_attention: bool = False
    overlap_comm: bool = True  # launch/deepspeed/zero3.json


def model_states(shape: Shape, launch: Launch) -> dict[str, float]:
    """Weights, gradients and optimizer state per GPU."""
    P, W = shape.params, launch.world
    grad = 4 if launch.fp32_grad_accum else 2
    if launch.zero_stage == 3:
        return {"weights (bf16, ZeRO-3 shard)": 2 * P / W, f"gradients ({grad} B, shard)": grad * P / W,
                "fp32 master + Adam moments (shard)": 12 * P / W}
    if launch.zero_stage == 2:
        return {"weights (bf16, full)": 2 * P, f"gradients ({grad} B, shard)": grad * P / W,
                "fp32 master + Adam moments (shard)": 12 * P / W}
    return {"weights (fp32)": 4 * P, "gradients (fp32)": 4 * P, "Adam moments (fp32)": 8 * P}


def frozen_model(shape: Shape, launch: Launch) -> float:
    """A frozen bf16 model (reference or teacher): partitioned under ZeRO-3, a replica otherwise."""
    return 2 * shape.params / (launch.world if launch.zero_stage == 3 else 1)


def gathered_params(shape: Shape, launch: Launch) -> float:
    """ZeRO-3's gathered working set: two layers plus the LM head matrix (bf16)."""
    if launch.zero_stage != 3:
        return 0.0
    return 2 * (2 * shape.layer_params + shape.vocab * shape.hidden)


def _tile_bytes() -> float:
    tokens, vocab = fused_head_tile()
    return tokens * vocab * (2 + 4)


def rmsnorm_fp32_inputs(shape: Shape, rows: float, length: int) -> float:
    """Float32 RMSNorm inputs autograd saves: Qwen3RMSNorm upcasts its input (transformers==5.24.0:
    transformers/models/qwen3/modeling_qwen3.py:61, ``hidden_states.to(torch.float32)``) and ``pow`` / the
    ``rsqrt`` product keep that float32 tensor for backward (:62-63). Checkpointing drops them with the layer, but
    the one layer recomputed in backward holds them again for its four norms -- input and post-attention (hidden
    each), q_norm (heads x head_dim) and k_norm (kv_heads x head_dim), :245-246, :299, :314 -- and the final norm,
    outside every checkpointed layer, keeps its input from the forward until the head's backward is done:
    rows x length x (3 hidden + (heads + kv_heads) x head_dim) x 4 B."""
    per_position = 3 * shape.hidden + (shape.heads + shape.kv_heads) * shape.head_dim
    return rows * length * per_position * 4


def repeat_kv_copies(shape: Shape, rows: float, length: int) -> float:
    """Key and value repeated to every query head before SDPA: with a padding mask on CUDA transformers does not use
    SDPA's own GQA (transformers==5.24.0:transformers/integrations/sdpa_attention.py:42-51 ``use_gqa_in_sdpa`` needs
    no mask) and calls ``repeat_kv`` (:126-127; modeling_qwen3.py:165-174, an ``expand`` then ``reshape``, i.e. a
    copy), which SDPA keeps for its backward: 2 x rows x length x heads x head_dim x 2 B (bf16). 0 when there is
    a single KV group."""
    if shape.kv_heads >= shape.heads:
        return 0.0
    return 2 * rows * length * shape.heads * shape.head_dim * 2


def float_attention_mask(rows: float, length: int) -> float:
    """SDPA's additive copy of the boolean 4-D mask transformers builds (transformers==5.24.0:
    transformers/masking_utils.py:395 ``sdpa_mask``, boolean): torch's memory-efficient and math kernels take a
    float bias, so ``scaled_dot_product_attention`` converts the mask to the query's dtype
    (aten/src/ATen/native/transformers/attention.cpp ``convert_boolean_attn_mask``) and the efficient kernel keeps
    it for backward: rows x length^2 x 2 B (bf16), on top of the boolean mask."""
    return rows * length * length * 2


def fused_head_grad_weight(shape: Shape) -> float:
    """The LM head's gradient in TRL's fused head backward: accumulated in a float32 ``grad_weight`` of the full
    (vocabulary x hidden) matrix (trl==1.16.0:trl/kernels/chunked_logprob.py:409-411, "Always accumulate in fp32")
    and returned cast to the weight's dtype (:457), both alive at the cast: vocabulary x hidden x (4 + 2) B."""
    return shape.vocab * shape.hidden * (4 + 2)


def reduce_buckets(shape: Shape, launch: Launch) -> float:
    """ZeRO-3's gradient reduce bucket (deepspeed==0.19.8:deepspeed/runtime/zero/stage3.py:780-784, allocated with
    contiguous_gradients, ``reduce_bucket_size`` elements; HF's ``auto`` is hidden^2,
    transformers/integrations/deepspeed.py:232), counted in float32, and with ``overlap_comm`` the bf16 gradients of
    up to two more buckets whose reduce on the side stream is still in flight (stage3.py:340-341 the stream,
    :462 and :1664-1667 two reduce events): hidden^2 x (4 + 2 x 2) B; hidden^2 x 4 B without overlap."""
    if launch.zero_stage != 3:
        return 0.0
    bucket = shape.hidden * shape.hidden
    return bucket * (4 + (2 * 2 if launch.overlap_comm else 0))


def backward_activations(shape: Shape, rows: float, length: int, launch: Launch) -> dict[str, float]:
    """Activation memory of one micro-batch's backward with gradient checkpointing."""
    h, i = shape.hidden, shape.intermediate
    out = {
        "checkpointed layer inputs": shape.layers * rows * length * h * 2,
        "one layer recomputed (+ grads)": 2 * rows * length * (4 * h + 3 * i) * 2,
        "fp32 RMSNorm inputs (recomputed layer + final norm)": rmsnorm_fp32_inputs(shape, rows, length),
        "fused LM head tile (bf16 + fp32 copy) + hidden grad": _tile_bytes() + rows * length * h * 4,
        "fused LM head grad_weight (fp32 + bf16 cast)": fused_head_grad_weight(shape),
    }
    out.update(_attention_terms(shape, rows, length, launch))
    return out


def _attention_terms(shape: Shape, rows: float, length: int, launch: Launch) -> dict[str, float]:
    """What SDPA holds per layer beyond q, k, v: the boolean mask, its float copy and the repeated KV heads
    (flash-attention takes no mask and reads the KV heads as they are)."""
    if launch.flash_attention:
        return {}
    return {"SDPA 4-D attention mask": rows * length * length,
            "SDPA float mask copy (bf16)": float_attention_mask(rows, length),
            "repeat_kv key/value copies": repeat_kv_copies(shape, rows, length)}


def teacher_scoring(teacher: Shape, rows: float, length: int, chunk_tokens: int, launch: Launch) -> dict[str, float]:
    """One no-grad teacher forward (a layer's working set) and its float32 head chunk."""
    out = {
        "teacher layer working set": rows * length * (2 * teacher.hidden + 3 * teacher.intermediate) * 2,
        "teacher head chunk (fp32 x3)": chunk_tokens * teacher.vocab * 4 * 3 + 16_384 * teacher.hidden * 4,
    }
    out.update(_attention_terms(teacher, rows, length, launch))
    return out


def budget_rows(length: int, micro_batch_tokens: int) -> float:
    """Rows of ``length`` positions whose tokens equal the most one token-budget forward holds."""
    return max(micro_batch_tokens, length) / length


def estimate(policy: Shape, launch: Launch, *, rows: float, length: int, reference: bool,
             teacher: Shape | None = None, teacher_rows: float = 4, teacher_chunk_tokens: int = 512,
             micro_batch_tokens: int | None = None, critic: Shape | None = None) -> dict:
    """Per-GPU bytes: ``resident`` terms (always held), each phase's transient terms, the per-phase totals and the
    peak phase. ``micro_batch_tokens`` replaces both row counts by :func:`budget_rows`. ``critic``: PPO's value
    model (trained: its own weights, gradients and Adam state, and a backward of its own; no LM head)."""
    if micro_batch_tokens is not None:
        rows = teacher_rows = budget_rows(length, micro_batch_tokens)
    resident = dict(model_states(policy, launch))
    if reference:
        resident["reference model (bf16)"] = frozen_model(policy, launch)
    if teacher is not None:
        resident["teacher (bf16)"] = frozen_model(teacher, launch)
    if critic is not None:
        critic = replace(critic, tied=True)  # embeddings once and a scalar head: no LM head matrix
        resident.update({f"critic {name}": value for name, value in model_states(critic, launch).items()})
    resident["CUDA context, NCCL, fragmentation"] = RUNTIME_OVERHEAD
    gathered = gathered_params(policy, launch)
    phases = {"policy backward": backward_activations(policy, rows, length, launch)}
    if gathered:
        phases["policy backward"]["ZeRO-3 gathered params (2 layers + LM head)"] = gathered
        phases["policy backward"]["ZeRO-3 reduce bucket + grads in flight (overlap_comm)"] = reduce_buckets(
            policy, launch)
    if teacher is not None:
        phases["teacher scoring"] = teacher_scoring(teacher, teacher_rows, length, teacher_chunk_tokens, launch)
        if launch.zero_stage == 3:
            phases["teacher scoring"]["ZeRO-3 gathered teacher params"] = gathered_params(teacher, launch)
    if critic is not None:
        phases["critic backward"] = {name: value for name, value in backward_activations(critic, rows, length,
                                                                                         launch).items()
                                     if "LM head" not in name}
        if gathered:
            phases["critic backward"]["ZeRO-3 gathered critic params"] = gathered_params(critic, launch)
    base = sum(resident.values())
    totals = {name: base + sum(terms.values()) for name, terms in phases.items()}
    peak = max(totals, key=totals.get)
    return {"resident": resident, "phases": phases, "totals": totals, "peak_phase": peak, "peak": totals[peak]}


def tight_phases(est: dict, budget: float, usable: float = 0.95, margin: float = 0.10) -> list[dict]:
    """Phases of :func:`estimate` ``est`` whose total is within ``margin`` of the usable budget (``usable`` x
    ``budget`` bytes, the preflight's 95 %) or over it, tightest first: ``phase``, ``total``, ``spare`` (usable minus
    total, negative when over) and ``largest``, that phase's three largest transient terms (name, bytes) -- what a
    smaller ``micro_batch_tokens`` or fewer rows per micro-batch shrinks."""
    limit = usable * budget
    out = []
    for phase, total in est["totals"].items():
        if total >= (1 - margin) * limit:
            terms = sorted(est["phases"][phase].items(), key=lambda kv: -kv[1])[:3]
            out.append({"phase": phase, "total": total, "spare": limit - total, "largest": terms})
    return sorted(out, key=lambda t: t["spare"])


def tightness_lines(est: dict, budget: float, usable: float = 0.95, margin: float = 0.10) -> list[str]:
    """:func:`tight_phases` as one line each, for a report: the phase, its total against the usable budget, the
    spare and its largest terms; no line when no phase is within ``margin``."""
    lines = []
    for t in tight_phases(est, budget, usable, margin):
        largest = ", ".join(f"{name} {value / GB:.1f} GB" for name, value in t["largest"])
        state = "over" if t["spare"] < 0 else "tight"
        lines.append(f"{state}: {t['phase']} {t['total'] / GB:.1f} GB of {usable * budget / GB:.1f} GB usable "
                     f"({t['spare'] / GB:+.1f} GB spare); largest: {largest}")
    return lines


def checkpoint_bytes(shape: Shape, launch: Launch) -> float:
    """One checkpoint on disk: bf16 weights + fp32 master weights and Adam moments (DeepSpeed writes its optimizer
    shards; plain Trainer writes model + optimizer state) -- ~14 B/param."""
    return shape.params * (2 + 12) if launch.zero_stage else shape.params * (4 + 8)
