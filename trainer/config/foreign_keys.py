"""Keys of other trainers' recipes that winnow does not take as they are, each with what to write instead.

A TRL or open-r1 recipe brought to winnow meets these keys first. Each is refused as one line that says where the
key comes from, why winnow differs, and the winnow way (``RecipeError(key, what, fix)``), instead of a bare "not a
recipe field" with a misleading nearest name. docs/recipes.md's table lists them with every key those recipes use.
"""

from __future__ import annotations

# key -> (where it comes from and what winnow does instead, the fix)
FOREIGN_KEYS: dict[str, tuple[str, str]] = {
    "torch_dtype": (
        "is the old name of TRL's ModelConfig.dtype (transformers 5 renamed torch_dtype to dtype; TRL 1.16 has no "
        "torch_dtype either)",
        "write dtype: bfloat16 (or float32, auto)",
    ),
    "dataset_configs": (
        "is a list of dataset configurations (an older open-r1 recipe key); TRL's ScriptArguments and winnow take "
        "one, dataset_config",
        "write dataset_config: <name> (e.g. default), or drop the key for the dataset's default configuration",
    ),
    "vllm_device": (
        "is not a field of TRL 1.16, whose vLLM runs colocated with the trainer or as a separate server (vllm_mode)",
        "drop the key; for a server on its own GPUs start launch/vllm_server.py and set vllm_mode: server and "
        "vllm_server_base_url (docs/server.md), or set vllm_mode: colocate",
    ),
    "max_prompt_length": (
        "is not a field of TRL 1.16's GRPOConfig (its GRPOTrainer does not truncate prompts); winnow drops longer "
        "prompts rather than cutting their start off, so every prompt the model sees is whole",
        "write max_prompt_tokens: <n> (prompts longer than n tokens after the chat template are dropped before "
        "training)",
    ),
    "warmup_ratio": (
        "is not a field of transformers 5's TrainingArguments, which folded it into warmup_steps",
        "write warmup_steps: 0.1 (a float in [0, 1) is a ratio of the total steps, an integer a step count)",
    ),
    "dataset_mixture": (
        "is open-r1's mixture of several datasets, which winnow does not build",
        "concatenate the datasets into one local parquet/jsonl and name it in dataset_name",
    ),
    "datasets": (
        "is TRL's DatasetMixtureConfig list, which winnow does not build",
        "concatenate the datasets into one local parquet/jsonl and name it in dataset_name",
    ),
}


def foreign_key_error(key: str) -> tuple[str, str] | None:
    """``(what, fix)`` for a key of ``FOREIGN_KEYS``, else None."""
    return FOREIGN_KEYS.get(key)
