"""A local parquet dataset in dataset_name trains through launch/train.py's main, TRL's column contract intact.

One in-process run of one step on the tiny model (issue 35, items 1, 2 and 7): a folder with train.parquet and
test.parquet, a chat ``prompt`` and extra columns of several types (a string, a struct with a list inside, a list of
ints, a bool); the user's reward function (import_modules) records what it is called with. Training and the
evaluation on the test split (eval_strategy: steps, as trl grpo passes dataset[dataset_test_split]) both hand it the
prompt messages and every other column exactly as written, and nothing else from the dataset.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from harness import typed, write_rows

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launch"))

import train as train_cli  # noqa: E402  (launch/train.py)

RECORDER = '''
import json
CALLS = []
def record(prompts=None, completions=None, completion_ids=None, trainer_state=None, log_extra=None, log_metric=None,
           **columns):
    CALLS.append({"prompts": prompts, "columns": columns})
    return [0.0] * len(completions)
'''


def _rows(split: str, n: int) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": f"{split} system {i}"},
                        {"role": "user", "content": f"{split} question {i}: what is {{x}} + \\boxed{{}}?"}],
             "solution": f"{split}-{i}", "meta": {"level": i, "tags": ["t"] * i, "weight": i / 4},
             "steps": list(range(i)), "hard": i % 2 == 1} for i in range(n)]


def test_a_local_parquet_reaches_the_reward_function_intact(tmp_path, monkeypatch, tiny_model):
    data = tmp_path / "data"
    data.mkdir()
    train_rows, test_rows = _rows("train", 4), _rows("test", 2)
    write_rows(train_rows, data / "train.parquet")
    write_rows(test_rows, data / "test.parquet")
    (tmp_path / "generic_ds_recorder.py").write_text(RECORDER)
    monkeypatch.chdir(tmp_path)  # import_modules imports from the working folder, as `trl grpo` does
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    recipe = {
        "model_name_or_path": "offline:tiny-qwen3", "dataset_name": str(data),
        "import_modules": ["generic_ds_recorder"], "reward_funcs": ["generic_ds_recorder.record"],
        "enable_thinking": False, "num_generations": 4,
        "per_device_train_batch_size": 4, "max_completion_length": 8, "max_prompt_tokens": 512, "max_steps": 1,
        "save_strategy": "no", "logging_steps": 1, "eval_strategy": "steps", "eval_steps": 1,
        "per_device_eval_batch_size": 4, "use_cpu": True, "bf16": False, "report_to": "none", "disable_tqdm": True,
        "seed": 0, "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    try:
        assert train_cli.main(["--config", str(tmp_path / "r.yaml")]) == 0
        calls = sys.modules["generic_ds_recorder"].CALLS
    finally:
        sys.modules.pop("generic_ds_recorder", None)

    as_written = {json.dumps(r["prompt"]): r for r in train_rows + test_rows}
    seen = {"train": 0, "test": 0}
    for call in calls:  # the recipe check's probe, the training step, the evaluation
        assert sorted(call["columns"]) == ["hard", "meta", "solution", "steps"]  # no answer/source added, none lost
        for i, prompt in enumerate(call["prompts"]):
            assert isinstance(prompt, list), prompt  # chat messages, never their text
            row = as_written[json.dumps(prompt)]
            assert typed({k: v[i] for k, v in call["columns"].items()}) == typed(
                {k: v for k, v in row.items() if k != "prompt"})
            seen[row["solution"].split("-")[0]] += 1
    assert seen["train"] >= 4 and seen["test"] == 2 * 4, seen  # one step of 4 rollouts; 2 test prompts x 4
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_reward" in m for m in metrics), metrics  # the evaluation reached the run's metrics file
