"""launch/train.py as a user meets it: every knowable mistake is one line ``error: <field>: ... Fix: ...`` with
exit status 2 before any weights load and nothing written; a folder holding a run is never overwritten by
accident; recipe.resolved.yaml is itself a recipe; --help is readable.

Most cases call the entry point's ``main()`` in-process (a subprocess start costs seconds each); two go
through a real ``accelerate launch`` (one process, and two processes where only rank 0 may print)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness import TRAIN_CLI_RECIPE

ROOT = Path(__file__).resolve().parents[2]
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
sys.path.insert(0, str(ROOT / "launch"))

import train as train_cli  # noqa: E402  (launch/train.py)

RECIPE = TRAIN_CLI_RECIPE


@pytest.fixture
def no_weights(monkeypatch):
    """Any weight load fails the test: the errors must come before the model is touched."""
    from transformers import PreTrainedModel

    def refuse(cls, *a, **k):
        raise AssertionError(f"weights loaded: {cls.__name__}.from_pretrained{a}")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))


def _write(path: Path, recipe: dict) -> Path:
    path.write_text(yaml.safe_dump(recipe))
    return path


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its contents (to show a refused run left it untouched)."""
    if not folder.exists():
        return {}
    return {
        str(p.relative_to(folder)): (p.read_bytes().hex() if p.is_file() else "dir") for p in sorted(folder.rglob("*"))
    }


def _fake_run(out: Path) -> None:
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')


# (case id, recipe changes, extra command-line arguments, environment, field named, words the fix contains)
CASES = [
    ("launch_processes", {"launch_processes": 2}, [], {}, "launch_processes", "accelerate config"),
    ("world_size", {"launch_processes": 1}, [], {"WORLD_SIZE": "2"}, "launch_processes", "accelerate config"),
    ("output_dir_is_a_file", {}, ["--output_dir", "{tmp}/a_file/run"], {}, "output_dir", "another --output_dir"),
    ("output_dir_holds_run", {}, [], {}, "output_dir", "--resume_from_checkpoint true"),
    ("overwrite_and_resume", {}, ["--overwrite_output_dir", "true", "--resume_from_checkpoint", "true"], {},
     "overwrite_output_dir", "drop --"),
    ("offline_alias", {"model_name_or_path": "offline:tiny"}, [], {}, "model_name_or_path", "offline:tiny-qwen3"),
    ("local_model_missing", {"model_name_or_path": "/no/such/model"}, [], {}, "model_name_or_path", "save_pretrained"),
    ("hub_model_not_cached", {"model_name_or_path": "nobody-xyz/no-such-model"}, [], {"HF_HUB_OFFLINE": "1"},
     "model_name_or_path", "hf download"),
    ("teacher_alias", {"teacher_model_name_or_path": "offline:nope"}, [], {}, "teacher_model_name_or_path",
     "offline:smollm2"),
    ("lora_sync_without_peft", {"use_vllm": True, "vllm_mode": "server", "weight_sync": "lora"}, [], {}, "weight_sync",
     "use_peft: true"),
    ("reward_weights_length", {"reward_weights": [1.0]}, [], {}, "reward_weights", "one weight per entry"),
    ("reward_vs_columns", {"reward_funcs": ["countdown"]}, [], {}, "reward_funcs", "columns"),
    ("reward_unknown", {"reward_funcs": ["math_acuracy"]}, [], {}, "reward_funcs", "registered"),
    ("reward_dotted_missing", {"reward_funcs": ["no_such_pkg.rewards.fn"]}, [], {}, "reward_funcs", "importable"),
    ("resume_without_checkpoint", {}, ["--resume_from_checkpoint", "true"], {}, "resume_from_checkpoint",
     "without --resume_from_checkpoint"),
    ("resume_path_not_checkpoint", {}, ["--resume_from_checkpoint", "{tmp}/run/checkpoint-9"], {},
     "resume_from_checkpoint", "checkpoint-N folder"),
    ("resume_outside_output_dir", {}, ["--resume_from_checkpoint", "{tmp}/run/../elsewhere/checkpoint-1"], {},
     "resume_from_checkpoint", "--allow_external_checkpoint true"),
    ("env_unsafe", {"env": {"LD_PRELOAD": "/nonexistent/evil.so"}}, [], {}, "env", "--allow_unsafe_env true"),
    ("recipe_opts_itself_in", {"allow_unsafe_env": True}, [], {}, "allow_unsafe_env", "on the command line"),
    ("config_missing", None, ["--config", "{tmp}/nope.yaml"], {}, "--config", "check the path"),
    ("config_malformed", "model_name_or_path: offline:tiny-qwen3\nlearning_rate: [1e-3\n", [], {}, "--config",
     "line and column"),
    ("config_not_mapping", "- a\n- b\n", [], {}, "--config", "field: value"),
    ("yaml_unknown_key", {"learning_rat": 1e-3}, [], {}, "learning_rat", "did you mean 'learning_rate'"),
    ("cli_unknown_flag", {}, ["--num_generation", "4"], {}, "--num_generation", "did you mean 'num_generations'"),
    ("cli_wrong_type", {}, ["--learning_rate", "fast"], {}, "--learning_rate", "--help"),
    ("yaml_wrong_type", {"num_generations": 2.5}, [], {}, "num_generations", "type int"),
    ("trl_validation", {"num_generations": 3}, [], {}, "recipe", "the message names"),
    ("stage_unknown", {"rollout_filter": "snr_typo"}, [], {}, "rollout_filter", "use one of"),
    ("dataset_unknown", {"dataset_name": "arithmetics"}, [], {}, "dataset_name", "arithmetic"),
    ("dataset_kwarg_unknown", {"dataset_kwargs": {"num_sample": 3}}, [], {}, "dataset_kwargs", "accepts"),
    ("dataset_path_missing", {"dataset_name": "json", "dataset_kwargs": {"path": "/no/such.jsonl"}}, [], {},
     "dataset_kwargs", "path"),
    ("dataset_empty_file", {"dataset_name": "json", "dataset_kwargs": {"path": "{tmp}/empty.jsonl"}}, [], {},
     "dataset_kwargs", "file with rows"),
    ("dataset_zero_rows", {"dataset_kwargs": {"num_samples": 0}}, [], {}, "dataset_kwargs", "num_samples"),
    ("all_prompts_too_long", {"max_prompt_tokens": 3}, [], {}, "dataset_kwargs", "max_prompt_tokens"),
    ("import_module_missing", {"import_modules": ["no_such_user_module"]}, [], {}, "import_modules", "pip install"),
    # a text task has no evaluation set: refused here, not by TRL after the weights loaded
    ("eval_on_text_task", {"eval_strategy": "steps", "eval_steps": 1}, [], {}, "eval_strategy", "eval_strategy: no"),
    # a Hub id or local path in dataset_name (trainer/data/generic.py): what cannot work is refused the same way
    ("dataset_hub_not_cached", {"dataset_name": "nobody-xyz/no-such-dataset"}, [], {"HF_HUB_OFFLINE": "1"},
     "dataset_name", "hf download --repo-type dataset"),
    ("dataset_no_prompt_column", {"dataset_name": "{tmp}/qa.jsonl"}, [], {}, "dataset_name",
     "dataset_columns: {prompt: question}"),
    ("dataset_column_path_missing", {"dataset_name": "{tmp}/qa.jsonl", "dataset_columns": {"prompt": "problem"}},
     [], {}, "dataset_columns", "dataset_columns"),
    ("eval_without_test_split", {"dataset_name": "{tmp}/prompts.jsonl", "eval_strategy": "steps", "eval_steps": 1},
     [], {}, "eval_strategy", "dataset_test_split"),
    ("dataset_streaming_without_max_steps", {"dataset_name": "{tmp}/prompts.jsonl", "dataset_streaming": True,
                                             "max_steps": -1}, [], {}, "dataset_streaming", "max_steps: N"),
    ("generic_field_with_registered_loader", {"dataset_streaming": True}, [], {}, "dataset_streaming",
     "dataset_kwargs"),
    ("json_loader_chat_column", {"dataset_name": "json", "dataset_kwargs": {"path": "{tmp}/chat.jsonl",
                                                                          "problem_column": "prompt"}},
     [], {}, "dataset_kwargs", "the message says"),
    # auto on a folder with a run but no checkpoint: a fresh start would overwrite that run
    ("resume_auto_run_without_checkpoint", {}, ["--resume_from_checkpoint", "auto"], {}, "resume_from_checkpoint",
     "--overwrite_output_dir true"),
]


@pytest.mark.parametrize("case, changes, extra, env, field, fix", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_weights_load(case, changes, extra, env, field, fix, tmp_path, capsys,
                                                  monkeypatch, tiny_model, no_weights):
    out = tmp_path / "run"
    (tmp_path / "a_file").write_text("")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "qa.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    (tmp_path / "chat.jsonl").write_text('{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}\n')
    if case == "output_dir_holds_run":
        _fake_run(out)
    if case == "resume_auto_run_without_checkpoint":
        out.mkdir()
        (out / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    recipe = tmp_path / "recipe.yaml"
    if isinstance(changes, str):
        recipe.write_text(changes)
    elif changes is not None:
        text = yaml.safe_dump({**RECIPE, "output_dir": str(out), **changes}).replace("{tmp}", str(tmp_path))
        recipe.write_text(text)
    before = _tree(out)
    capsys.readouterr()
    argv = ["--config", str(recipe), *(a.replace("{tmp}", str(tmp_path)) for a in extra)]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"error: {field}:") or line.startswith(f"error: WinnowConfig.{field}:"), line
    assert "Fix:" in line and fix in line.split("Fix:", 1)[1], line
    assert _tree(out) == before  # nothing created, nothing touched


@pytest.mark.parametrize("flag", ["load_in_4bit", "load_in_8bit"])
def test_quantized_loading_without_bitsandbytes_is_one_line(flag, tmp_path, capsys, monkeypatch, tiny_model,
                                                           no_weights):
    """load_in_4bit / load_in_8bit load through bitsandbytes; without it they are refused before any weights load
    (they used to pass every check and be ignored)."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is not None:
        pytest.skip("bitsandbytes is installed: the flag is passed to TRL instead")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(tmp_path / "run"), flag: True})
    capsys.readouterr()
    assert train_cli.main(["--config", str(recipe)]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: {flag}: ") and "bitsandbytes" in line and "\n" not in line, line
    assert not (tmp_path / "run").exists()


def test_model_revision_and_trust_remote_code_reach_the_loaders(tmp_path, monkeypatch, tiny_model):
    """--model_revision reaches the policy's weights as well as the tokenizer, and --trust_remote_code the tokenizer
    as well as the weights: what from_pretrained receives on the real build path (a local folder ignores the
    revision, so the tiny model still loads)."""
    from transformers import AutoTokenizer, PreTrainedModel

    from trainer.build import build_trainer
    from trainer.recipe import check_run, parse_recipe

    seen: dict[str, list[dict]] = {"model": [], "tokenizer": []}
    load_model, load_tokenizer = PreTrainedModel.from_pretrained.__func__, AutoTokenizer.from_pretrained.__func__

    def record_model(cls, *a, **k):
        seen["model"].append(k)
        return load_model(cls, *a, **k)

    def record_tokenizer(cls, *a, **k):
        seen["tokenizer"].append(k)
        return load_tokenizer(cls, *a, **k)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(record_model))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(record_tokenizer))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(tmp_path / "run")})
    parsed = parse_recipe(["--config", str(recipe), "--model_revision", "v1.0-test", "--trust_remote_code", "true"])
    check_run(*parsed)
    trainer = build_trainer(*parsed)
    assert trainer.model is not None
    assert [(k.get("revision"), k.get("trust_remote_code")) for k in seen["model"]] == [("v1.0-test", True)]
    assert [(k.get("revision"), k.get("trust_remote_code")) for k in seen["tokenizer"]] == [("v1.0-test", True)]


def test_resume_auto_starts_fresh_then_continues(tmp_path, capsys, monkeypatch):
    """--resume_from_checkpoint auto (the Slurm script's, for requeued jobs): in an empty folder a fresh run; run
    again on the folder it resumes from its latest checkpoint (global_step continues) instead of being refused."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "run"
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(out)})
    assert train_cli.main(["--config", str(recipe), "--resume_from_checkpoint", "auto"]) == 0
    assert _metrics_steps(out) == [1] and sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]

    assert train_cli.main(["--config", str(recipe), "--max_steps", "2", "--save_steps", "2",
                           "--resume_from_checkpoint", "auto"]) == 0, capsys.readouterr().err
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and _metrics_steps(out) == [1, 2]


def test_dry_run_refuses_an_unsafe_env_before_running_the_recipe(tmp_path):
    """`launch/train.py --dry-run` (the preflight Slurm runs on the batch host) as a user starts it, from a folder
    holding a module the recipe imports: one line naming env and the opt-in, and the module never ran."""
    marker = tmp_path / "imported"
    (tmp_path / "dry_run_probe.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(tmp_path / "o"),
                                          "import_modules": ["dry_run_probe"],
                                          "env": {"LD_PRELOAD": "/nonexistent/evil.so"}})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / "train.py"), "--config", str(recipe), "--dry-run"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and "env: " in fails[0] and "LD_PRELOAD" in fails[0], proc.stdout
    assert "--allow_unsafe_env true" in fails[0].split("Fix:", 1)[1] and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_traceback_on_request(tmp_path, capsys):
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(tmp_path / "o"), "learning_rat": 1})
    from trainer.config.core import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        train_cli.main(["--config", str(recipe), "--traceback"])


def _launch(*args: str, config: str = "launch/accelerate/cpu.yaml") -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    cmd = [ACCELERATE, "launch", *args[:1], "--config_file", config, "launch/train.py", *args[1:]]
    return subprocess.run([c for c in cmd if c], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_under_accelerate_launch_the_line_is_what_the_user_reads(tmp_path):
    """One process, accelerate's -q: our line is the last thing on stderr (without -q accelerate adds its own
    CalledProcessError traceback after it; that one is accelerate's, not ours)."""
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(tmp_path / "o"), "learning_rat": 1})
    proc = _launch("-q", "--config", str(recipe))
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert ours == [proc.stderr.strip().splitlines()[-1]], proc.stderr[-3000:]
    assert "did you mean 'learning_rate'" in ours[0] and "Traceback" not in proc.stderr


def test_two_processes_print_the_line_once(tmp_path):
    """Two processes (torchrun): WORLD_SIZE=2 against launch_processes: 1 fails at parse time on both ranks, and
    only rank 0 prints; the child exit status is 2."""
    out = tmp_path / "o"
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(out), "launch_processes": 1})
    proc = _launch("", "--config", str(recipe), config="launch/accelerate/multi_cpu_2.yaml")
    assert proc.returncode != 0
    both = proc.stdout + proc.stderr
    ours = [line for line in both.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and "launch_processes" in ours[0] and "this launch has 2" in ours[0], both[-3000:]
    assert "exitcode  : 2" in both or "exit code 2" in both or "exitcode: 2" in both, both[-3000:]
    assert not out.exists()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _metrics_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
            if "reward" in json.loads(line)]


def test_a_real_run_folder_is_protected_resumed_and_overwritten(tmp_path, capsys, monkeypatch):
    """A real 1-step run of a tied-embedding model; re-running into its folder is refused and leaves it byte for
    byte; a resume continues it without the "missing keys: lm_head.weight" alarm; --overwrite_output_dir
    starts a clean folder. A successful run leaves no .staging folder."""
    from trainer.tools.assets import make_tiny_qwen3

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    tied = make_tiny_qwen3(tmp_path / "tied", tie_word_embeddings=True)
    out = tmp_path / "run"
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(out), "model_name_or_path": str(tied)})
    assert train_cli.main(["--config", str(recipe)]) == 0
    assert (out / "checkpoint-1").is_dir() and _metrics_steps(out) == [1]
    assert not (out / ".staging").exists()
    card = (out / "README.md").read_text()
    assert "[None]" not in card and f"`{tied}` (a local model)" in card

    before = _tree(out)
    capsys.readouterr()
    assert train_cli.main(["--config", str(recipe)]) == 2
    line = capsys.readouterr().err.strip()
    assert "--resume_from_checkpoint true" in line and "--overwrite_output_dir true" in line and "\n" not in line
    assert _tree(out) == before

    records = _Records()
    logging.getLogger("transformers.trainer").addHandler(records)
    try:
        assert train_cli.main(["--config", str(recipe), "--max_steps", "2", "--save_steps", "2",
                               "--resume_from_checkpoint", "true"]) == 0
    finally:
        logging.getLogger("transformers.trainer").removeHandler(records)
    assert _metrics_steps(out) == [1, 2] and (out / "checkpoint-2").is_dir()
    assert not any("missing keys" in m for m in records.messages), records.messages
    assert not (out / ".staging").exists()

    assert train_cli.main(["--config", str(recipe), "--overwrite_output_dir", "true"]) == 0
    assert _metrics_steps(out) == [1]  # a new run, not appended to the old log
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    resolved = yaml.safe_load((out / "recipe.resolved.yaml").read_text())
    assert "overwrite_output_dir" not in resolved and "resume_from_checkpoint" not in resolved


def test_a_resume_that_cannot_continue_exactly_is_one_line(tmp_path, capsys, monkeypatch):
    """A checkpoint inside a generation batch that lacks the batch's rollouts (as written before they were saved) is
    refused through the entry point before the weights load: one line, exit status 2, the run's folder as it was."""
    from trainer.guards.generation_resume import batch_file

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "run"
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(out), "steps_per_generation": 2})
    with pytest.warns(UserWarning, match="save_steps"):  # checkpoint-1 lies inside the 2-step generation batch
        assert train_cli.main(["--config", str(recipe)]) == 0
    (out / "checkpoint-1" / batch_file(0, 1)).unlink()
    before = _tree(out)
    capsys.readouterr()
    assert train_cli.main(["--config", str(recipe), "--max_steps", "2", "--resume_from_checkpoint", "true"]) == 2
    line = capsys.readouterr().err.strip()  # refused before the weights load: nothing else is printed
    assert line.startswith("error:") and "\n" not in line, line
    assert "resume_from_checkpoint: checkpoint-1 lies inside a generation batch" in line
    assert _tree(out) == before  # recipe.resolved.yaml included


def test_missing_keys_filter_keeps_real_missing_keys(tiny_model, tmp_path):
    """The filter drops the alarm only for a tied twin; a missing key of an untied model still warns."""
    from transformers import AutoModelForCausalLM

    from trainer.tools.assets import make_tiny_qwen3
    from trainer.tools.run_artifacts import _TiedKeysFilter

    def passes(model, keys):
        record = logging.LogRecord("transformers.trainer", logging.WARNING, __file__, 0,
                                   f"There were missing keys in the checkpoint model loaded: {keys}.", None, None)
        holder = type("T", (), {"model": model})()  # the filter holds its trainer weakly: keep one alive here
        return _TiedKeysFilter(holder).filter(record)

    untied = AutoModelForCausalLM.from_pretrained(tiny_model)
    tied = AutoModelForCausalLM.from_pretrained(make_tiny_qwen3(tmp_path / "tied", tie_word_embeddings=True))
    assert passes(untied, ["lm_head.weight"])
    assert not passes(tied, ["lm_head.weight"])
    assert passes(tied, ["lm_head.weight", "model.norm.weight"])


def test_built_trainer_is_freed(tmp_path):
    """A trainer from ``build_trainer`` is garbage once its caller drops it: nothing global (the tied-keys log filter
    on transformers' logger once was) keeps it, its model and optimizer alive for the life of the process."""
    import gc
    import weakref

    from trainer.build import build_trainer
    from trainer.recipe import parse_recipe

    argv = ["--config", "configs/demo/smollm2-arithmetic.yaml", "--model_name_or_path", "offline:tiny-qwen3",
            "--output_dir", str(tmp_path / "run"), "--report_to", "none", "--use_cpu", "true", "--bf16", "false"]
    trainer = build_trainer(*parse_recipe(argv))
    model, freed = weakref.ref(trainer.model), weakref.ref(trainer)
    del trainer
    gc.collect()
    assert freed() is None and model() is None


def test_resolved_recipe_round_trips(tmp_path, monkeypatch):
    """recipe.resolved.yaml is flat and is a recipe: resolving it again writes the same file (shipped recipes
    of every kind: demo, GRPODropout, RAGEN environment, UECR with a teacher)."""
    from trainer.recipe import parse_recipe, resolved_recipe, save_resolved_recipe

    for rel in ("configs/demo/smollm2-arithmetic.yaml", "configs/grpodropout/table1/qwen3-4b-kl_cov.yaml",
                "configs/ragen/sokoban-grpo-topp0.9.yaml", "configs/uecr/qwen3-4b-deepmath-teacher-qwen3-8b.yaml"):
        cpu = ["--bf16", "false", "--use_cpu", "true"] if yaml.safe_load((ROOT / rel).read_text()).get("bf16") else []
        first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
        save_resolved_recipe(resolved_recipe(*parse_recipe(["--config", str(ROOT / rel), *cpu, "--output_dir",
                                                            str(tmp_path / "o")])), first)
        save_resolved_recipe(resolved_recipe(*parse_recipe(["--config", str(first)])), second)
        assert first.read_text() == second.read_text(), rel
        flat = yaml.safe_load(first.read_text())
        assert all(not isinstance(v, dict) or k.endswith(("kwargs", "config")) for k, v in flat.items())


def test_dataset_kwargs_on_the_command_line_merge_into_the_recipe(tmp_path):
    from trainer.recipe import parse_recipe

    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(tmp_path / "o"),
                                          "dataset_kwargs": {"num_samples": 16, "seed": 1, "max_value": 50}})
    task, _, _ = parse_recipe(["--config", str(recipe), "--dataset_kwargs", '{"seed": 7}'])
    assert task.dataset_kwargs == {"num_samples": 16, "seed": 7, "max_value": 50}
    # another dataset on the command line: the recipe's loader arguments do not apply to it
    task, _, _ = parse_recipe(
        ["--config", str(recipe), "--dataset_name", "countdown", "--dataset_kwargs", '{"seed": 7}']
    )
    assert task.dataset_kwargs == {"seed": 7}


def test_user_module_registers_a_reward_and_a_stage(tmp_path, monkeypatch, tiny_model):
    """import_modules runs before the recipe is checked: a user's stage name is valid in the same recipe, and a
    dotted reward path works as in `trl grpo`."""
    from trainer.build import prepare_run
    from trainer.pipeline import stages
    from trainer.recipe import parse_recipe

    # the user's stage lives in this test only: later tests (tests/gpu/test_gpu_devices.py lists every stage) must
    # not see it, whichever order a worker runs them in (built-ins loaded first, so the copy holds them)
    stages.available("rollout_filter")
    monkeypatch.setattr(stages, "_REGISTRY", {kind: dict(named) for kind, named in stages._REGISTRY.items()})
    pkg = tmp_path / "user_ext_cli"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ext.py").write_text(
        "from trainer.pipeline.stages import register_stage\n"
        "from trainer.pipeline.stages import get_stage\n"
        "@register_stage('rollout_filter', 'keep_all_user')\n"
        "def keep_all_user(batch, args):\n"
        "    return get_stage('rollout_filter', 'none').fn(batch, args)\n"
        "def length_reward(prompts=None, completions=None, completion_ids=None, **kwargs):\n"
        "    return [float(len(c)) for c in completion_ids]\n")
    monkeypatch.chdir(tmp_path)
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(tmp_path / "o"),
                                          "import_modules": ["user_ext_cli.ext"],
                                          "rollout_filter": "keep_all_user",
                                          "reward_funcs": ["math_accuracy", "user_ext_cli.ext.length_reward"]})
    task, args, model = parse_recipe(["--config", str(recipe)])
    assert args.rollout_filter == "keep_all_user"
    inputs = prepare_run(task, args, model)
    assert inputs.reward_funcs[1].__name__ == "length_reward"


def test_help_describes_groups_and_stage_choices():
    from trainer.pipeline import stages
    from trainer.recipe import recipe_parser

    text = recipe_parser().format_help()
    assert text.index("Train a language model") < text.index("run:") < text.index("--config RECIPE.yaml  The recipe")
    assert "e.g. --config configs/demo/smollm2-arithmetic.yaml" in text
    heads = [h for h in ("run:", "task: what to train on:", "stages:", "environment tasks", "TRL GRPOConfig:",
                         "transformers TrainingArguments:")]
    positions = [text.index(h) for h in heads]
    assert positions == sorted(positions)
    assert text.index("--max_turns") > text.index("environment tasks")  # no longer the first options shown
    assert f"Choices: {', '.join(stages.available('rollout_dropout'))}." in " ".join(text.split())


def test_learning_check_needs_enough_steps():
    from trainer.tools.run_artifacts import learning_verdict

    rows = [{"step": i, "reward": r} for i, r in enumerate([0.0, 0.5, 1.0], 1)]
    assert "too few steps to judge" in learning_verdict(rows)
    rows = [{"step": i, "reward": 0.1 * i + 0.01 * (i % 2)} for i in range(1, 9)]
    assert learning_verdict(rows).endswith("learned")


def test_eval_records_a_system_config_only_once_its_model_loaded(tmp_path):
    """A typo in an evaluated model's path leaves no <system>/config.json behind, so the corrected re-run is not
    refused as 'results of another configuration'."""
    from trainer.eval.runner import EvalConfig, run

    def config(system: dict) -> EvalConfig:
        return EvalConfig.from_dict({"output_dir": str(tmp_path / "eval"), "systems": [system], "entropy": False,
                                     "benchmarks": {"arithmetic": {"k": 1, "num_samples": 2}}})

    with pytest.raises(OSError):
        run(config({"name": "sys", "model": str(tmp_path / "no_such_model")}))
    assert not (tmp_path / "eval" / "sys" / "config.json").exists()
    summary = run(config({"name": "sys", "backend": "oracle_gold"}))
    assert summary["systems"]["sys"]["benchmarks"]["arithmetic"]["mean"] == 1.0
    assert json.loads((tmp_path / "eval" / "sys" / "config.json").read_text())["system"]["backend"] == "oracle_gold"


def test_trainer_starts_with_expandable_segments_unless_the_user_or_sleep_mode_says_otherwise(tmp_path):
    """launch/train.py sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch starts (issue 32, C.9); a
    user's own allocator config (either name torch reads) is left alone, and so is a recipe that enables vLLM's sleep
    mode, whose CuMemAllocator asserts that expandable segments are off -- from the YAML or the command line, where
    the command line wins."""
    plain = _write(tmp_path / "plain.yaml", {**RECIPE, "output_dir": str(tmp_path / "o")})
    sleepy = _write(tmp_path / "sleep.yaml", {**RECIPE, "output_dir": str(tmp_path / "o"),
                                              "vllm_enable_sleep_mode": True})
    cases = [
        ({}, ["--config", str(plain)], "expandable_segments:True"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}, ["--config", str(plain)], "max_split_size_mb:512"),
        ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:256"}, ["--config", str(plain)], None),
        ({}, ["--config", str(sleepy)], None),
        ({}, ["--config", str(plain), "--vllm_enable_sleep_mode"], None),
        ({}, ["--config", str(sleepy), "--vllm_enable_sleep_mode", "false"], "expandable_segments:True"),
        ({}, ["--config", str(tmp_path / "missing.yaml")], "expandable_segments:True"),
    ]
    for environ, argv, expected in cases:
        env = dict(environ)
        train_cli.set_allocator_conf(argv, env)
        assert env.get("PYTORCH_CUDA_ALLOC_CONF") == expected, (environ, argv)
    # the entry point itself: the process that runs launch/train.py holds the setting when main() starts torch
    # (a recipe error ends it right after parsing)
    bad = _write(tmp_path / "bad.yaml", {**RECIPE, "output_dir": str(tmp_path / "o"), "learning_rat": 1})
    probe = ("import os, runpy, sys\n"
             f"sys.argv = ['launch/train.py', '--config', {str(bad)!r}]\n"
             "try:\n    runpy.run_path('launch/train.py', run_name='__main__')\n"
             "except SystemExit as e:\n    print('exit', e.code, os.environ.get('PYTORCH_CUDA_ALLOC_CONF'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "exit 2 expandable_segments:True", proc.stderr[-2000:]


def test_no_secret_in_what_a_run_writes(tmp_path, monkeypatch):
    """A real 1-step run with a Hub token in ``model_init_kwargs`` and ``hub_token``, a password in
    ``vllm_server_base_url`` (not used: no vLLM here) and ``report_to: wandb`` (offline): no file of the run folder
    (recipe.resolved.yaml, every training_args.bin, checkpoints) and no file of the W&B run (its logged config
    included) holds a secret; placeholders stand where the values were (trainer/config/redaction.py)."""
    import torch
    import wandb

    from trainer.config.redaction import REDACTED

    secret = "hf_WinnowE2eSECRET"
    for key, value in dict(WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_PROJECT="winnow-test",
                           WANDB_SILENT="true", WANDB_CONSOLE="off", WANDB__DISABLE_STATS="true").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "run"
    url = f"http://winnow:{secret}-url@127.0.0.1:9"
    recipe = _write(tmp_path / "r.yaml", {**RECIPE, "output_dir": str(out), "report_to": "wandb",
                                          "model_init_kwargs": {"token": f"{secret}-model"},
                                          "hub_token": f"{secret}-hub", "vllm_server_base_url": url})
    try:
        assert train_cli.main(["--config", str(recipe)]) == 0
    finally:
        wandb.finish()
        wandb.teardown()  # wandb keeps its process-wide settings (WANDB_DIR) until then: a later run would write here

    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    written = [p for p in (*out.rglob("*"), *runs[0].rglob("*")) if p.is_file()]
    assert not [str(p) for p in written if secret.encode() in p.read_bytes()]

    resolved = yaml.safe_load((out / "recipe.resolved.yaml").read_text())
    assert resolved["model_init_kwargs"] == {"token": REDACTED}
    assert resolved["vllm_server_base_url"] == "http://***@127.0.0.1:9" and "hub_token" not in resolved
    pickled = sorted(out.rglob("training_args.bin"))
    assert [p.parent.name for p in pickled] == ["checkpoint-1", "run"]  # the checkpoint's and the final model's
    for path in pickled:
        args = torch.load(path, weights_only=False)
        assert (args.model_init_kwargs["token"], args.hub_token, args.vllm_server_base_url) == (
            REDACTED, REDACTED, "http://***@127.0.0.1:9"), path
    # The run's config as W&B holds it: the config records of its transaction log, decoded (a string split across
    # the log's 32 KiB blocks would slip past the byte search above).
    from grpo_trainer.test_wandb import _read_records
    from wandb.proto import wandb_internal_pb2

    [log] = runs[0].glob("run-*.wandb")
    logged = {item.key: json.loads(item.value_json) for rec in _read_records(log.read_bytes(), wandb_internal_pb2)
              if rec.WhichOneof("record_type") == "config" for item in rec.config.update}
    assert logged["model_init_kwargs"]["token"] == REDACTED and logged["hub_token"] == "<HUB_TOKEN>"
    assert logged["vllm_server_base_url"] == "http://***@127.0.0.1:9"
    assert secret not in json.dumps(logged)
