"""No runtime patches: winnow passes what it changes as arguments, not by rewriting TRL's, transformers' or
accelerate's objects (issue "own the two seams", item 3).

Read from the source with ``ast``. Two kinds of store count:

- an attribute store (``x.a = ...``, ``x.a += ...``, ``del x.a``, ``setattr(x, ...)``) on anything but ``self``,
  anywhere in ``trainer/``: the object may be a library's. Each one that exists is listed below, with why it is
  there; a new one fails until it is either removed or listed with its reason.
- ``self.a = ...`` inside a winnow class that subclasses a library class, where ``a`` is an attribute or method
  of that library class (found from the library's installed source): the subclass rewriting the library's own
  state (``self.beta = beta * scale`` was one). Listed the same way.

The loss seam has none left (trainer/loss/: the row scale, the entropy bonus's weight and the metric reduction are
arguments). What remains below and belongs to a library is stated as such, each with the reason no argument,
callback or public API does it in TRL 1.16 / transformers / accelerate; removing them is the rest of that item.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = ("trl", "transformers", "accelerate", "deepspeed", "torch", "peft", "vllm")

WINNOW_OWN = "winnow's own object"
# (file, store as written) -> reason. "library:" reasons are the runtime patches that remain.
ALLOWED: dict[tuple[str, str], str] = {
    # winnow's own objects and configs built before any trainer exists
    ("trainer/cli/train.py", "args.run_name"): "the run's config, filled from the recipe folder before the trainer",
    ("trainer/config/core.py", "setattr(converted, f.name)"): "a WinnowConfig built from a GRPOConfig's fields",
    ("trainer/config/core.py", "setattr(self, f.name)"): "WinnowConfig's own field normalisation",
    ("trainer/recipe.py", "task.recipe_dir"): WINNOW_OWN + " (TaskArguments)",
    ("trainer/recipe.py", "task.dataset_kwargs"): WINNOW_OWN + " (TaskArguments)",
    ("trainer/recipe.py", "setattr(task, name)"): WINNOW_OWN + " (TaskArguments)",
    ("trainer/recipe.py", "args.resume_from_checkpoint"): "the run's config, before the trainer is built",
    ("trainer/build.py", "args.model_init_kwargs"): "the run's config, before the trainer is built",
    ("trainer/recipe.py", "args.chat_template_kwargs"): "the run's config, before the trainer is built",
    ("trainer/build.py", "args.teacher_model_name_or_path"): "the run's config, before the trainer is built",
    ("trainer/build.py", "trainer.card_facts"): "WinnowGRPOTrainer's own model-card facts",
    ("trainer/recipe.py", "action.help"): "argparse help text of winnow's own parser",
    ("trainer/config/recipe_parser.py", "self._optionals.title"): "winnow's ArgumentParser subclass's group title",
    ("trainer/data/envs.py", "load.__name__"): WINNOW_OWN + " (a loader function it defines)",
    ("trainer/data/envs.py", "load.__doc__"): WINNOW_OWN + " (a loader function it defines)",
    ("trainer/grpo_trainer.py", "args.weight_sync_dir"): "the run's config: a default under output_dir, set before "
                                                          "TRL's __init__ reads it",
    ("trainer/grpo_trainer.py", "self._timer.prepare_seconds"): WINNOW_OWN + " (PhaseTimer)",
    ("trainer/methods/dynamic_sampling/hook.py", "t.global_rewards_per_func"): "WinnowGRPOTrainer's own attribute "
                                                                          "(the assembled batch's rewards)",
    ("trainer/server/overlap.py", "self._stats.sync_wait_s"): WINNOW_OWN + " (OverlapStats)",
    ("trainer/server/overlap.py", "self._stats.generation_wait_s"): WINNOW_OWN + " (OverlapStats)",
    ("trainer/server/overlap.py", "self._stats.train_wait_s"): WINNOW_OWN + " (OverlapStats)",
    ("trainer/pipeline/stages.py", "batch.estimate_advantages"): WINNOW_OWN + " (RolloutBatch)",
    ("trainer/pipeline/stages.py", "batch.keep"): WINNOW_OWN + " (RolloutBatch)",
    ("trainer/pipeline/stages.py", "batch.advantages"): WINNOW_OWN + " (RolloutBatch)",
    ("trainer/rollout/multi_turn.py", "row.truncated"): WINNOW_OWN + " (an episode row)",
    ("trainer/guards/stopping.py", "control.should_training_stop"): "transformers' TrainerControl: the documented "
                                                                     "way a callback stops training",
    ("trainer/guards/stopping.py", "control.should_save"): "transformers' TrainerControl: the documented way a "
                                                           "callback asks for a save",
    ("trainer/rollout/multi_turn.py", "config.max_new_tokens"): "a GenerationConfig copy winnow builds per call",
    ("trainer/rollout/multi_turn.py", "config.temperature"): "a GenerationConfig copy winnow builds per call",
    ("trainer/rollout/multi_turn.py", "config.eos_token_id"): "a GenerationConfig copy winnow builds per call",
    ("trainer/tools/assets.py", "backend.normalizer"): "a tokenizer winnow builds at install time",
    ("trainer/tools/assets.py", "backend.post_processor"): "a tokenizer winnow builds at install time",
    ("trainer/tools/assets.py", "backend.decoder"): "a tokenizer winnow builds at install time",
    ("trainer/tools/assets.py", "config.quantization_config"): "a stand-in model's config winnow builds at install "
                                                               "time",
    ("trainer/tools/assets.py", "model.generation_config"): "a stand-in model winnow builds at install time",
    ("trainer/tools/assets.py", "model.generation_config.eos_token_id"): "a stand-in model winnow builds at install "
                                                                         "time",
    ("trainer/tools/assets.py", "model.generation_config.pad_token_id"): "a stand-in model winnow builds at install "
                                                                         "time",
    ("trainer/server/launcher.py", "args.tensor_parallel_size"): "the launcher's own argparse namespace",
    ("trainer/server/client.py", "copy.__class__"): "a copy winnow makes of an exception, to name the endpoint",
    ("trainer/server/client.py", "probe.backoff_jitter"): "a urllib3 Retry winnow creates",
    # library state and methods: the runtime patches that remain, and why
    ("trainer/grpo_trainer.py", "self.state.best_model_checkpoint"): "library: transformers' TrainerState names the "
                                                                      "staging path; the checkpoint is published "
                                                                      "under another by an atomic rename",
    ("trainer/guards/step_skip.py", "optimizer.step"): "library: under DeepSpeed the ZeRO optimizer steps inside "
                                                       "backward, with no skip argument, and checks bf16 gradients "
                                                       "for no overflow (an empty or non-finite step)",
    ("trainer/guards/step_skip.py", "optimizer.overflow"): "library: DeepSpeed ZeRO's own skip flag for a step",
    ("trainer/server/weight_sync.py", "client_module.is_vllm_available"): "library: TRL's VLLMClient refuses to "
                                                                          "exist without vLLM importable, which "
                                                                          "HTTP generation does not need",
    ("trainer/trl_contact.py", "grpo_module.VLLMGeneration"): "library: TRL builds its generation backend by name in "
                                                              "__init__, with no factory argument",
}


def _store_targets(tree: ast.AST):
    """(line, text) of every attribute store, delete and setattr/delattr in ``tree``."""
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    yield node.lineno, sub
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
                and len(node.args) >= 2):
            yield node.lineno, f"setattr({ast.unparse(node.args[0])}, {ast.unparse(node.args[1])})"


def foreign_stores(path: Path) -> list[tuple[int, str]]:
    """(line, store) of every attribute store in ``path`` whose object is not ``self``."""
    out = []
    for line, target in _store_targets(ast.parse(path.read_text())):
        if isinstance(target, str):
            out.append((line, target))
        elif not (isinstance(target.value, ast.Name) and target.value.id == "self"):
            out.append((line, ast.unparse(target)))
    return out


def library_attribute_names(cls: type) -> set[str]:
    """Names a library base class of ``cls`` owns: its methods and class attributes, and every ``self.x`` its
    source assigns (read from the installed library)."""
    names: set[str] = set()
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] not in LIBRARIES or base is object:
            continue
        names |= set(vars(base))
        try:
            source = textwrap.dedent(inspect.getsource(base))
        except (OSError, TypeError):
            continue
        for _, target in _store_targets(ast.parse(source)):
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


def subclass_overwrites(path: Path) -> list[tuple[int, str]]:
    """(line, ``self.x``) of each store in a winnow class's methods to a name its library base class owns."""
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(module, node.name, None)
        if not isinstance(cls, type):
            continue
        owned = library_attribute_names(cls)
        if not owned:
            continue
        for line, target in _store_targets(node):
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self" and target.attr in owned):
                out.append((line, ast.unparse(target)))
    return out


def sources() -> list[Path]:
    return sorted((ROOT / "trainer").rglob("*.py"))


def test_every_store_on_another_object_is_listed_with_its_reason():
    unlisted = []
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        for line, store in foreign_stores(path):
            if (rel, store) not in ALLOWED:
                unlisted.append(f"{rel}:{line}: {store}")
    assert not unlisted, ("attribute stores on objects that may be TRL's, transformers' or accelerate's: pass the "
                          "value as an argument, or list the store in ALLOWED with why no argument can:\n"
                          + "\n".join(unlisted))


def test_no_winnow_subclass_rewrites_its_library_base_state():
    found = []
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{line}: {store}" for line, store in subclass_overwrites(path) if (rel, store) not in ALLOWED]
    assert not found, "a winnow subclass assigns its library base class's own attribute:\n" + "\n".join(found)


def test_every_listed_store_still_exists():
    """The list only shrinks: an entry whose store is gone is removed with it."""
    present = set()
    for path in sources():
        rel = path.relative_to(ROOT).as_posix()
        present |= {(rel, store) for _, store in foreign_stores(path) + subclass_overwrites(path)}
    assert not sorted(set(ALLOWED) - present)


def test_the_checks_see_the_patches_they_exist_for(tmp_path):
    """Hand-written cases: the loss-scale patch this item removed (``self.beta = ...`` in a GRPOTrainer subclass)
    and the chunked loss's ``accelerator.gather = ...`` are found; a subclass's own new attribute is not."""
    source = ("from trl import GRPOTrainer\n"
              "class T(GRPOTrainer):\n"
              "    def f(self, accelerator):\n"
              "        self.beta = 2.0\n"
              "        self._winnow_own = 1\n"
              "        accelerator.gather = lambda t: t\n")
    tree = ast.parse(source)
    from trl import GRPOTrainer

    owned = library_attribute_names(type("T", (GRPOTrainer,), {}))
    assert "beta" in owned and "_compute_loss" in owned and "_winnow_own" not in owned
    stores = [ast.unparse(t) if not isinstance(t, str) else t for _, t in _store_targets(tree)]
    assert stores == ["self.beta", "self._winnow_own", "accelerator.gather"]
    path = tmp_path / "m.py"
    path.write_text(source)
    assert foreign_stores(path) == [(6, "accelerator.gather")]


def test_every_override_of_trl_is_listed_with_its_reason():
    """WinnowGRPOTrainer overrides only the methods named in ``OVERRIDES`` (each with its reason), and each listed
    one is an override of TRL's GRPOTrainer / HF Trainer."""
    from trl import GRPOTrainer

    from trainer.grpo_trainer import OVERRIDES, WinnowGRPOTrainer

    overrides = {name for name in vars(WinnowGRPOTrainer)
                 if callable(getattr(WinnowGRPOTrainer, name)) and hasattr(GRPOTrainer, name)}
    assert overrides == set(OVERRIDES), overrides ^ set(OVERRIDES)
    assert all(reason.strip() for reason in OVERRIDES.values())
