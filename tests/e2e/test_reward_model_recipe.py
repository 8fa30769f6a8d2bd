"""A recipe with a reward model (reward_model_name_or_path, as ``trl grpo``) next to TRL's accuracy_reward, one
training step on the tiny model: TRL loads the model as a sequence classifier with its own tokenizer, and the reward
it logs for each completion is that model's score of prompt + completion, computed here independently."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import yaml
from harness import write_rows

ROWS = [{"prompt": f"Compute {a} + {b}. Answer:", "solution": f"${a + b}$"}
        for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)]]


def _tiny_reward_model(policy: str, folder: Path) -> str:
    """A random Qwen3 sequence classifier (num_labels=1) of the tiny policy's shape, with its tokenizer."""
    from transformers import AutoConfig, AutoTokenizer, Qwen3ForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(policy)
    config = AutoConfig.from_pretrained(policy, num_labels=1)
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = Qwen3ForSequenceClassification(config).eval()
        torch.nn.init.normal_(model.score.weight, std=1.0)  # scores far apart, so a mix-up would show
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_reward_model_and_trl_accuracy_reward_train_one_step(tmp_path, tiny_model, monkeypatch):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trainer.build import build_trainer, prepare_run
    from trainer.recipe import check_run, parse_recipe

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rm = _tiny_reward_model(tiny_model, tmp_path / "tiny-rm")
    recipe = {
        "model_name_or_path": tiny_model, "dataset_name": write_rows(ROWS, tmp_path / "sums.parquet"),
        "reward_model_name_or_path": rm, "reward_funcs": ["accuracy_reward"], "reward_weights": [0.5, 1.0],
        "num_generations": 4, "per_device_train_batch_size": 4, "max_completion_length": 8, "max_steps": 1,
        "logging_steps": 1, "save_strategy": "no", "use_cpu": True, "bf16": False, "report_to": "none",
        "disable_tqdm": True, "seed": 0, "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    task, args, model_args = parse_recipe(["--config", str(path)])
    check_run(task, args, model_args)
    inputs = prepare_run(task, args, model_args)
    assert inputs.reward_funcs[0] == rm and inputs.reward_funcs[1].__name__ == "accuracy_reward"
    trainer = build_trainer(task, args, model_args, inputs)
    trainer.train()

    assert trainer.reward_func_names == ["tiny-rm", "accuracy_reward"]
    logged = trainer._logs
    prompts, completions = list(logged["prompt"]), list(logged["completion"])
    assert len(completions) == 4
    scores = list(logged["rewards"]["tiny-rm"])
    accuracy = list(logged["rewards"]["accuracy_reward"])
    assert all(a in (0.0, 1.0) for a in accuracy)  # plain-text completions graded (TRL's own function fails on them)

    # the reward model's score of each prompt + completion (text prompts: TRL scores the concatenated text)
    tokenizer = AutoTokenizer.from_pretrained(rm)
    model = AutoModelForSequenceClassification.from_pretrained(rm, num_labels=1).eval()
    with torch.inference_mode():
        expected = [model(**tokenizer(p + c, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
                    for p, c in zip(prompts, completions)]
    assert all(math.isclose(s, e, rel_tol=1e-4, abs_tol=1e-4) for s, e in zip(scores, expected)), (scores, expected)
    assert max(expected) - min(expected) > 1e-3 or len(set(completions)) == 1
    history = [row for row in trainer.state.log_history if "rewards/tiny-rm/mean" in row]
    assert math.isclose(history[0]["rewards/tiny-rm/mean"], sum(expected) / len(expected), rel_tol=1e-4, abs_tol=1e-4)
    assert "rewards/accuracy_reward/mean" in history[0]
