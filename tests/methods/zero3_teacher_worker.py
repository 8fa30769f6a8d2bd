"""One process under a real DeepSpeed ZeRO-3 engine (CPU accelerator, gloo) scoring the tiny teacher with
trainer/methods/uecr/teacher.py ``score_tokens``; run by tests/methods/test_teacher.py in its own process (DeepSpeed's
process group and transformers' ZeRO-3 flag are process-wide).

    python tests/methods/zero3_teacher_worker.py TEACHER_PATH OUT.pt

The engine is built as TRL's ``prepare_deepspeed`` builds the teacher's (trl==1.16.0:trl/models/utils.py:246-289:
stage 3, its hidden-size bucket sizes, no optimizer, eval). Writes to OUT.pt: the scores, the width of every backbone
forward, how often ZeRO-3's coordinator reset its trace (``reset_step``, called through) and whether the trace
ended complete (prefetch on; partitioned_param_coordinator.py:422).
"""

from __future__ import annotations

import os
import socket
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(teacher_path: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0", DS_ACCELERATOR="cpu")
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    sys.path.insert(0, os.path.dirname(__file__))
    from test_teacher import padded_batch

    from trainer.methods.uecr.teacher import _core, score_tokens

    deepspeed.init_distributed(dist_backend="gloo")
    model = AutoModelForCausalLM.from_pretrained(teacher_path).eval().requires_grad_(False)
    h = model.config.hidden_size
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": h * h,
                                    "stage3_param_persistence_threshold": 10 * h,
                                    "stage3_prefetch_bucket_size": int(0.9 * h * h)},
              "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": False}}
    keep = HfDeepSpeedConfig(config)  # noqa: F841  (alive: transformers' is_deepspeed_zero3_enabled() reads it)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()
    coordinator = engine.optimizer.get_param_coordinator()
    resets = []
    reset_step = coordinator.reset_step
    coordinator.reset_step = lambda: (resets.append(1), reset_step())[1]  # counted, then DeepSpeed's own
    widths = []
    _core(engine).base_model.register_forward_pre_hook(
        lambda mod, a, kw: widths.append(int(kw["input_ids"].shape[1])), with_kwargs=True)
    ids, mask, T = padded_batch()
    scores = score_tokens(engine, ids, mask, T, temperatures=(1.0, 0.7), with_entropy=True, micro_batch_size=2)
    torch.save({"logps": scores["logps"], "entropy": scores["entropy"], "forwards": scores["forwards"],
                "padded": scores["padded"], "widths": widths, "resets": len(resets),
                "complete": coordinator.is_complete_trace(),
                "partitioned": all(hasattr(p, "ds_tensor") for p in engine.module.parameters())}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
