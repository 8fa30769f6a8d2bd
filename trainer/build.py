"""From a parsed recipe (trainer/recipe.py) to a ready ``WinnowGRPOTrainer``: :func:`prepare_run` resolves the
model path, loads the dataset and tokenizer and resolves the reward functions (every data and reward mistake a
``RecipeError`` before any weights load); :func:`build_trainer` adds the model, the multi-turn rollout of an
environment task and the metrics file callback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import datasets
from accelerate import PartialState
from transformers import AutoTokenizer
from trl import ModelConfig, get_peft_config, get_quantization_config

from envs.episode import EpisodeSettings
from trainer.config import recipe_checks as checks
from trainer.config.core import THINK_PREFILL, WinnowConfig
from trainer.config.dataset_fields import load_generic_inputs
from trainer.config.errors import ConfigError, RecipeError
from trainer.config.model_path import OFFLINE_MODELS, resolve_model_path
from trainer.data import DatasetUnavailableError, list_task_datasets, load_task_dataset
from trainer.data.generic import quiet_progress
from trainer.grpo_trainer import WinnowGRPOTrainer
from trainer.recipe import TaskArguments, check_launch
from trainer.rollout.multi_turn import ChatTokens, MultiTurnRollout, training_chat_template
from trainer.rollout.prefill import prefill_ids
from trainer.tools.model_card import CardFacts, hub_dataset_id
from trainer.tools.run_artifacts import MetricsFileCallback, quiet_tied_weight_warning

logger = logging.getLogger(__name__)

# The published model an alias is built from (the model card's base model); the tiny ones are random.
OFFLINE_BASE_MODELS = {"offline:smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
                       "offline:smollm2-perturbed": "HuggingFaceTB/SmolLM2-135M-Instruct"}


@dataclass
class RunInputs:
    """Everything a trainer needs besides the model weights, prepared (and checked) before they load."""

    model_path: str
    dataset: Any
    tokenizer: Any
    reward_funcs: list
    eval_dataset: Any = None  # a generic dataset's dataset_test_split when eval_strategy is not "no"


def prepare_run(task: TaskArguments, args: WinnowConfig, model_args: ModelConfig) -> RunInputs:
    """Model path, dataset, tokenizer and reward functions -- every data and reward mistake surfaces here as a
    RecipeError, before any weights load."""
    check_launch(task, PartialState().num_processes)  # before any model, tokenizer or dataset loads
    model_path = resolve_model_path(model_args.model_name_or_path)
    if args.teacher_model_name_or_path:
        args.teacher_model_name_or_path = resolve_model_path(args.teacher_model_name_or_path)
    eval_dataset = None
    try:
        if task.dataset_name in list_task_datasets():
            with quiet_progress():  # a bar on stderr would bury the one-line error that may follow it
                dataset = load_task_dataset(task.dataset_name, **(task.dataset_kwargs or {}))
        else:  # a Hub id or local path, read as TRL's scripts do (trainer/data/generic.py)
            dataset, eval_dataset = load_generic_inputs(task, str(getattr(args.eval_strategy, "value",
                                                                          args.eval_strategy)))
    except (FileNotFoundError, DatasetUnavailableError, TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise RecipeError(
            "dataset_kwargs", " ".join(str(e).split()),
            "fix the dataset's path / keyword arguments (the message says what; it lists what the loader accepts)",
        ) from None
    except StopIteration:  # `datasets`' JSON reader on an empty file
        raise RecipeError(
            "dataset_kwargs", f"dataset {task.dataset_name!r} read an empty file ({task.dataset_kwargs})",
            "point path at a file with rows",
        ) from None
    checks.check_dataset(dataset, task)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision,
                                              trust_remote_code=args.trust_remote_code)
    if task.max_prompt_tokens is not None and not task.is_env_task:  # env prompts are placeholders (envs/levels.py)
        prefill = THINK_PREFILL if args.think_prefill else ""
        dataset = filter_long_prompts(dataset, tokenizer, task.max_prompt_tokens, args.chat_template_kwargs or {},
                                      prefill=prefill)
        checks.check_dataset(dataset, task)
        if eval_dataset is not None:
            eval_dataset = filter_long_prompts(eval_dataset, tokenizer, task.max_prompt_tokens,
                                               args.chat_template_kwargs or {}, prefill=prefill)
    reward_options = dict(
        timeout=task.reward_timeout,
        max_completion_length=args.max_completion_length,
        overlong_buffer_len=task.overlong_buffer_len,
        overlong_penalty_factor=task.overlong_penalty_factor,
    )
    reward_funcs = [checks.resolve_reward(name, reward_options, task.recipe_dir, list(OFFLINE_MODELS))
                    for name in task.reward_entries]
    reward_funcs = [resolve_model_path(f) if isinstance(f, str) else f for f in reward_funcs]  # offline: aliases
    if not task.is_env_task:  # env rewards read the rollout's episode fields, not dataset columns
        checks.probe_rewards(reward_funcs, task.reward_entries, dataset)
    return RunInputs(model_path, dataset, tokenizer, reward_funcs, eval_dataset)


def build_trainer(task: TaskArguments, args: WinnowConfig, model_args: ModelConfig, inputs: RunInputs | None = None):
    """Prepared inputs + model -> a ``WinnowGRPOTrainer`` with the metrics file callback."""
    inputs = inputs or prepare_run(task, args, model_args)
    env_kwargs = {}
    if inputs.eval_dataset is not None:  # a generic dataset's test split, as trl/scripts/grpo.py passes it
        env_kwargs["eval_dataset"] = inputs.eval_dataset
    if task.is_env_task:
        env_kwargs = dict(rollout_func=build_env_rollout(task, args, inputs.tokenizer))
        if args.eval_strategy != "no":
            env_kwargs["eval_dataset"] = load_task_dataset(
                task.dataset_name, split="validation", num_levels=task.env_eval_levels
            )
    init_kwargs = dict(args.model_init_kwargs or {})
    # The weights at the same revision as the tokenizer (as trl/scripts/grpo.py passes it); TRL adds
    # trust_remote_code from args itself.
    if model_args.model_revision is not None:
        init_kwargs.setdefault("revision", model_args.model_revision)
    if model_args.dtype is not None:
        init_kwargs.setdefault("dtype", model_args.dtype)
    if model_args.attn_implementation is not None:
        init_kwargs.setdefault("attn_implementation", model_args.attn_implementation)
    args.model_init_kwargs = init_kwargs or None
    trainer = WinnowGRPOTrainer(
        model=inputs.model_path,
        reward_funcs=inputs.reward_funcs,
        args=args,
        train_dataset=inputs.dataset,
        processing_class=inputs.tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),  # load_in_4bit / load_in_8bit, as trl grpo does
        callbacks=[MetricsFileCallback(args.output_dir, plot=task.plot)],
        **env_kwargs,
    )
    quiet_tied_weight_warning(trainer)
    trainer.card_facts = card_facts(task, model_args)
    return trainer


def card_facts(task: TaskArguments, model_args: ModelConfig):
    """What the run's model card names (trainer/tools/model_card.py): the model the run started from -- an
    ``offline:`` alias built from a published model names that model -- and the dataset."""
    name = model_args.model_name_or_path
    hub_id = hub_dataset_id(task.dataset_name, task.dataset_kwargs, task.dataset_name in list_task_datasets())
    return CardFacts(name, OFFLINE_BASE_MODELS.get(name, name), task.dataset_name, hub_id)


def build_env_rollout(task: TaskArguments, args: WinnowConfig, tokenizer: Any):
    """The multi-turn rollout of an environment task, with the model's training chat template."""
    settings = EpisodeSettings(
        max_turns=task.max_turns, max_actions_per_turn=task.max_actions_per_turn,
        max_actions_per_episode=task.max_actions_per_episode, format_penalty=task.format_penalty,
        require_think=task.require_think, max_tokens_hint=task.turn_max_tokens_hint, prompt_style=task.env_prompt,
    )
    chat = ChatTokens(tokenizer, training_chat_template(tokenizer), args.chat_template_kwargs)
    return MultiTurnRollout(
        task.dataset_name, task.env_kwargs, settings, task.turn_max_tokens, task.env_eval_temperature,
        chat, prefill=THINK_PREFILL if args.think_prefill else "",
    )


def filter_long_prompts(dataset: Any, tokenizer: Any, max_tokens: int, template_kwargs: dict,
                        prefill: str = "") -> Any:
    """Drop rows whose prompt as the model sees it exceeds ``max_tokens`` (the papers' overlong-prompt filter): the
    chat-templated prompt plus the ``prefill`` ids the trainer appends after it (grpo_trainer._tokenize_prompts), so a
    prompt at the bound cannot overflow the server's context of max_prompt_tokens + max_completion_length. A plain
    string prompt is tokenized as TRL does (no chat template); a streamed dataset is filtered as it is read."""
    extra = len(prefill_ids(tokenizer, prefill)) if prefill else 0

    def short_enough(row: dict) -> bool:
        if isinstance(row["prompt"], str):
            ids = tokenizer(text=row["prompt"])["input_ids"]
        else:
            ids = tokenizer.apply_chat_template(
                row["prompt"], add_generation_prompt=True, tokenize=True, **template_kwargs
            )
        ids = ids["input_ids"] if isinstance(ids, Mapping) else ids  # a BatchEncoding is a Mapping, not a dict
        return len(ids) + extra <= max_tokens

    if isinstance(dataset, datasets.IterableDataset):
        return dataset.filter(short_enough)
    before = len(dataset)
    with quiet_progress():  # a bar on stderr before the run starts would bury a one-line error after it
        dataset = dataset.filter(short_enough)
    logger.info("max_prompt_tokens=%d dropped %d of %d prompts", max_tokens, before - len(dataset), before)
    return dataset


# Left out of recipe.resolved.yaml: fields about one invocation, not the experiment (a re-run of the file must
# neither resume nor delete the run it describes); hub_token, a secret; values derived from others
# (generation_batch_size from steps_per_generation; TRL refuses both) and deprecated aliases of kept ones.
