"""The TRL contact module (trainer/trl_contact.py) is the only place in ``trainer/`` touching library privates.

The scan reads the source with ``ast`` (nothing is imported). It flags, outside trainer/trl_contact.py:
  * ``x._name`` on anything but ``self`` / ``cls`` / ``super()`` -- every private of an object we did not write
    (a trainer reached as an argument, an optimizer, a client, a config), and ``getattr/setattr/hasattr(x, "_name")``;
  * ``self._name`` inside a class deriving from a library class, where ``_name`` is one of that library's own
    private names (read from TRL's and transformers' trainer sources) and the class does not override it
    (``super()._name`` calls and ``def _name`` overrides are the subclass's contract with TRL and are allowed).
Our own private attributes reached from another module are named one by one in :data:`OWN_PRIVATES`.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CONTACT = ROOT / "trainer" / "trl_contact.py"
# Our own private attributes reached from another of our modules, each with its owner. Keyed by the access alone
# (not the file) so that moving a module keeps its entry.
OWN_PRIVATES = {
    "getattr(self, '_staging')",  # WinnowGRPOTrainer's own flag
    # argparse's internals (stdlib, not a training library): the recipe parser's option groups
    "argparse._ArgumentGroup",
    "self._optionals._group_actions",
    "group._group_actions",
}
# Library classes our classes derive from, whose private names a subclass must not reach for directly.
# Libraries whose private module-level names (``from trl.x import _name``) only the contact module may import.
LIBRARIES = {"trl", "transformers", "accelerate", "deepspeed", "vllm", "peft", "torch"}
LIBRARY_BASES = {"GRPOTrainer", "Trainer", "VLLMGeneration", "TrainerCallback"}


@functools.lru_cache(maxsize=1)
def _library_private_names() -> frozenset[str]:
    """Private names TRL's GRPOTrainer and transformers' Trainer define (attributes they assign, methods)."""
    names: set[str] = set()
    for module in ("trl.trainer.grpo_trainer", "transformers.trainer", "trl.generation.vllm_generation"):
        spec = importlib.util.find_spec(module)
        tree = ast.parse(Path(spec.origin).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef):
                names.add(node.name)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


def private_accesses(path: Path, library_privates: set[str]) -> list[tuple[int, str]]:
    """(line, access) for every private access in ``path`` that only the contact module may make."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    library_classes = [
        c for c in ast.walk(tree)
        if isinstance(c, ast.ClassDef) and any(ast.unparse(b).split(".")[-1] in LIBRARY_BASES for b in c.bases)
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = ast.unparse(node.value)
            if base in ("self", "cls") or base.startswith("super("):
                continue
            found.append((node.lineno, f"{base}.{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and node.args[1].value.startswith("_") and not node.args[1].value.startswith("__")):
            found.append((node.lineno, f"{node.func.id}({ast.unparse(node.args[0])}, {node.args[1].value!r})"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in LIBRARIES:
            found += [(node.lineno, f"from {node.module} import {a.name}") for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    for cls in library_classes:
        overridden = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in ast.walk(cls):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr in library_privates and node.attr not in overridden):
                found.append((node.lineno, f"self.{node.attr} (a {cls.name} base-class private)"))
    return found


def violations(root: Path = ROOT / "trainer") -> list[str]:
    """``file:line access`` for every private access outside the contact module and the allow-list."""
    library_privates = _library_private_names()
    bad = []
    for path in sorted(root.rglob("*.py")):
        if path == CONTACT:
            continue
        rel = str(path.relative_to(root.parent))
        for line, access in private_accesses(path, library_privates):
            if access not in OWN_PRIVATES:
                bad.append(f"{rel}:{line} {access}")
    return sorted(set(bad))


def test_only_the_contact_module_touches_library_privates():
    bad = violations()
    assert not bad, "private accesses outside trainer/trl_contact.py (add a named function there):\n" + "\n".join(bad)


def test_the_scan_catches_a_private_access_elsewhere(tmp_path):
    """The scan fails on the three shapes it exists for (so the test above can fail)."""
    pkg = tmp_path / "trainer"
    pkg.mkdir()
    (pkg / "sneaky.py").write_text(
        "from trl import GRPOTrainer\n"
        "def log(trainer):\n"
        "    trainer._metrics['train']['x'].append(1.0)\n"
        "    return getattr(trainer.optimizer, '_is_overflow')\n"
        "from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE\n"
        "class Sub(GRPOTrainer):\n"
        "    def step(self):\n"
        "        self._step += 1\n"
        "    def _prepare_inputs(self, batch):\n"
        "        return super()._prepare_inputs(batch)\n"
    )
    found = [v.split(" ", 1)[1] for v in violations(root=pkg)]
    assert "trainer._metrics" in found
    assert "getattr(trainer.optimizer, '_is_overflow')" in found
    assert "self._step (a Sub base-class private)" in found
    assert "from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE" in found
    assert not any("_prepare_inputs" in v for v in found), "a super() override is the subclass's contract"


def test_allow_list_has_no_stale_entries():
    """Every allow-listed access still exists (an entry for removed code would hide a new one)."""
    library_privates = _library_private_names()
    present = {access for p in (ROOT / "trainer").rglob("*.py") for _, access in private_accesses(p, library_privates)}
    assert OWN_PRIVATES <= present, sorted(OWN_PRIVATES - present)


def test_version_check_names_package_installed_version_and_range():
    from trainer import trl_contact

    with pytest.raises(trl_contact.UntestedVersionError) as err:
        trl_contact.check_versions({"trl": ">=1.16,<1.17"}, {"trl": "1.17.0"})
    message = str(err.value)
    assert "\n" not in message
    assert "trl 1.17.0 is installed" in message and "trl>=1.16,<1.17" in message
    with pytest.warns(RuntimeWarning, match=r"accelerate 2\.0\.0 is installed.*accelerate>=1\.10,<2"):
        trl_contact.check_versions({"accelerate": ">=1.10,<2"}, {"accelerate": "2.0.0"})
    # inside the ranges, or not installed: silent
    trl_contact.check_versions({"trl": ">=1.16,<1.17", "deepspeed": ">=0.17,<0.20"},
                               {"trl": "1.16.0", "deepspeed": None, "vllm": None})


def test_tested_ranges_come_from_pyproject():
    from trainer import trl_contact

    ranges = trl_contact.tested_ranges()
    for name in ("trl", "accelerate", "deepspeed", "vllm"):
        assert ranges.get(name), f"pyproject.toml declares no range for {name}"
    import trl

    assert trl_contact.version_problem("trl", trl.__version__, ranges["trl"]) is None


def test_clipped_surrogate_is_trls_expression_bit_for_bit():
    """trainer/algorithms/losses.py's surrogate equals TRL 1.16's lines (grpo_trainer.py ``_compute_loss``:
    ``-torch.min(coef_1 * advantages, coef_2 * advantages)``) in value and gradient, off-policy ratios included."""
    from trainer.algorithms.losses import clipped_surrogate

    g = torch.Generator().manual_seed(0)
    logp = (torch.randn(4, 7, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    old = logp.detach() + torch.randn(4, 7, generator=g, dtype=torch.float64) * 0.4  # ratios well outside clip
    A = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 7)
    ours = clipped_surrogate(torch.exp(logp - old), A, 0.2, 0.28)
    (g_ours,) = torch.autograd.grad(ours.sum(), logp)
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.28)
    trl = -torch.min(coef_1 * A, coef_2 * A)
    (g_trl,) = torch.autograd.grad(trl.sum(), logp)
    assert torch.equal(ours, trl) and torch.equal(g_ours, g_trl)
    clipped = (coef_1 < 0.8) | (coef_1 > 1.28)
    assert clipped.any() and (~clipped).any(), "the case must exercise both branches"
