"""Recipes written for other trainers, run through winnow as their users wrote them: TRL's documented GRPO recipe
and open-r1's demo recipe (both copied unchanged into tests/data/recipes/, their sources in each file's header).

As written, each meets this machine's limits (no GPU, no Hub, no flash-attn) and winnow's deliberate differences,
each as one line before any weights load. With the changes named below -- one row each in docs/recipes.md,
"Recipes from TRL and open-r1" -- both train 2 steps on the tiny model with their own reward functions, and an
open-r1 recipe reports to an offline W&B run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from harness import write_rows

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "tests" / "data" / "recipes"
sys.path.insert(0, str(ROOT / "launch"))

import train as train_cli  # noqa: E402  (launch/train.py)

# What this machine needs, in either recipe: a local model, the CPU, two short steps of a small batch.
CPU_RUN = {"use_cpu": True, "bf16": False, "max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4,
           "gradient_accumulation_steps": 1, "max_completion_length": 8, "disable_tqdm": True}

# open-r1's keys that winnow takes under another name (trainer/config/foreign_keys.py): old key -> (new key, value)
OPEN_R1_RENAMED = {
    "torch_dtype": ("dtype", "float32"),  # TRL 1.16's name; float32 because bf16 matmuls on this CPU are slow
    "dataset_configs": ("dataset_config", None),  # one configuration; a local file has none
    "max_prompt_length": ("max_prompt_tokens", 512),  # winnow drops longer prompts instead of truncating them
    "warmup_ratio": ("warmup_steps", 0.1),  # transformers 5's name: a float < 1 is a ratio of the steps
}
# vllm_device: not a TRL 1.16 field; overwrite_output_dir: winnow's, command line only (a recipe cannot delete)
OPEN_R1_DROPPED = ("vllm_device", "overwrite_output_dir")
OPEN_R1_CHANGED = {
    "dataset_prompt_column": "problem",  # open-r1's default; winnow's default uses a ready `prompt` column, as TRL
    "attn_implementation": "sdpa",  # flash_attention_2 needs flash-attn (CUDA)
    "use_vllm": False,  # no vLLM engine in the trainer on this CPU machine
    "push_to_hub": False,  # offline (HF_HUB_OFFLINE=1): the push is refused before training
}

# The columns TRL's recipe needs: `trl grpo` trains on the dataset as is; accuracy_reward reads solution.
POLARIS_LIKE = [
    {"prompt": [{"role": "user", "content": f"Compute {a} + {b}. Put the answer in \\boxed{{}}."}],
     "solution": f"${a + b}$"} for a, b in [(1, 2), (3, 4), (2, 2), (5, 1), (6, 3), (4, 4), (7, 1), (2, 5)]
]
OPEN_R1_MATH_LIKE = [  # open-r1/OpenR1-Math-220k's columns: the problem, a worked solution, the final answer
    {"problem": f"What is {a} times {b}?", "solution": f"${a} \\times {b} = \\boxed{{{a * b}}}$",
     "answer": str(a * b), "problem_type": "Algebra"} for a, b in [(2, 3), (4, 2), (3, 3), (5, 2), (1, 7), (6, 1)]
]


def _recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / name).read_text())


def _write(path: Path, recipe: dict) -> str:
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def _steps(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "reward" in r]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB__DISABLE_STATS", "true")  # no system-metrics sampler on 2 cores
    yield tmp_path / "wandb"
    import wandb

    wandb.teardown()  # wandb keeps WANDB_DIR process-wide until then: a later test's run would write here


@pytest.mark.parametrize("name, first_line", [
    ("trl_docs_grpo.yaml", "error: recipe: Your setup doesn't support bf16/gpu"),
    ("open_r1_config_demo.yaml", "error: overwrite_output_dir: a recipe cannot opt itself in"),
])
def test_as_written_each_recipe_stops_at_one_line_before_weights_load(name, first_line, tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipes' own output folders land here if anything were written
    assert train_cli.main(["--config", str(RECIPES / name)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(first_line), err[-3:]
    assert not any(tmp_path.iterdir())


def test_trl_docs_recipe_trains_with_trls_accuracy_reward(tmp_path, tiny_model, capsys):
    """The documented recipe on a local dataset of its columns (prompt + solution), TRL's accuracy_reward scoring."""
    recipe = _recipe("trl_docs_grpo.yaml")
    recipe.update(CPU_RUN, model_name_or_path=tiny_model, output_dir=str(tmp_path / "run"), report_to="none",
                  dataset_name=write_rows(POLARIS_LIKE, tmp_path / "polaris.parquet"))
    assert train_cli.main(["--config", _write(tmp_path / "trl.yaml", recipe)]) == 0, capsys.readouterr().err[-2000:]
    steps = _steps(tmp_path / "run")  # TrainingArguments' logging_steps (10) logs the last step only
    assert steps[-1]["step"] == 2 and 0.0 <= steps[-1]["rewards/accuracy_reward/mean"] <= 1.0


def test_open_r1_demo_recipe_trains_with_its_rewards_and_reports_to_wandb(tmp_path, tiny_model, capsys,
                                                                          offline_wandb):
    recipe = _recipe("open_r1_config_demo.yaml")
    for old, (new, value) in OPEN_R1_RENAMED.items():
        recipe.pop(old)
        if value is not None:
            recipe[new] = value
    for key in OPEN_R1_DROPPED:
        recipe.pop(key)
    recipe.update(OPEN_R1_CHANGED)
    recipe.update(CPU_RUN, model_name_or_path=tiny_model, output_dir=str(tmp_path / "run"),
                  dataset_name=write_rows(OPEN_R1_MATH_LIKE, tmp_path / "openr1.parquet"))
    assert train_cli.main(["--config", _write(tmp_path / "openr1.yaml", recipe)]) == 0, capsys.readouterr().err[-3000:]
    steps = _steps(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    reward_means = sorted(k for k in steps[0] if k.startswith("rewards/") and k.endswith("/mean"))
    # open-r1's accuracy and format, under the function names open-r1's own runs log them with (TRL names the metric)
    assert reward_means == ["rewards/accuracy_reward/mean", "rewards/format_reward/mean"], reward_means
    assert list(offline_wandb.glob("offline-run-*")), "report_to: wandb wrote no offline run"


def test_docs_table_lists_every_key_of_both_recipes_and_every_refused_key():
    """docs/recipes.md, "Recipes from TRL and open-r1": a row naming each key the two recipes use, each key winnow
    refuses from other trainers, and each change this test makes."""
    from trainer.config.foreign_keys import FOREIGN_KEYS

    doc = (ROOT / "docs" / "recipes.md").read_text().split("## Recipes from TRL and open-r1", 1)[1]
    rows = [line.split("|")[1] for line in doc.splitlines() if line.startswith("| `")]
    named = {key.strip() for cell in rows for key in cell.replace("`", "").split(",")}
    keys = set(_recipe("trl_docs_grpo.yaml")) | set(_recipe("open_r1_config_demo.yaml")) | set(FOREIGN_KEYS)
    keys |= set(OPEN_R1_CHANGED) | set(CPU_RUN) - {"disable_tqdm", "use_cpu"}
    assert keys <= named, sorted(keys - named)


@pytest.mark.parametrize("change, first_line", [
    ({"attn_implementation": "flash_attention_2"},
     "error: attn_implementation: flash_attention_2 needs the flash_attn"),
    ({"push_to_hub": True}, "error: push_to_hub: is true but HF_HUB_OFFLINE is set"),
])
def test_open_r1s_gpu_and_hub_settings_are_one_line_before_weights_load(change, first_line, tmp_path, tiny_model,
                                                                        capsys, monkeypatch):
    """Two of the named changes are refusals, not preferences: flash-attention without flash-attn would fail at the
    weight load, a push from an offline machine after training."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    recipe = {"model_name_or_path": tiny_model, "output_dir": str(tmp_path / "run"), **CPU_RUN, **change,
              "dataset_name": write_rows(POLARIS_LIKE, tmp_path / "polaris.parquet"), "reward_funcs": ["accuracy"],
              "report_to": "none"}
    assert train_cli.main(["--config", _write(tmp_path / "r.yaml", recipe)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(first_line)
    assert not (tmp_path / "run").exists()
