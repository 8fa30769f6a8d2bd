"""The structure's figures stay where docs/design.md ("Structure, measured") says they are: the import graph of the
product (bench/import_graph.py, the same measure each time), the files that read the token budget, and the private
TRL / HF methods the trainer overrides. Each bound is today's figure: a change that makes one worse fails here and
must say why in docs/design.md, where the figure is updated with it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import import_graph  # noqa: E402  (bench/ is a script folder, not a package)

MAX_FLOORS = 10
MAX_BUDGET_READERS = 3  # files of trainer/ outside config/ and tools/ that read micro_batch_tokens
MAX_PRIVATE_OVERRIDES = 8


@pytest.fixture(scope="module")
def figures():
    return import_graph.measure()


def test_the_import_graph_has_no_circle_and_no_arrow_back_up(figures):
    assert figures.circles == [], figures.circles
    assert figures.arrows_back_up == 0


def test_the_import_graph_has_at_most_its_floors(figures):
    assert figures.floors <= MAX_FLOORS, " -> ".join(figures.longest_chain)


def test_the_measure_sees_a_circle_and_a_dynamic_import(tmp_path):
    """The measure itself: a loop of three files is one circle, each of its arrows counted back up, and a chain's
    floors are counted in files; a literal ``importlib.import_module`` is an arrow (as the registry's was)."""
    arrows = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "top": {"a"}}
    f = import_graph.measure(arrows)
    assert f.circles == [["a", "b", "c"]] and f.arrows_back_up == 3 and f.floors == 3
    assert f.longest_chain == ["top", "a", "d"]  # a circle stands on one floor, named by its first file
    path = tmp_path / "dynamic.py"
    path.write_text("import importlib\nimportlib.import_module('trainer.methods.catalog')\n")
    assert import_graph._literal_dynamic_imports(path) == {"trainer.methods.catalog"}


def _reads_budget(path: Path) -> bool:
    """``x.micro_batch_tokens`` or ``getattr(x, "micro_batch_tokens", ...)``."""
    tree = ast.parse(path.read_text())
    return any((isinstance(n, ast.Attribute) and n.attr == "micro_batch_tokens") or (
        isinstance(n, ast.Call) and getattr(n.func, "id", None) == "getattr" and len(n.args) >= 2
        and isinstance(n.args[1], ast.Constant) and n.args[1].value == "micro_batch_tokens") for n in ast.walk(tree))


def test_few_files_read_the_token_budget():
    readers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "trainer").rglob("*.py")
                     if not p.is_relative_to(ROOT / "trainer" / "config") and not p.is_relative_to(
                         ROOT / "trainer" / "tools") and _reads_budget(p))
    assert len(readers) <= MAX_BUDGET_READERS, readers


def test_few_private_overrides_of_trl():
    from trainer.grpo_trainer import OVERRIDES

    private = [name for name in OVERRIDES if name.startswith("_") and not name.startswith("__")]
    assert len(private) <= MAX_PRIVATE_OVERRIDES, private
