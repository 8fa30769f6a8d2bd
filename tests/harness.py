"""Shared test harness: a tiny real Qwen3 model, a prompt set, reward functions and a deterministic rollout_func.

Used by the in-process tests and by the multi-process scenario script (so both build identical trainers).
"""

from __future__ import annotations

import copy
import hashlib
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("WANDB_SILENT", "true")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

PROMPTS = [
    "What is 2 + 3?",
    "Name a prime number larger than 10.",
    "Sort the letters of 'winnow'.",
    "Is 91 prime? Answer yes or no.",
    "Compute 7 * 8.",
    "Spell 'group' backwards.",
    "What is the square root of 144?",
    "Give the next number: 1, 1, 2, 3, 5, ...",
]

# Settings that every test trainer shares: CPU, fp32, no checkpoints, tiny generations, no clipping so
# gradients compare exactly.
BASE_ARGS: dict[str, Any] = dict(
    use_cpu=True,
    bf16=False,
    report_to="none",
    save_strategy="no",
    logging_steps=1,
    num_generations=4,
    per_device_train_batch_size=8,
    max_completion_length=8,
    learning_rate=1e-3,
    max_grad_norm=0.0,
    seed=0,
    temperature=1.0,
    dataloader_num_workers=0,
    disable_tqdm=True,
    gradient_checkpointing=False,  # TRL 1.16 turns it on by default; a 2-layer model gains nothing from it
)


def prompt_dataset(n: int = len(PROMPTS), unique: bool = False) -> Dataset:
    """A plain-text prompt dataset with an ``answer`` column (reward functions receive it as a kwarg).

    Texts repeat every ``len(PROMPTS)`` rows unless ``unique``: then row i's text ends with its index, so no two
    rows share a text (needed where a batch may hold two rows of one text -- :func:`deterministic_rollout_func`
    numbers rollouts per text within a call, which then depends on how the batch is split over processes)."""
    prompts = [PROMPTS[i % len(PROMPTS)] + (f" (#{i})" if unique else "") for i in range(n)]
    return Dataset.from_dict({"prompt": prompts, "answer": [str(i) for i in range(n)]})


def reward_token_parity(completions: list[str], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """Fraction of even token ids: varies within a group, deterministic given the tokens."""
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def reward_length(completions: list[str], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """Completion length in tokens / 8."""
    return [len(ids) / 8 for ids in completion_ids]


def reward_parity_flat_at(*steps: int):
    """:func:`reward_token_parity`, except constant (0.5) while generating for the given optimizer steps
    (1-based): every group's reward variance is zero there, so an SNR filter without include_zero keeps
    nothing and the step is empty. TRL passes ``trainer_state`` to reward functions."""

    def reward_parity_flat(completions, completion_ids, trainer_state=None, **kwargs):
        if trainer_state is not None and trainer_state.global_step + 1 in steps:
            return [0.5] * len(completion_ids)
        return reward_token_parity(completions, completion_ids)

    return reward_parity_flat


def reward_parity_constant_for_multiples_of(k: int):
    """:func:`reward_token_parity`, except 1.0 for every rollout of prompts whose ``answer`` is a multiple of ``k``:
    those groups are all-correct, the rest mostly mixed (DAPO's dynamic sampling replaces the former)."""

    def reward_parity_constant(completions, completion_ids, answer, **kwargs):
        parity = reward_token_parity(completions, completion_ids)
        return [1.0 if int(a) % k == 0 else p for a, p in zip(answer, parity)]

    return reward_parity_constant


def _digest(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "little")


def deterministic_rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
    """A TRL ``rollout_func`` whose completions depend only on (prompt, index within its group).

    Process count, batch split and RNG state do not change what is "sampled", so runs with 1 and 2
    processes see the same global batch. Completions have 2-8 tokens; every third one has an env span
    (``env_mask`` 0) to exercise TRL's tool mask; the log-probs are a deterministic function too.
    """
    tok = trainer.processing_class
    out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    seen: dict[str, int] = {}
    for prompt in prompts:
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        j = seen.get(text, 0)
        seen[text] = j + 1
        seed = _digest(text, j)
        gen = torch.Generator().manual_seed(seed % (2**63))
        n = 2 + seed % 7
        ids = torch.randint(100, 20000, (n,), generator=gen).tolist()
        if seed % 2 == 0:
            ids[-1] = tok.eos_token_id if tok.eos_token_id is not None else ids[-1]
        env_mask = [1] * n
        if seed % 3 == 0 and n >= 4:
            env_mask[1:3] = [0, 0]
        out["prompt_ids"].append(tok(text, add_special_tokens=False)["input_ids"])
        out["completion_ids"].append(ids)
        out["logprobs"].append((-torch.rand(n, generator=gen) * 5).tolist())
        out["env_mask"].append(env_mask)
    return out


class DigestPolicy:
    """A multi-turn generation backend (trainer/rollout/multi_turn.py) whose answer depends only on the context
    and how often that context occurred before in the same call -- so 1 and 2 processes play the same episodes
    (groups are never split over ranks). Answers mix moves, a format failure and an unknown action, so returns
    differ within a group."""

    ANSWERS = (
        "<think>\nplan\n</think>\n\n<answer>Left || Up</answer>",
        "<think>\nplan\n</think>\n\n<answer>Right</answer>",
        "<think>\nplan\n</think>\n\n<answer>Down || Down</answer>",
        "no idea",
        "<think>\nplan\n</think>\n\n<answer>Jump</answer>",
    )

    def __init__(self, tokenizer: Any):
        self.answers = [tokenizer(a + "<|im_end|>", add_special_tokens=False)["input_ids"] for a in self.ANSWERS]

    def session(self):
        from contextlib import nullcontext

        return nullcontext(self)

    def generate(self, contexts, max_new_tokens, temperature, stop_ids):
        from trainer.rollout.multi_turn import Sample

        seen: dict[tuple, int] = {}
        out = []
        for context in contexts:
            key = tuple(context)
            j = seen.get(key, 0)
            seen[key] = j + 1
            out.append(Sample(list(self.answers[_digest(key, j) % len(self.answers)][:max_new_tokens])))
        return out


def write_rows(rows: list[dict], path: Any) -> str:
    """Write ``rows`` as parquet or JSON lines (by suffix): local copies of hub datasets for loader tests."""
    import json

    if str(path).endswith(".parquet"):
        Dataset.from_list(rows).to_parquet(str(path))
    else:
        with open(path, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return str(path)


def tiny_model_path() -> str:
    """Path of the cached tiny random Qwen3 (built on first use)."""
    from trainer.tools.assets import make_tiny_qwen3

    return str(make_tiny_qwen3())


def grads_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every parameter gradient (zeros where none was produced)."""
    return {
        n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def loss_and_grads(trainer: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, dict]:
    """Loss and parameter gradients of one micro-batch through ``trainer.compute_loss``, as the training loop
    runs it with gradient_accumulation_steps=1 (no optimizer step)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), grads_of(trainer.model)


def one_step_loss_and_grads(trainer: Any, generation_seed: int = 1234) -> tuple[dict[str, Any], torch.Tensor, dict]:
    """Generate one generation batch through the trainer's real ``_prepare_inputs`` and backprop one
    micro-batch loss (see :func:`loss_and_grads`). Returns (inputs, loss, grads)."""
    trainer.model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(generation_seed)
    inputs = trainer._prepare_inputs(batch)
    loss, grads = loss_and_grads(trainer, inputs)
    return inputs, loss, grads


def trl_trainer(model: str, output_dir: str, **overrides: Any):
    """TRL's own GRPOTrainer on the harness batch (BASE_ARGS + ``overrides``): the reference that winnow's
    removed-rollout gradients are checked against."""
    from trl import GRPOConfig, GRPOTrainer

    return GRPOTrainer(model=model, reward_funcs=[reward_token_parity, reward_length],
                       args=GRPOConfig(output_dir=output_dir, **{**BASE_ARGS, **overrides}),
                       train_dataset=prompt_dataset(), rollout_func=deterministic_rollout_func)


def on_rollout_batch(trainer: Any, record: Any) -> None:
    """Call ``record(output, batch)`` with every ``RolloutBatch`` the trainer's rounds build and TRL's batch dict it
    was built from (as it is then: compaction rewrites it later), through a subclass of the trainer's round type."""
    base = trainer.round_type

    class Recorded(base):
        def rollout_batch(self, keep=None):
            batch = super().rollout_batch(keep)
            record(self.output, batch)
            return batch

    trainer.round_type = Recorded


def spy_batches(trainer: Any, outputs: list | None = None) -> list:
    """Record every ``RolloutBatch`` the trainer builds (and, into ``outputs``, TRL's batch dict it was built from):
    the global batch the stage pipeline saw, for tests that recompute the decision from it."""
    seen: list = []

    def record(output, batch):
        seen.append(batch)
        if outputs is not None:
            outputs.append(output)

    on_rollout_batch(trainer, record)
    return seen


class StepSnapshots(TrainerCallback):
    """Keeps, after every optimizer step (``on_step_end``, after the trainer's own callbacks), the weights, the
    optimizer's and LR scheduler's state, the LR and, under a GradScaler, the scaler's state, in ``after``."""

    def __init__(self, trainer: Any):
        self.trainer, self.after = trainer, []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        tr = self.trainer
        scaler = tr.accelerator.scaler
        self.after.append({
            "params": {n: p.detach().clone() for n, p in tr.model.named_parameters()},
            "optimizer": copy.deepcopy(tr.optimizer.state_dict()),
            "lr": tr.lr_scheduler.get_last_lr()[0],
            "scheduler": copy.deepcopy(tr.lr_scheduler.state_dict()),
            "scaler": None if scaler is None else copy.deepcopy(scaler.state_dict()),
        })
        return control


def same_state(a: Any, b: Any) -> bool:
    """Exact equality of nested state (weights, an optimizer's or scheduler's ``state_dict()``): tensors bit for bit,
    dicts key for key, sequences item for item, anything else by ``==``."""
    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(u, v) for u, v in zip(a, b))
    return a == b


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest elementwise difference between two parameter-name -> tensor maps with the same keys."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def kept_rows_only(inputs: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
    """The micro-batch restricted to its kept rollouts (loss mask not all zero), as TRL would see it if only
    they had been generated: per-row tensors sliced, ``num_items_in_batch`` recounted. Returns (inputs, kept)."""
    kept = inputs["tool_mask"].bool().any(dim=1) | (inputs["completion_mask"].sum(dim=1) == 0)
    sliced = {k: (v[kept] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in inputs.items()}
    sliced.pop("winnow_loss_scale", None)
    sliced["num_items_in_batch"] = (sliced["completion_mask"] * sliced["tool_mask"]).sum()
    return sliced, kept


def near_policy_rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
    """:func:`deterministic_rollout_func` whose sampler log-probs are the policy's own (temperature-scaled, one
    unpadded forward per row) plus a deterministic offset in [-0.1, 0.1] per token: vLLM-like log-probs, so TRL's
    importance-sampling ratios are near 1 and vary (a VESPO phi far from 0 that padding can visibly break)."""
    out = deterministic_rollout_func(prompts, trainer)
    logprobs = []
    with torch.no_grad():
        for p, c, lp in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"]):
            logits = trainer.model(input_ids=torch.tensor([p + c], device=trainer.model.device)).logits
            logits = logits[0, len(p) - 1 : -1].float() / trainer.temperature
            own = torch.log_softmax(logits, -1).gather(1, torch.tensor(c, device=logits.device)[:, None])[:, 0]
            logprobs.append((own.cpu() + (torch.tensor(lp) + 2.5) / 25).tolist())  # lp is in [-5, 0]
    out["logprobs"] = logprobs
    return out


def use_vllm_importance_sampling(trainer: Any, mode: str = "token_truncate") -> Any:
    """Turn on TRL's vLLM importance-sampling correction (``importance_sampling_ratio`` in the batch, computed from the
    rollout's log-probs, trl==1.16.0:trl/trainer/grpo_trainer.py:2659-2706) without a vLLM server: the rollout_func
    generates, so TRL only reads ``use_vllm`` for the correction and for weight syncs, which it skips while
    ``_last_loaded_step`` is the current step: enough for a test that generates for its first step only."""
    trainer.use_vllm = True
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = mode
    trainer._last_loaded_step = trainer.state.global_step
    return trainer


# The recipe launch/train.py's tests start from (tests/e2e/test_train_cli.py, test_run_reporting.py): the tiny model on
# 16 arithmetic prompts, one step of 4 rollouts of 8 tokens on the CPU.
TRAIN_CLI_RECIPE = {
    "model_name_or_path": "offline:tiny-qwen3",
    "dataset_name": "arithmetic",
    "dataset_kwargs": {"num_samples": 16, "seed": 1},
    "reward_funcs": ["math_accuracy", "think_format"],
    "enable_thinking": False,
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "max_completion_length": 8,
    "learning_rate": 1e-3,
    "max_steps": 1,
    "save_steps": 1,
    "logging_steps": 1,
    "use_cpu": True,
    "bf16": False,
    "report_to": "none",
    "disable_tqdm": True,
    "seed": 0,
}


def typed(value: Any) -> Any:
    """``value`` with the type of every leaf spelled out: 1 == 1.0 == True in Python, not in a dataset."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)
