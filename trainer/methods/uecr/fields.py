"""The teacher's, UECR-GRPO's and its baselines' knobs: a mixin of ``WinnowConfig`` (its fields appear there and in
``--help`` like all others).

Every constant of the reconstructed ECR formulas is a field (the paper's displayed equations were lost, so the
form and its constants must stay configurable; see trainer/algorithms/uecr.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trainer.algorithms.uecr import Confidence, Direction, ProjectionNorm
from trainer.config.errors import ConfigError


@dataclass
class TeacherFields:
    """Frozen teacher (UECR-GRPO and the teacher-assisted baselines)."""

    teacher_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Frozen teacher for advantage puu/uecr/pg_opd/distilled_rl/atod and loss_variant naive_hybrid. "
            "Loaded only when such a stage is configured; prepared like TRL's reference model (ZeRO-3: partitioned). "
            "Its tokenizer must match the student's."
        },
    )
    teacher_revision: str | None = field(default=None, metadata={"help": "Hub revision of the teacher."})
    teacher_dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto",
        metadata={
            "help": "Dtype the teacher's weights are loaded in ('auto' = the checkpoint's). Scores are always "
            "computed in float32 at temperature 1."
        },
    )
    teacher_micro_batch_size: int = field(
        default=4,
        metadata={
            "help": "Sequences per teacher (and T=1 student) scoring forward, per process. Ignored when "
            "micro_batch_tokens is set: the token budget then sizes these forwards (same chunks as the loss)."
        },
    )
    teacher_chunk_tokens: int = field(
        default=512,
        metadata={
            "help": "Positions per LM-head chunk when scoring: memory holds at most chunk x vocab float32 logits, "
            "never (batch, length, vocab). Applies within each forward, with or without micro_batch_tokens."
        },
    )

    # --- UECR-GRPO (advantage: puu | uecr) ---------------------------------------------------------------
    uecr_alpha: float = field(
        default=1.0,
        metadata={"help": "alpha: weight of the teacher score in the unified utility R_U = R_task + alpha R_T."},
    )
    uecr_rho: float = field(
        default=0.5, metadata={"help": "rho in [0, 1): ECR redistribution strength, w = 1 + rho q (0 = PUU exactly)."}
    )
    uecr_tau_delta: float = field(
        default=1.0, metadata={"help": "tau_delta: scale of the token gap in d = s tanh(delta/tau_delta)."}
    )
    uecr_tau_h: float = field(
        default=2.0, metadata={"help": "tau_H: teacher-entropy scale of the confidence c = exp(-H/tau_H)."}
    )
    uecr_eps: float = field(
        default=1e-6, metadata={"help": "epsilon added to the population std of the group utility."}
    )
    uecr_normalization: Literal["joint", "separate"] = field(
        default="joint",
        metadata={
            "help": "'joint' (PUU: normalise R_task + alpha R_T together) or 'separate' (the Table 3 ablation: "
            "task and teacher advantages normalised independently, then summed)."
        },
    )
    uecr_use_entropy: bool = field(
        default=True, metadata={"help": "False = ablation 2 of F.7: confidence c = 1 (projection kept)."}
    )
    uecr_use_projection: bool = field(
        default=True, metadata={"help": "False = ablation 3 of F.7: mu^c = 0 (no zero-sum constraint; q = c d)."}
    )
    uecr_weight_full_advantage: bool = field(
        default=False, metadata={"help": "True = ablation 4 of F.7: w multiplies the full A_U, not only A_task|U."}
    )
    uecr_signed_gap: bool = field(
        default=True,
        metadata={
            "help": "False = ablation 6 of F.7 (reconstructed): no signed gap, the direction is confidence alone, "
            "d = s c."
        },
    )
    uecr_direction: Direction = field(
        default="tanh",
        metadata={"help": "Direction squashing: 'tanh' (s tanh(delta/tau)) or 'clip' (s clip(delta/tau, -1, 1))."},
    )
    uecr_confidence: Confidence = field(
        default="exp", metadata={"help": "Confidence: 'exp' (exp(-H/tau_H)) or 'inverse' (1/(1 + H/tau_H))."}
    )
    uecr_projection_norm: ProjectionNorm = field(
        default="one_plus_mean",
        metadata={"help": "Projection normaliser: 'one_plus_mean' (1 + |mu^c|) or 'max' "
                  "(max(1, max_t |c (d - mu^c)|))."},
    )

    # --- teacher-assisted baselines ---------------------------------------------------------------------
    opd_coef: float = field(
        default=1.0,
        metadata={"help": "PG-OPD (advantage pg_opd) and the naive hybrid's OPD term: token advantage = "
                  "coef x delta."},
    )
    distilled_rl_kappa: float = field(
        default=2.0, metadata={"help": "Distilled RL (reconstructed): teacher/old ratio clipped to [1/kappa, kappa]."}
    )
    atod_lambda_start: float = field(default=1.0, metadata={"help": "ATOD (reconstructed): OPD weight at step 0."})
    atod_lambda_end: float = field(default=0.1, metadata={"help": "ATOD: OPD weight after the cosine anneal."})
    atod_anneal_steps: int = field(
        default=0, metadata={"help": "ATOD: cosine-anneal length K in optimizer steps; 0 = the run's total steps."}
    )
    atod_kappa_omega: float = field(
        default=1.0,
        metadata={"help": "ATOD: response weight omega = 1 + kappa_omega sigmoid(z) (z: disagreement + surprisal)."},
    )


def validate_teacher_fields(cfg, needs_teacher: bool) -> None:
    """Fail fast on the fields above (ConfigError naming the field and the fix; WinnowConfig checks the options of
    the Literal-typed ones)."""
    if needs_teacher and not cfg.teacher_model_name_or_path:
        raise ConfigError(
            "teacher_model_name_or_path",
            f"advantage={cfg.advantage!r} / loss_variant={cfg.loss_variant!r} needs a frozen teacher",
            "set teacher_model_name_or_path (a path or hub id with the student's tokenizer)",
        )
    if not 0 <= cfg.uecr_rho < 1:
        raise ConfigError(
            "uecr_rho", f"must be in [0, 1) so that every weight stays > 0 (got {cfg.uecr_rho})", "use e.g. 0.5"
        )
    for name in ("uecr_tau_delta", "uecr_tau_h", "uecr_eps", "teacher_micro_batch_size", "teacher_chunk_tokens"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(name, f"must be > 0 (got {getattr(cfg, name)})", "use a positive value")
    if cfg.uecr_alpha < 0 or cfg.opd_coef < 0 or cfg.atod_kappa_omega < 0 or cfg.atod_anneal_steps < 0:
        raise ConfigError(
            "uecr_alpha", "uecr_alpha, opd_coef, atod_kappa_omega and atod_anneal_steps must be >= 0", "fix the sign"
        )
    if not cfg.distilled_rl_kappa >= 1:
        raise ConfigError("distilled_rl_kappa", f"must be >= 1 (got {cfg.distilled_rl_kappa})", "use e.g. 2.0")
