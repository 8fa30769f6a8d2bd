"""A recipe *is* the experiment: one YAML file of ``TaskArguments`` + ``WinnowConfig`` + TRL ``ModelConfig``.

``parse_recipe`` reads ``--config recipe.yaml`` plus CLI overrides (TRL's ``TrlParser``: CLI beats YAML
beats defaults); every config error surfaces here, before any model is loaded. ``build_trainer`` turns
the parsed recipe into a ready ``WinnowGRPOTrainer`` (dataset, reward functions, offline model aliases,
metrics file and plot).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Sequence

from trl import ModelConfig, TrlParser, get_peft_config

from .config import ConfigError, WinnowConfig
from .config_env import EnvTaskFields

logger = logging.getLogger(__name__)

# Models that exist on every machine of ours without a hub download, built by ``trainer.assets``.
OFFLINE_MODELS = {"offline:smollm2": "make_smollm2", "offline:tiny-qwen3": "make_tiny_qwen3",
                  "offline:tiny-qwen3-vllm": "make_tiny_qwen3_vllm",
                  "offline:smollm2-perturbed": "make_smollm2_perturbed"}


@dataclass
class TaskArguments(EnvTaskFields):
    """What to train on: dataset, reward functions, prompt handling, and the launch the recipe is sized for
    (plus, for the environment tasks sokoban / frozenlake, the episode settings of trainer/config_env.py)."""

    dataset_name: str = field(
        default="arithmetic",
        metadata={"help": "Registered task dataset (trainer.data): arithmetic, dapo_math_17k, deepmath_103k, metamathqa, "
                  "countdown, champ, json, or an environment played turn by turn: sokoban, frozenlake."},
    )
    dataset_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments of the dataset loader (a mapping in YAML, a JSON string on the CLI), "
                  "e.g. {path: ..., num_samples: 1000, min_difficulty: 5}."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_accuracy"],
        metadata={"help": "Registered reward functions (rewards/), combined with GRPOConfig.reward_weights."},
    )
    reward_timeout: float = field(
        default=2.0, metadata={"help": "Hard wall-clock limit in seconds of one math-verify call (answers over it score 0)."}
    )
    overlong_buffer_len: int = field(
        default=4096,
        metadata={"help": "DAPO overlong shaping (reward 'overlong_penalty'): L_cache, the last tokens before "
                  "max_completion_length in which the penalty grows linearly from 0 to -overlong_penalty_factor."},
    )
    overlong_penalty_factor: float = field(
        default=1.0,
        metadata={"help": "DAPO overlong shaping: the penalty at max_completion_length (verl's penalty_factor). With a "
                  "0/1 task reward, 0.5 is equivalent to DAPO's 1.0 on its +1/-1 reward."},
    )
    enable_thinking: bool | None = field(
        default=None,
        metadata={"help": "Qwen3 thinking mode (chat template kwarg enable_thinking); None leaves the template default."},
    )
    max_prompt_tokens: int | None = field(
        default=None, metadata={"help": "Drop dataset prompts longer than this many tokens after the chat template."}
    )
    launch_processes: int | None = field(
        default=None,
        metadata={"help": "Number of training processes the batch sizes of this recipe assume (the accelerate config "
                  "it is meant for). A launch with another count fails fast instead of running a different experiment."},
    )
    plot: bool = field(default=True, metadata={"help": "Write metrics.png (reward and entropy per step) at the end."})

    def __post_init__(self) -> None:
        if isinstance(self.dataset_kwargs, str):
            try:
                self.dataset_kwargs = json.loads(self.dataset_kwargs)
            except json.JSONDecodeError as e:
                raise ConfigError("dataset_kwargs", f"not valid JSON ({e})", 'pass e.g. \'{"num_samples": 100}\'') from None
        if not self.reward_funcs:
            raise ConfigError("reward_funcs", "no reward function given", "name at least one, e.g. [math_accuracy]")
        if self.reward_timeout <= 0:
            raise ConfigError("reward_timeout", f"must be > 0 (got {self.reward_timeout})", "use e.g. 2.0")
        self.validate_env_fields()
        env_rewards = sorted({"env_return", "env_success"} & set(self.reward_funcs))
        if env_rewards and not self.is_env_task:
            raise ConfigError("reward_funcs", f"{env_rewards} need an environment task, not {self.dataset_name!r}",
                              "set dataset_name: sokoban | frozenlake, or use a reward of the dataset's task")

    @property
    def is_env_task(self) -> bool:
        """Whether the dataset is an environment played through the multi-turn rollout."""
        from .data.envs import ENV_TASKS

        return self.dataset_name in ENV_TASKS


def recipe_parser() -> TrlParser:
    """The parser of recipes (three dataclasses, one YAML namespace)."""
    return TrlParser((TaskArguments, WinnowConfig, ModelConfig))


def parse_recipe(argv: Sequence[str] | None = None) -> tuple[TaskArguments, WinnowConfig, ModelConfig]:
    """Parse ``--config recipe.yaml`` and CLI overrides; unknown keys and values of the wrong type are errors."""
    _check_yaml_types(sys.argv[1:] if argv is None else list(argv))
    task, args, model_args = recipe_parser().parse_args_and_config(args=argv)
    if task.enable_thinking is not None:
        kwargs = dict(args.chat_template_kwargs or {})
        kwargs["enable_thinking"] = task.enable_thinking
        args.chat_template_kwargs = kwargs
    if "overlong_penalty" in task.reward_funcs and not 0 < task.overlong_buffer_len <= args.max_completion_length:
        raise ConfigError(
            "overlong_buffer_len",
            f"must be in (0, max_completion_length={args.max_completion_length}] (got {task.overlong_buffer_len})",
            "DAPO uses 4096 of 20480; pick a buffer smaller than the response budget",
        )
    return task, args, model_args


def _check_yaml_types(argv: list[str]) -> None:
    """Type-check the values of the ``--config`` YAML (argparse never sees them as strings; see recipe_types)."""
    import yaml

    from .recipe_types import check_recipe_types

    path = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"), None)
    path = path or next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if path is None:
        return
    with open(path) as fh:
        config = yaml.safe_load(fh) or {}
    check_recipe_types(config, (TaskArguments, WinnowConfig, ModelConfig))


def resolve_model_path(name: str) -> str:
    """Map the ``offline:`` aliases to locally built models; anything else is passed to transformers as is."""
    if name in OFFLINE_MODELS:
        from . import assets

        return str(getattr(assets, OFFLINE_MODELS[name])())
    return name


def check_launch(task: TaskArguments, num_processes: int) -> None:
    """Fail fast when the recipe is launched on a process count it was not sized for."""
    if task.launch_processes is not None and task.launch_processes != num_processes:
        raise ConfigError(
            "launch_processes",
            f"the recipe's batch sizes assume {task.launch_processes} training processes, but this launch has {num_processes}",
            "launch with the accelerate config the recipe names, or adjust per_device_train_batch_size / "
            "gradient_accumulation_steps / steps_per_generation and launch_processes together",
        )


def build_trainer(task: TaskArguments, args: WinnowConfig, model_args: ModelConfig):
    """Dataset + reward functions + model -> a ``WinnowGRPOTrainer`` with the metrics file callback."""
    import rewards
    from accelerate import PartialState
    from transformers import AutoTokenizer

    from .data import load_task_dataset
    from .grpo_trainer import WinnowGRPOTrainer
    from .run_artifacts import MetricsFileCallback

    check_launch(task, PartialState().num_processes)  # before any model, tokenizer or dataset loads
    model_path = resolve_model_path(model_args.model_name_or_path)
    if args.teacher_model_name_or_path:
        args.teacher_model_name_or_path = resolve_model_path(args.teacher_model_name_or_path)
    dataset = load_task_dataset(task.dataset_name, **(task.dataset_kwargs or {}))
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    if task.max_prompt_tokens is not None and not task.is_env_task:  # env prompts are placeholders (envs/levels.py)
        dataset = filter_long_prompts(dataset, tokenizer, task.max_prompt_tokens, args.chat_template_kwargs or {})
    reward_options = dict(
        timeout=task.reward_timeout,
        max_completion_length=args.max_completion_length,
        overlong_buffer_len=task.overlong_buffer_len,
        overlong_penalty_factor=task.overlong_penalty_factor,
    )
    reward_funcs = [rewards.get_reward(name, **reward_options) for name in task.reward_funcs]
    env_kwargs = {}
    if task.is_env_task:
        env_kwargs = dict(rollout_func=build_env_rollout(task, args, tokenizer))
        if args.eval_strategy != "no":
            env_kwargs["eval_dataset"] = load_task_dataset(task.dataset_name, split="validation", num_levels=task.env_eval_levels)
    init_kwargs = dict(args.model_init_kwargs or {})
    if model_args.dtype is not None:
        init_kwargs.setdefault("dtype", model_args.dtype)
    if model_args.attn_implementation is not None:
        init_kwargs.setdefault("attn_implementation", model_args.attn_implementation)
    args.model_init_kwargs = init_kwargs or None
    trainer = WinnowGRPOTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[MetricsFileCallback(args.output_dir, plot=task.plot)],
        **env_kwargs,
    )
    return trainer


def build_env_rollout(task: TaskArguments, args: WinnowConfig, tokenizer: Any):
    """The multi-turn rollout of an environment task, with the model's training chat template."""
    from envs.episode import EpisodeSettings

    from .rollout import ChatTokens, MultiTurnRollout, training_chat_template

    settings = EpisodeSettings(
        max_turns=task.max_turns, max_actions_per_turn=task.max_actions_per_turn,
        max_actions_per_episode=task.max_actions_per_episode, format_penalty=task.format_penalty,
        require_think=task.require_think, max_tokens_hint=task.turn_max_tokens_hint,
    )
    chat = ChatTokens(tokenizer, training_chat_template(tokenizer), args.chat_template_kwargs)
    return MultiTurnRollout(task.dataset_name, task.env_kwargs, settings, task.turn_max_tokens, task.env_eval_temperature, chat)


def filter_long_prompts(dataset: Any, tokenizer: Any, max_tokens: int, template_kwargs: dict) -> Any:
    """Drop rows whose chat-templated prompt exceeds ``max_tokens`` (the papers' overlong-prompt filter)."""

    def short_enough(row: dict) -> bool:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, **template_kwargs)
        ids = ids["input_ids"] if isinstance(ids, dict) else ids
        return len(ids) <= max_tokens

    before = len(dataset)
    dataset = dataset.filter(short_enough)
    logger.info("max_prompt_tokens=%d dropped %d of %d prompts", max_tokens, before - len(dataset), before)
    return dataset


def save_resolved_recipe(task: TaskArguments, args: WinnowConfig, model_args: ModelConfig, path: str | Path) -> None:
    """Write every resolved field (defaults included) so a run folder documents its own experiment."""
    import dataclasses

    import yaml

    def plain(obj: Any) -> dict:
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump({"task": plain(task), "model": plain(model_args), "training": plain(args)}, sort_keys=True))


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):  # before str: TrainingArguments' strategies are str-valued enums
        return _plain(value.value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
