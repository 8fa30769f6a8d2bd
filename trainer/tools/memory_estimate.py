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
- a fixed 3 GB for the CUDA context, NCCL buffers and allocator fragmentation;
- with ``micro_batch_tokens`` (trainer/pipeline/token_budget.py) a forward holds at most ``max(budget, length)``
  padded tokens (a single row longer than the budget runs alone), whatever the row count: the policy backward and
  the teacher's scoring are counted for that many tokens, i.e. ``max(budget, length) / length`` rows of ``length``
  (the SDPA mask, rows x length^2, is then at most tokens x length).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
RUNTIME_OVERHEAD = 3 * GB


def fused_head_tile() -> tuple[int, int]:
    """TRL's fused LM head tile: (tokens, vocabulary rows), as TRL 1.16 sizes it (read in trainer/trl_contact.py)."""
    from trainer import trl_contact

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


def backward_activations(shape: Shape, rows: float, length: int, launch: Launch) -> dict[str, float]:
    """Activation memory of one micro-batch's backward with gradient checkpointing."""
    h, i = shape.hidden, shape.intermediate
    out = {
        "checkpointed layer inputs": shape.layers * rows * length * h * 2,
        "one layer recomputed (+ grads)": 2 * rows * length * (4 * h + 3 * i) * 2,
        "fused LM head tile (bf16 + fp32 copy) + hidden grad": _tile_bytes() + rows * length * h * 4,
    }
    if not launch.flash_attention:
        out["SDPA 4-D attention mask"] = rows * length * length
    return out


def teacher_scoring(teacher: Shape, rows: float, length: int, chunk_tokens: int, launch: Launch) -> dict[str, float]:
    """One no-grad teacher forward (a layer's working set) and its float32 head chunk."""
    out = {
        "teacher layer working set": rows * length * (2 * teacher.hidden + 3 * teacher.intermediate) * 2,
        "teacher head chunk (fp32 x3)": chunk_tokens * teacher.vocab * 4 * 3 + 16_384 * teacher.hidden * 4,
    }
    if not launch.flash_attention:
        out["SDPA 4-D attention mask"] = rows * length * length
    return out


def budget_rows(length: int, micro_batch_tokens: int) -> float:
    """Rows of ``length`` positions whose tokens equal the most one token-budget forward holds."""
    return max(micro_batch_tokens, length) / length


def estimate(policy: Shape, launch: Launch, *, rows: float, length: int, reference: bool,
             teacher: Shape | None = None, teacher_rows: float = 4, teacher_chunk_tokens: int = 512,
             micro_batch_tokens: int | None = None) -> dict:
    """Per-GPU bytes: ``resident`` terms (always held), each phase's transient terms, the per-phase totals and the
    peak phase. ``micro_batch_tokens`` replaces both row counts by :func:`budget_rows`."""
    if micro_batch_tokens is not None:
        rows = teacher_rows = budget_rows(length, micro_batch_tokens)
    resident = dict(model_states(policy, launch))
    if reference:
        resident["reference model (bf16)"] = frozen_model(policy, launch)
    if teacher is not None:
        resident["teacher (bf16)"] = frozen_model(teacher, launch)
    resident["CUDA context, NCCL, fragmentation"] = RUNTIME_OVERHEAD
    gathered = gathered_params(policy, launch)
    phases = {"policy backward": backward_activations(policy, rows, length, launch)}
    if gathered:
        phases["policy backward"]["ZeRO-3 gathered params (2 layers + LM head)"] = gathered
    if teacher is not None:
        phases["teacher scoring"] = teacher_scoring(teacher, teacher_rows, length, teacher_chunk_tokens, launch)
        if launch.zero_stage == 3:
            phases["teacher scoring"]["ZeRO-3 gathered teacher params"] = gathered_params(teacher, launch)
    base = sum(resident.values())
    totals = {name: base + sum(terms.values()) for name, terms in phases.items()}
    peak = max(totals, key=totals.get)
    return {"resident": resident, "phases": phases, "totals": totals, "peak_phase": peak, "peak": totals[peak]}


def checkpoint_bytes(shape: Shape, launch: Launch) -> float:
    """One checkpoint on disk: bf16 weights + fp32 master weights and Adam moments (DeepSpeed writes its optimizer
    shards; plain Trainer writes model + optimizer state) -- ~14 B/param."""
    return shape.params * (2 + 12) if launch.zero_stage else shape.params * (4 + 8)
