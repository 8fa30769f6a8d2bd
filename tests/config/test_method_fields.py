"""Config by method: every method's knobs live in its own folder (trainer/methods/<method>/fields.py, a mixin of
WinnowConfig), the config core neither declares nor reads them, and ``--help`` shows each method's knobs under a
section of its own."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from trainer.config.core import WinnowConfig
from trainer.recipe import recipe_parser

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
METHODS = ROOT / "trainer" / "methods"
MIXINS = [c for c in WinnowConfig.__mro__ if c.__module__.startswith("trainer.methods.")]


def method_folders() -> list[Path]:
    return sorted(p for p in METHODS.iterdir() if p.is_dir() and p.name != "__pycache__")


def test_every_method_folder_has_its_fields_and_a_docstring_naming_its_docs_page():
    folders = method_folders()
    assert len(folders) >= 8
    for folder in folders:
        init = folder / "__init__.py"
        assert init.exists(), f"{folder.name}: no __init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{folder.name}/__init__.py has no docstring"
        pages = re.findall(r"docs/[\w-]+\.md", doc)
        assert pages, f"{folder.name}/__init__.py names no docs page"
        for page in pages:
            assert (ROOT / page).exists(), f"{folder.name} names {page}, which does not exist"
        assert (folder / "fields.py").exists(), f"{folder.name}: no fields.py"
        assert any(c.__module__ == f"trainer.methods.{folder.name}.fields" for c in MIXINS), (
            f"trainer/methods/{folder.name}/fields.py declares no mixin of WinnowConfig"
        )


def test_the_config_core_declares_and_reads_no_method_field():
    method_fields = {f.name for c in MIXINS for f in dataclasses.fields(c)}
    assert {"dropout_selector", "snr_metric", "teacher_model_name_or_path", "collapse_every",
            "max_num_gen_batches", "clip_cov_ratio", "reward_variance_stop_steps", "low_success_stop_steps"} <= (
        method_fields)
    tree = ast.parse((ROOT / "trainer" / "config" / "core.py").read_text())
    declared = {node.target.id for node in ast.walk(tree)
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not declared & method_fields, f"declared in config/core.py: {sorted(declared & method_fields)}"
    assert not read & method_fields, f"read in config/core.py: {sorted(read & method_fields)}"


def test_help_gives_every_field_a_section():
    """No field falls into argparse's untitled 'other options' group; each method mixin has its own section."""
    text = recipe_parser().format_help()
    assert "other options:" not in text
    sections = [line for line in text.splitlines() if line.startswith("method: ")]
    assert len(sections) == len(MIXINS)
    assert any("GRPODropout" in s for s in sections) and any("SNR" in s for s in sections)
