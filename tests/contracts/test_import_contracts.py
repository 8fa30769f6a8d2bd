"""Import contracts between the packages, read from the source with ``ast`` (nothing is imported).

The layering the design rests on (docs/design.md): the pure algorithms import no training framework, the reward
functions and environments import nothing of the trainer, the method adapters never reach for the trainer class,
the stage registry imports no method, and the config parts share ``ConfigError`` without importing each other.
Every import statement counts, function-level ones included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("trl", "accelerate", "transformers", "deepspeed", "vllm", "peft")


def module_name(path: Path) -> str:
    """Dotted module name of a repository file (``trainer/methods/snr.py`` -> ``trainer.methods.snr``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``; ``from x import y`` yields ``x`` and ``x.y``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            out += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return out


def files(*globs: str) -> list[Path]:
    """Repository Python files matching the globs (relative to the root)."""
    found = sorted({p for g in globs for p in ROOT.glob(g)})
    assert found, f"no files match {globs}: the contract would check nothing"
    return found


def violations(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    """``file:line imports module`` for every import of a forbidden module (or a submodule of one)."""
    bad = []
    for path in paths:
        for line, name in imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return sorted(set(bad))


CONTRACTS = {
    "trainer/algorithms is pure: no training framework": (files("trainer/algorithms/*.py"), FRAMEWORKS),
    "rewards/ imports nothing of trainer/": (files("rewards/**/*.py"), ("trainer",)),
    "envs/ imports nothing of trainer/": (files("envs/**/*.py"), ("trainer",)),
    "trainer/methods never imports the trainer class": (files("trainer/methods/**/*.py"), ("trainer.grpo_trainer",)),
    # trainer/build.py builds the trainer from a parsed recipe (trainer/recipe.py): the composition root, beside the
    # trainer class and above every package of trainer/ (the config among them).
    "no package of trainer/ imports the trainer class": (files("trainer/*/**/*.py"), ("trainer.grpo_trainer",)),
    "trainer/algorithms imports nothing else of trainer/": (
        files("trainer/algorithms/*.py"),
        tuple(f"trainer.{p.name}" for p in (ROOT / "trainer").iterdir() if p.is_dir() and p.name not in
              ("algorithms", "__pycache__")) + ("trainer.grpo_trainer",),
    ),
    "the stage registry imports no method": (files("trainer/pipeline/stages.py"), ("trainer.methods",)),
    "the config parts do not import the config": (
        files("trainer/config/errors.py", "trainer/config/server.py", "trainer/config/env.py",
              "trainer/methods/*/fields.py"),
        ("trainer.config.core",),
    ),
}


@pytest.mark.parametrize("contract", sorted(CONTRACTS))
def test_import_contract(contract):
    paths, forbidden = CONTRACTS[contract]
    bad = violations(paths, forbidden)
    assert not bad, f"{contract}:\n" + "\n".join(bad)


def test_resolver_reads_relative_and_nested_imports(tmp_path):
    """The checker itself: relative imports resolve against the file's package, function-level imports count."""
    pkg = tmp_path / "trainer" / "methods"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text("from ..grpo_trainer import T\n\ndef f():\n    import trl.trainer\n    from . import snr\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        names = {name for _, name in imported_modules(src)}
        assert {"trainer.grpo_trainer", "trainer.grpo_trainer.T", "trl.trainer", "trainer.methods.snr"} <= names
        assert violations([src], ("trainer.grpo_trainer",)) == [
            "trainer/methods/x.py:1 imports trainer.grpo_trainer",
            "trainer/methods/x.py:1 imports trainer.grpo_trainer.T",
        ]
        assert violations([src], FRAMEWORKS) == ["trainer/methods/x.py:4 imports trl.trainer"]
    finally:
        ROOT = saved
