"""Train from a YAML recipe (TRL style: ``--config recipe.yaml`` plus ``--field value`` overrides).

    accelerate launch launch/train.py --config configs/demo/smollm2-arithmetic.yaml
    accelerate launch --config_file launch/accelerate/zero3_gpu_4.yaml launch/train.py \\
        --config configs/grpo/qwen3-4b-dapo17k.yaml --vllm_server_base_url http://10.0.0.2:8000
    python launch/train.py --config ... --resume_from_checkpoint true      # latest checkpoint in output_dir
    python launch/train.py --config configs/grpo/qwen3-8b-dapo17k.yaml --dry-run   # preflight, loads nothing

Writes into ``output_dir``: checkpoints, ``recipe.resolved.yaml`` (every field, defaults included),
``metrics.jsonl`` and ``metrics.png``. Fields: TaskArguments (trainer/recipe.py), WinnowConfig
(trainer/config.py, includes all of TRL's GRPOConfig) and TRL's ModelConfig.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from trainer.recipe import build_trainer, parse_recipe, save_resolved_recipe  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    """Parse the recipe, build the trainer, train, save the final model."""
    task, args, model_args = parse_recipe(argv)
    trainer = build_trainer(task, args, model_args)
    if trainer.accelerator.is_main_process:
        save_resolved_recipe(task, args, model_args, Path(args.output_dir) / "recipe.resolved.yaml")
    resume = args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("true", "latest"):
        resume = True
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if "--dry-run" in sys.argv[1:]:  # preflight: check the launch, load nothing (trainer/preflight.py)
        from trainer.preflight import main as preflight

        sys.exit(preflight([a for a in sys.argv[1:] if a != "--dry-run"]))
    main()
