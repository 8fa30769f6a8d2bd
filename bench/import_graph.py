"""The product's import graph, measured: floors, arrows, arrows back up, and import circles.

How it is measured (the definitions of issue "One round per generation batch", so the figures stay comparable):

- nodes: the product's files (``trainer/``, ``rewards/``, ``envs/``, ``launch/``, ``bench/``); an ``__init__.py``
  that only re-exports (no function or class of its own) stands for its package, so an import of the package and of
  one of its modules are arrows to two nodes only when the package file does something itself;
- arrows: an import of one file by another, at module level or inside a function (grimp, import-linter's graph
  library, reads both; an ``importlib.import_module("...")`` of a literal name is added by hand below, since grimp
  sees only ``import`` statements and that is exactly how a registry used to slip past the contracts);
- circle: files that import each other in a loop (a strongly connected component of more than one file);
- floors: the longest chain of arrows, counted in files (a file that imports nothing of the product is on floor 1,
  a file's floor is one more than the highest floor it imports); inside a circle the chain is taken over the circle's
  condensation, every file of a circle on one floor;
- arrows back up: arrows from a file to one on a higher or the same floor -- which, once floors are longest chains,
  happens only inside a circle (each arrow of a circle is counted).

Run: ``python bench/import_graph.py`` (a table; ``--json`` for the numbers). tests/contracts/test_import_graph.py
holds the product to the targets of docs/design.md.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("trainer", "rewards", "envs")  # importable packages; launch/ and bench/ are script folders
SCRIPT_DIRS = ("launch", "bench")


@dataclass
class GraphFigures:
    """What :func:`measure` returns."""

    files: int
    arrows: int
    floors: int
    arrows_back_up: int
    circles: list[list[str]]  # each circle's files, sorted
    longest_chain: list[str]  # one chain of `floors` files, top first

    def as_dict(self) -> dict:
        """The figures as plain JSON values."""
        return dict(files=self.files, arrows=self.arrows, floors=self.floors, arrows_back_up=self.arrows_back_up,
                    circle_sizes=[len(c) for c in self.circles], circles=self.circles,
                    longest_chain=self.longest_chain)


def _module_file(module: str) -> Path | None:
    base = ROOT / Path(*module.split("."))
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    return None


def _only_reexports(path: Path) -> bool:
    """Whether a package's ``__init__.py`` defines nothing of its own: a docstring, imports, ``__all__`` and the
    table and PEP 562 ``__getattr__`` of lazy re-exports only (an object built there, such as a method's ``METHOD``,
    makes it a file of its own)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__"):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if targets and all(isinstance(t, ast.Name) and t.id in ("__all__", "_EXPORTS") for t in targets):
            continue
        return False
    return True


def _literal_dynamic_imports(path: Path) -> set[str]:
    """Module names passed as a string literal to ``importlib.import_module`` in ``path``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and not node.args[0].value.startswith(".")):
            out.add(node.args[0].value)
    return out


def _script_modules() -> dict[str, Path]:
    """launch/ and bench/ scripts as pseudo-modules ``launch.<name>`` (they are run, not imported)."""
    out = {}
    for folder in SCRIPT_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            out[".".join(rel.parts)] = path
    return out


def _imports_of_script(path: Path, known: set[str]) -> set[str]:
    """The product modules a script imports (ast, every import statement)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out | (_literal_dynamic_imports(path) & known)


def build_graph() -> dict[str, set[str]]:
    """Arrows between the product's files: ``{importer: {imported, ...}}`` over nodes named by module."""
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    modules = set(graph.modules)
    stands_for: dict[str, str] = {}  # a re-export-only package's modules stand for themselves, the package not
    for module in modules:
        path = _module_file(module)
        if path is None:
            continue
        stands_for[module] = module
    forwarding = {m for m in modules if (p := _module_file(m)) is not None and p.name == "__init__.py"
                  and _only_reexports(p)}
    arrows: dict[str, set[str]] = {m: set() for m in stands_for if m not in forwarding}
    for importer in arrows:
        imported = set(graph.find_modules_directly_imported_by(importer))
        imported |= _literal_dynamic_imports(_module_file(importer)) & modules
        for target in imported:
            if target in forwarding:
                continue  # importing a package that only re-exports: its real files are imported directly too
            if target != importer and target in arrows:
                arrows[importer].add(target)
    scripts = _script_modules()
    for name, path in scripts.items():
        arrows[name] = {t for t in _imports_of_script(path, set(arrows) | modules)
                        if t in arrows and t not in forwarding and t != name}
    return arrows


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(arrows):
        if root in index:
            continue
        work = [(root, iter(sorted(arrows[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(arrows[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return sorted(out, key=lambda c: (-len(c), c))


def measure(arrows: dict[str, set[str]] | None = None) -> GraphFigures:
    """The figures of the product's import graph (or of ``arrows``, a graph given as ``{importer: imported}``)."""
    arrows = build_graph() if arrows is None else arrows
    found = circles(arrows)
    component = {node: node for node in arrows}
    for circle in found:
        for node in circle:
            component[node] = circle[0]
    down: dict[str, set[str]] = {}
    for src, targets in arrows.items():
        down.setdefault(component[src], set()).update(component[t] for t in targets if component[t] != component[src])
    floor: dict[str, int] = {}
    below: dict[str, str | None] = {}

    def floor_of(node: str) -> int:
        todo = [node]
        while todo:
            n = todo[-1]
            if n in floor:
                todo.pop()
                continue
            pending = [c for c in down.get(n, ()) if c not in floor]
            if pending:
                todo.extend(pending)
                continue
            best = max(down.get(n, ()), key=lambda c: (floor[c], c), default=None)
            floor[n] = 1 + (floor[best] if best is not None else 0)
            below[n] = best
            todo.pop()
        return floor[node]

    for node in arrows:
        floor_of(component[node])
    top = max(floor, key=lambda n: (floor[n], n))
    chain, node = [], top
    while node is not None:
        chain.append(node)
        node = below[node]
    back = sum(1 for src, targets in arrows.items() for t in targets
               if floor[component[t]] >= floor[component[src]])
    return GraphFigures(files=len(arrows), arrows=sum(len(t) for t in arrows.values()), floors=floor[top],
                        arrows_back_up=back, circles=found, longest_chain=chain)


def main(argv: list[str] | None = None) -> int:
    """Print the figures (a table, or JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    figures = measure()
    if parser.parse_args(argv).json:
        print(json.dumps(figures.as_dict(), indent=2))
        return 0
    print(f"files {figures.files}  arrows {figures.arrows}  floors {figures.floors}  "
          f"arrows back up {figures.arrows_back_up}  circles {[len(c) for c in figures.circles]}")
    print("longest chain: " + " -> ".join(figures.longest_chain))
    for circle in figures.circles:
        print(f"circle of {len(circle)}: " + ", ".join(circle))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
