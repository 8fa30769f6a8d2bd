"""Every import inside a function body says why it is not at module level, read from the source with ``ast``.

An import belongs at the top of its module, unless deferring it does something; it then carries one of these
reasons, as a comment on the import's line(s) or in the comment lines just above it (a comment above one import of
a run of consecutive imports covers the run):

    # heavy: ...     a slow import (torch, transformers, TRL, vLLM, matplotlib, ...) kept off a path that starts cheap
    # cycle: ...     a module-level import would close an import cycle
    # optional: ...  a dependency that may be absent (an extra, a file of the checkout)
    # lazy: ...      needed only somewhere else at run time (a worker subprocess, a path set up at run time)

Nothing is imported: the scan reads ``trainer/``, ``rewards/``, ``envs/`` and ``launch/`` with ``ast`` and
``tokenize``.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("trainer", "rewards", "envs", "launch")
REASONS = ("heavy", "cycle", "optional", "lazy")
# Files left out of the scan, each with why (relative to the repository root).
ALLOWED: dict[str, str] = {}
REASON = re.compile(rf"#\s*({'|'.join(REASONS)}):\s*\S")
# A comment that looks like a reason ("word: text") but names none; tool directives are not reasons.
PREFIX = re.compile(r"#\s*([A-Za-z][\w-]*):")
DIRECTIVES = {"noqa", "type", "pragma", "fmt", "isort", "ruff"}


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """Comment text by line, and the lines holding nothing but a comment."""
    comments: dict[int, str] = {}
    alone: set[int] = set()
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    alone = {line for line in comments if line not in code_lines}
    return comments, alone


def _block_above(line: int, comments: dict[int, str], alone: set[int]) -> list[str]:
    """The comment-only lines directly above ``line`` (no blank line between)."""
    block = []
    line -= 1
    while line in alone:
        block.append(comments[line])
        line -= 1
    return block


def _runs(tree: ast.AST) -> list[list[ast.Import | ast.ImportFrom]]:
    """Runs of consecutive import statements inside function bodies (any depth of if/try/with/for within them)."""
    runs: list[list[ast.Import | ast.ImportFrom]] = []

    def visit_body(body: list[ast.stmt], in_function: bool) -> None:
        run: list[ast.Import | ast.ImportFrom] = []
        for node in body:
            if in_function and isinstance(node, (ast.Import, ast.ImportFrom)):
                run.append(node)
                continue
            if run:
                runs.append(run)
                run = []
            visit(node, in_function)
        if run:
            runs.append(run)

    def visit(node: ast.AST, in_function: bool) -> None:
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                visit_body(value, inner)
            elif isinstance(value, list):
                for child in value:  # except handlers, match cases
                    visit(child, inner)

    visit(tree, False)
    return runs


def problems(path: Path) -> list[str]:
    """``line: what is wrong`` for every function-level import of ``path`` without a known reason."""
    source = path.read_text()
    comments, alone = _comments(source)
    found = []
    for run in _runs(ast.parse(source, filename=str(path))):
        above = [c for node in run for c in _block_above(node.lineno, comments, alone)]
        for node in run:
            own = [comments[line] for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                   if line in comments]
            candidates = own + above
            if any(REASON.search(c) for c in candidates):
                continue
            prefixes = {m.group(1) for c in candidates for m in PREFIX.finditer(c)} - DIRECTIVES
            unknown, empty = sorted(prefixes - set(REASONS)), sorted(prefixes & set(REASONS))
            if unknown:
                what = f"unknown reason {', '.join(unknown)} (use {', '.join(r + ':' for r in REASONS)})"
            elif empty:
                what = f"reason {', '.join(empty)}: says nothing after the colon"
            else:
                what = "function-level import without a reason comment"
            found.append(f"{node.lineno}: {ast.unparse(node)}  -- {what}")
    return found


def violations(root: Path = ROOT, allowed: dict[str, str] = ALLOWED) -> list[str]:
    """``file:line: import -- problem`` over the scanned folders, the allow-listed files left out."""
    bad = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in allowed:
                continue
            bad += [f"{rel}:{p}" for p in problems(path)]
    return bad


def test_every_function_level_import_has_a_reason():
    bad = violations()
    assert not bad, (
        "function-level imports need a reason comment (# heavy: / # cycle: / # optional: / # lazy: ...), else move "
        "them to the top of the module:\n" + "\n".join(bad)
    )


def test_the_scan_catches_a_missing_or_unknown_reason(tmp_path):
    """The scan fails on an import without a reason and on an unknown reason (so the test above can fail)."""
    pkg = tmp_path / "trainer"
    pkg.mkdir()
    (pkg / "sample.py").write_text(
        "import os\n"
        "def bare():\n"
        "    import json\n"
        "def unknown():\n"
        "    import csv  # slow: it is not\n"
        "def empty():\n"
        "    import csv  # heavy:\n"
        "def trailing():\n"
        "    import torch  # heavy: torch\n"
        "def above():\n"
        "    if True:\n"
        "        # optional: the demo extra\n"
        "        # (a second line)\n"
        "        import matplotlib\n"
        "\n"
        "        from matplotlib import pyplot\n"
        "        x = 1\n"
        "        import numpy\n"
        "def split():\n"
        "    # cycle: x imports us\n"
        "\n"
        "    import x\n"
        "class C:\n"
        "    import re\n"
        "    def method(self):\n"
        "        from y import (  # lazy: only in the worker\n"
        "            z,\n"
        "        )\n"
        "        from y import (\n"
        "            w,  # noqa: F401\n"
        "        )\n"
    )
    found = violations(root=tmp_path, allowed={})
    lines = {int(v.split(":")[1]): v for v in found}
    assert sorted(lines) == [3, 5, 7, 18, 22, 29], found
    assert "unknown reason slow" in lines[5]
    assert "says nothing" in lines[7]
    assert "without a reason" in lines[3] and "without a reason" in lines[29]
    assert "numpy" in lines[18], "a statement ends the run a comment covers"
    assert "import x" in lines[22], "a blank line parts a comment from the import"
    assert violations(root=tmp_path, allowed={"trainer/sample.py": "why"}) == []


def test_allow_list_has_no_stale_entries():
    """Every allow-listed file still has a function-level import the scan would report (else drop its entry)."""
    stale = [rel for rel in ALLOWED if not (ROOT / rel).is_file() or not problems(ROOT / rel)]
    assert not stale, stale
