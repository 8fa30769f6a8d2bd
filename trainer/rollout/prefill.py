"""The think prefill of single-turn tasks (``think_prefill``): RAGEN's generation prompt ends with ``<think>``
and its replies are parsed with ``<think>`` prepended (mll-lab-nu/RAGEN@20daedc ragen/llm_agent/ctx_manager.py:
1259-1263, 1406). The trainer appends the prefill's token ids to TRL's tokenised prompts (so the model samples
after them and they are context, never trained on) and hands the reward functions each completion with the
prefill text in front (so a reply ``reasoning</think><answer>...</answer>`` is well-formed). The multi-turn rollout
does the same per turn (trainer/rollout/multi_turn.py)."""

from __future__ import annotations

import copy
from typing import Any


def prefill_ids(tokenizer: Any, prefill: str) -> list[int]:
    """Token ids of the prefill text (no special tokens added)."""
    return list(tokenizer(prefill, add_special_tokens=False)["input_ids"])


def with_prefill(completions: list, prefill: str) -> list:
    """The completions as the reward functions see them: the prefill text in front of each reply (plain strings,
    or TRL's conversational ``[{"role": "assistant", "content": ...}]``; the originals are not modified)."""
    out = []
    for completion in completions:
        if isinstance(completion, str):
            out.append(prefill + completion)
        elif isinstance(completion, list) and completion and isinstance(completion[0], dict):
            messages = copy.deepcopy(completion)
            first = messages[0]
            if isinstance(first.get("content"), str):
                first["content"] = prefill + first["content"]
            out.append(messages)
        else:
            out.append(completion)
    return out
