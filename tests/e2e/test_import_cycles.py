"""No import cycles among our modules, and every module imports on its own.

Two checks: (1) the graph of module-level imports between first-party modules, read with ``ast``, has no cycle
(an import deferred into a function cannot form one at import time); (2) one subprocess imports every module of
``trainer``, ``rewards`` and ``envs`` as if first, dropping every first-party module from ``sys.modules`` before
each, so a module that only works after some other module happened to be imported fails here.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import import_graph  # noqa: E402  (bench/ is a script folder, not a package)

PACKAGES = ("trainer", "rewards", "envs")


def all_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the first-party packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def module_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """First-party modules ``name`` imports while it is being imported (module body, not function bodies).

    A target's parent packages run first, so they count too -- except the importer's own ancestors, which are
    already being imported when it runs."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    own_ancestors = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")))}
    targets: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)  # the annotations-only branch never runs
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit([n for n in getattr(node, field, []) if isinstance(n, ast.stmt | ast.excepthandler)])

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    edges = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            candidate = ".".join(parts[:i])
            if candidate in known and candidate != name and candidate not in own_ancestors:
                edges.add(candidate)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, each sorted (bench/import_graph.py's, the measure
    of the whole graph, function-level imports included, that tests/contracts/test_structure_figures.py holds)."""
    return import_graph.circles(graph)


def test_cycle_finder_on_a_hand_made_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_modules():
    modules = all_modules()
    known = set(modules)
    graph = {name: module_level_imports(name, path, known) for name, path in modules.items()}
    assert graph["trainer.methods.catalog"] >= {"trainer.methods.snr"}, "the graph misses a plain package import"
    found = cycles(graph)
    assert not found, "import cycles (module-level imports):\n" + "\n".join(" <-> ".join(c) for c in found)


SCRIPT = r"""
import importlib, json, sys, traceback
names, first_party = json.loads(sys.argv[1]), tuple(json.loads(sys.argv[2]))
failures = {}
for name in names:
    for loaded in [m for m in sys.modules if m.split(".")[0] in first_party]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException:
        failures[name] = traceback.format_exc(limit=3)
print(json.dumps(failures))
"""


def test_every_module_imports_first():
    names = sorted(all_modules())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(names), json.dumps(PACKAGES)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failures, "modules that fail to import on their own:\n" + "\n".join(
        f"{name}:\n{tb}" for name, tb in failures.items())
