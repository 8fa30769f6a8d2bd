"""A recipe is code: the two guards that protect a user running someone else's recipe (trainer/config/
recipe_checks.py).

- ``env:`` keys other than the runtime knobs of ``ALLOWED_ENV`` are refused before anything
  is set in os.environ and before the recipe's ``import_modules`` run, unless the command line passes
  ``--allow_unsafe_env``; a recipe cannot opt itself in.
- ``resume_from_checkpoint`` naming a folder outside ``output_dir`` (symlinks and ``..`` resolved) is refused before
  any weights load -- a resume unpickles the checkpoint -- unless the command line passes
  ``--allow_external_checkpoint``; ``true``/``latest`` and a checkpoint inside ``output_dir`` are fine.

Parsing only: no trainer, no model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from trainer.config import recipe_checks as checks
from trainer.config.core import ConfigError
from trainer.config.recipe_parser import pop_cli_flag
from trainer.recipe import CLI_ONLY, DESCRIPTION, parse_recipe, resolved_recipe

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model_name_or_path": "offline:tiny-qwen3", "use_cpu": True, "bf16": False, "report_to": "none"}
SENTINEL = "set-by-the-test"


def _recipe(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**BASE, "output_dir": str(tmp_path / "out"), **fields}))
    return path


def _checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    return folder


# --- env: --------------------------------------------------------------------------------------------------------

DANGEROUS = ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PATH", "BASH_ENV", "WANDB_BASE_URL",
             "OPENAI_BASE_URL", "HF_ENDPOINT", "AWS_ENDPOINT_URL", "HTTPS_PROXY", "https_proxy", "REQUESTS_CA_BUNDLE",
             "SSL_CERT_FILE", "GIT_SSH_COMMAND", "NCCL_NET_PLUGIN", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "CC"]
# What the blocklist let through (issue "Security II", item 1): each sends the run's tokens elsewhere, runs a
# program, binds an address or makes the run trust files a recipe names -- all passed on main, refused now
BYPASSES = ["WANDB_CONFIG_DIR", "WINNOW_VLLM_PYTHON", "VLLM_HOST_IP", "HOME", "XDG_CONFIG_HOME",
            "XDG_CACHE_HOME", "HF_HOME", "HF_TOKEN_PATH", "HF_MODULES_CACHE", "TMPDIR", "TORCH_EXTENSIONS_DIR",
            "TORCHINDUCTOR_CACHE_DIR", "NCCL_CONF_FILE", "CUDA_HOME", "NVCC_PREPEND_FLAGS", "TRITON_CACHE_DIR",
            "TRITON_LIBCUDA_PATH", "GCONV_PATH", "BASH_FUNC_ls%%", "WANDB_HTTPS_PROXY", "WANDB_API_KEY",
            "MLFLOW_TRACKING_URI", "OPENAI_API_BASE", "tokenizers_parallelism"]
HARMLESS = ["TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "NCCL_DEBUG", "NCCL_P2P_DISABLE", "WANDB_PROJECT",
            "WANDB_MODE", "WANDB_NAME", "WANDB_TAGS", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE",
            "PYTORCH_CUDA_ALLOC_CONF"]


@pytest.mark.parametrize("key", DANGEROUS + BYPASSES)
def test_every_variable_but_a_runtime_knob_is_refused(key):
    assert checks.unsafe_env_keys({key: "x"}) == [key]


@pytest.mark.parametrize("key", HARMLESS)
def test_runtime_knobs_are_allowed(key):
    assert checks.unsafe_env_keys({key: "x"}) == []


def test_a_program_named_by_the_recipes_env_does_not_run_under_dry_run(tmp_path, monkeypatch):
    """The bypass that ran code: in server mode the preflight (launch/train.py --dry-run) asks the interpreter
    ``WINNOW_VLLM_PYTHON`` names for its vLLM version. From a recipe's env it is refused first; the program never
    runs."""
    from trainer.tools import preflight

    marker = tmp_path / "ran"
    program = tmp_path / "not-python"
    program.write_text(f"#!/bin/sh\ntouch {marker}\necho 0.31.0\n")
    program.chmod(0o755)
    monkeypatch.delenv("WINNOW_VLLM_PYTHON", raising=False)
    recipe = _recipe(tmp_path, env={"WINNOW_VLLM_PYTHON": str(program)}, use_vllm=True, vllm_mode="server",
                     max_prompt_tokens=64)
    report = preflight.run(["--config", str(recipe)])
    lines = report.render()
    assert report.failed and "env: the recipe sets WINNOW_VLLM_PYTHON" in lines, lines
    assert not marker.exists() and "WINNOW_VLLM_PYTHON" not in os.environ


def test_unsafe_env_is_refused_before_environ_changes(tmp_path, monkeypatch):
    """One line naming the field, the key and the fix; neither the unsafe key nor the harmless one next to it is
    set."""
    monkeypatch.setenv("LD_PRELOAD", SENTINEL)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", SENTINEL)
    recipe = _recipe(tmp_path, env={"TOKENIZERS_PARALLELISM": "false", "LD_PRELOAD": "/tmp/evil.so"})
    with pytest.raises(ConfigError) as err:
        parse_recipe(["--config", str(recipe)])
    message = str(err.value)
    assert message.startswith("env: ") and "LD_PRELOAD" in message and "\n" not in message, message
    assert "Fix:" in message and "--allow_unsafe_env true" in message.split("Fix:", 1)[1], message
    assert os.environ["LD_PRELOAD"] == SENTINEL and os.environ["TOKENIZERS_PARALLELISM"] == SENTINEL


def test_refused_env_runs_no_recipe_module(tmp_path, monkeypatch):
    """The refusal comes before import_modules: a module next to where the user runs (as under --dry-run on a
    Slurm batch host) is not imported."""
    marker = tmp_path / "imported"
    (tmp_path / "trust_probe_module.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    recipe = _recipe(tmp_path, env={"PYTHONPATH": "/tmp/evil"}, import_modules=["trust_probe_module"])
    with pytest.raises(ConfigError, match="^env: .*PYTHONPATH"):
        parse_recipe(["--config", str(recipe)])
    assert not marker.exists() and "trust_probe_module" not in sys.modules


@pytest.mark.parametrize("flag", [["--allow_unsafe_env", "true"], ["--allow_unsafe_env"], ["--allow-unsafe-env=yes"]])
def test_unsafe_env_is_accepted_with_the_command_line_opt_in(tmp_path, monkeypatch, flag):
    monkeypatch.setenv("LD_PRELOAD", SENTINEL)  # restored after the test
    recipe = _recipe(tmp_path, env={"LD_PRELOAD": "/tmp/nonexistent-evil.so"})
    task, _, _ = parse_recipe(["--config", str(recipe), *flag])
    assert os.environ["LD_PRELOAD"] == "/tmp/nonexistent-evil.so" and task.allow_unsafe_env


def test_harmless_env_needs_no_opt_in(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", SENTINEL)
    monkeypatch.setenv("NCCL_DEBUG", SENTINEL)
    task, _, _ = parse_recipe(["--config", str(_recipe(tmp_path, env={"TOKENIZERS_PARALLELISM": "false",
                                                                       "NCCL_DEBUG": "WARN"}))])
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false" and os.environ["NCCL_DEBUG"] == "WARN"
    assert not task.allow_unsafe_env


@pytest.mark.parametrize("name", CLI_ONLY)
def test_a_recipe_cannot_opt_itself_in(tmp_path, monkeypatch, name):
    """The opt-ins protect a user running someone else's recipe: set in the recipe file they are refused (one line
    naming the field), and nothing of the recipe is applied."""
    monkeypatch.setenv("LD_PRELOAD", SENTINEL)
    recipe = _recipe(tmp_path, env={"LD_PRELOAD": "/tmp/evil.so"}, **{name: True})
    with pytest.raises(ConfigError) as err:
        parse_recipe(["--config", str(recipe)])
    message = str(err.value)
    assert message.startswith(f"{name}: ") and f"--{name} true" in message and "\n" not in message, message
    assert os.environ["LD_PRELOAD"] == SENTINEL


def test_opt_ins_stay_out_of_the_resolved_recipe(tmp_path):
    """recipe.resolved.yaml is itself a recipe: it must neither carry the consent of one invocation nor be refused
    when run again."""
    recipe = _recipe(tmp_path)
    parsed = parse_recipe(["--config", str(recipe), "--allow_unsafe_env", "--allow_external_checkpoint"])
    resolved = resolved_recipe(*parsed)
    assert not set(CLI_ONLY) & set(resolved)


@pytest.mark.parametrize("argv, value", [
    ([], False), (["--allow_unsafe_env"], True), (["--allow_unsafe_env", "--seed", "1"], True),
    (["--allow_unsafe_env", "false"], False), (["--allow_unsafe_env=1"], True), (["--allow-unsafe-env", "yes"], True),
    (["--allow_unsafe_env", "true", "--allow_unsafe_env", "no"], False)])
def test_cli_flag_forms(argv, value):
    got, rest = pop_cli_flag([*argv, "--lr", "2"], "allow_unsafe_env")
    assert got is value and [a for a in rest if a not in ("--seed", "1")] == ["--lr", "2"]


def test_cli_flag_rejects_a_non_boolean():
    with pytest.raises(ConfigError, match="^--allow_unsafe_env: 'maybe' is not a boolean"):
        pop_cli_flag(["--allow_unsafe_env", "maybe"], "allow_unsafe_env")


def test_help_and_readme_say_a_recipe_is_code():
    assert "A recipe is code: run only trusted recipes" in DESCRIPTION
    assert "a recipe is code: run only trusted recipes" in (ROOT / "README.md").read_text().lower()


# --- resume_from_checkpoint ----------------------------------------------------------------------------------------

def _outside(tmp_path: Path) -> Path:
    return _checkpoint(tmp_path / "downloads" / "checkpoint-5")


@pytest.mark.parametrize("where", ["absolute", "dotdot", "symlink"])
def test_checkpoint_outside_output_dir_is_refused(tmp_path, where):
    """Refused by parse_recipe (before the recipe's modules or any weights load) and by check_resume (check_run);
    ``..`` and symlinks are resolved before the comparison."""
    outside = _outside(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    if where == "absolute":
        resume = str(outside)
    elif where == "dotdot":
        resume = str(out / ".." / "downloads" / "checkpoint-5")
    else:
        (out / "checkpoint-5").symlink_to(outside, target_is_directory=True)
        resume = str(out / "checkpoint-5")
    recipe = _recipe(tmp_path)
    with pytest.raises(ConfigError) as err:
        parse_recipe(["--config", str(recipe), "--resume_from_checkpoint", resume])
    message = str(err.value)
    assert message.startswith("resume_from_checkpoint: ") and "outside output_dir" in message, message
    assert "--allow_external_checkpoint true" in message.split("Fix:", 1)[1] and "\n" not in message, message
    with pytest.raises(ConfigError, match="^resume_from_checkpoint: .* outside output_dir"):
        checks.check_resume(str(out), resume)


def test_checkpoint_outside_named_by_the_recipe_is_refused(tmp_path):
    recipe = _recipe(tmp_path, resume_from_checkpoint=str(_outside(tmp_path)))
    with pytest.raises(ConfigError, match="^resume_from_checkpoint: .* outside output_dir"):
        parse_recipe(["--config", str(recipe)])


def test_checkpoint_outside_is_allowed_with_the_command_line_opt_in(tmp_path):
    outside = _outside(tmp_path)
    task, args, _ = parse_recipe(["--config", str(_recipe(tmp_path)), "--resume_from_checkpoint", str(outside),
                                  "--allow_external_checkpoint", "true"])
    assert task.allow_external_checkpoint
    checks.check_resume(args.output_dir, args.resume_from_checkpoint, task.allow_external_checkpoint)


@pytest.mark.parametrize("spelling", ["absolute", "relative"])
def test_checkpoint_inside_output_dir_is_accepted(tmp_path, monkeypatch, spelling):
    inside = _checkpoint(tmp_path / "out" / "checkpoint-3")
    monkeypatch.chdir(tmp_path)
    resume = str(inside) if spelling == "absolute" else "out/./checkpoint-3"
    output_dir = str(tmp_path / "out") if spelling == "absolute" else "out"
    task, args, _ = parse_recipe(["--config", str(_recipe(tmp_path)), "--output_dir", output_dir,
                                  "--resume_from_checkpoint", resume])
    assert not task.allow_external_checkpoint
    checks.check_resume(args.output_dir, args.resume_from_checkpoint, task.allow_external_checkpoint)


@pytest.mark.parametrize("resume", ["true", "latest", "auto"])
def test_latest_checkpoint_symlinked_outside_is_refused(tmp_path, resume):
    """``true``/``auto`` resume the checkpoint-N HF's get_last_checkpoint picks in output_dir: a symlink named like
    one (a newer step than the run's own) pointing outside was followed on main; it is refused as a path would be."""
    _checkpoint(tmp_path / "out" / "checkpoint-3")
    (tmp_path / "out" / "checkpoint-9").symlink_to(_outside(tmp_path), target_is_directory=True)
    with pytest.raises(ConfigError, match="^resume_from_checkpoint: .*checkpoint-9 lies outside output_dir"):
        parse_recipe(["--config", str(_recipe(tmp_path)), "--resume_from_checkpoint", resume])
    _, args, _ = parse_recipe(["--config", str(_recipe(tmp_path)), "--resume_from_checkpoint", resume,
                               "--allow_external_checkpoint", "true"])


@pytest.mark.parametrize("resume", ["true", "latest"])
def test_latest_checkpoint_of_output_dir_needs_no_opt_in(tmp_path, resume):
    _checkpoint(tmp_path / "out" / "checkpoint-3")
    _, args, _ = parse_recipe(["--config", str(_recipe(tmp_path)), "--resume_from_checkpoint", resume])
    checks.check_resume(args.output_dir, args.resume_from_checkpoint)


# --- overwrite_output_dir ------------------------------------------------------------------------------------------

def test_a_recipe_cannot_decide_to_delete_its_output_dir(tmp_path):
    """On main a recipe's ``overwrite_output_dir: true`` emptied any folder that held no run (a user's notes and
    keys with it); it is a command-line decision now, refused in the recipe before anything else runs."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="^overwrite_output_dir: a recipe cannot"):
        parse_recipe(["--config", str(_recipe(tmp_path, overwrite_output_dir=True))])
    task, _, _ = parse_recipe(["--config", str(_recipe(tmp_path)), "--overwrite_output_dir", "true"])
    assert task.overwrite_output_dir and (out / "notes.txt").read_text() == "mine"


def test_overwrite_deletes_only_what_a_run_writes(tmp_path):
    """A run's checkpoints, metrics, saved model and resolved recipe go; a user's files, a sub-folder and a symlink's
    target stay (the link itself is removed, never followed)."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    _checkpoint(out / "checkpoint-3")
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep")
    (out / "checkpoint-7").symlink_to(elsewhere, target_is_directory=True)
    for name in ("metrics.jsonl", "metrics.png", "recipe.resolved.yaml", "wandb_run_id", "model.safetensors",
                 "config.json", "tokenizer.json", "training_args.bin", "README.md", "notes.txt"):
        (out / name).write_text("x")
    (out / "sub").mkdir()
    (out / "sub" / "id_rsa").write_text("key")
    kept = checks.clear_output_dir(str(out))
    assert kept == ["notes.txt", "sub"] and sorted(p.name for p in out.iterdir()) == ["notes.txt", "sub"]
    assert (out / "sub" / "id_rsa").read_text() == "key" and (elsewhere / "precious").read_text() == "keep"
