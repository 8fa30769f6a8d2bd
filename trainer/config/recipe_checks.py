"""Checks of a parsed recipe against the machine, run before any weights load.

Each raises :class:`~trainer.config.recipe_parser.RecipeError` (``<field>: <what>. Fix: <how>``): the launch's
process count, the output folder (a run in it is never overwritten by accident), the checkpoint to resume
from, the model path or ``offline:`` alias, combinations of fields that only fail minutes later (LoRA weight
sync without LoRA, one reward weight per reward function), a dataset with no rows, and each reward function
against the task's columns (called once on the first row: the rewards raise on a recipe error, never on a
model's output). Two checks guard a user who runs someone else's recipe, before it runs anything: environment
variables of the recipe's ``env:`` that change which code runs or where data and credentials go, and a checkpoint
to resume from outside ``output_dir`` (a resume unpickles it) -- each allowed only by a command-line opt-in.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import huggingface_hub.constants
from huggingface_hub import try_to_load_from_cache
from transformers.trainer_utils import get_last_checkpoint

import rewards
from rewards import foreign
from trainer.config.dataset_fields import is_registered
from trainer.config.errors import RecipeError
from trainer.tools import optional

# What makes a folder hold a run (rather than, say, a README a user put there): anything a training run
# writes that a fresh run would overwrite, append to or rotate away.
_RUN_FILES = ("metrics.jsonl", "trainer_state.json", "model.safetensors", "model.safetensors.index.json",
              "adapter_model.safetensors", "pytorch_model.bin")
_CHECKPOINT = re.compile(r"^checkpoint-\d+$")


def is_main_process() -> bool:
    """Rank 0 of the launch (read from the launcher's environment: no process group exists yet)."""
    return int(os.environ.get("RANK", "0")) == 0


def check_process_count(launch_processes: int | None) -> None:
    """The recipe's ``launch_processes`` against the launch's WORLD_SIZE (set by accelerate/torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if launch_processes is not None and launch_processes != world:
        raise RecipeError(
            "launch_processes",
            f"the recipe's batch sizes assume {launch_processes} training processes, but this launch has {world}",
            "launch with the accelerate config the recipe names, or adjust per_device_train_batch_size / "
            "gradient_accumulation_steps / steps_per_generation and launch_processes together",
        )


def run_entries(output_dir: str | Path) -> list[str]:
    """What in ``output_dir`` belongs to a training run (checkpoints, metrics, final weights), sorted."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if _CHECKPOINT.match(p.name) or p.name in _RUN_FILES)


def resume_requested(resume: Any) -> bool:
    """Whether ``resume_from_checkpoint`` asks for a resume (``false``/empty do not)."""
    return bool(resume) and str(resume).strip().lower() not in ("false", "no", "0", "none")


def check_output_dir(output_dir: str, resume: Any, overwrite: bool) -> None:
    """Refuse a folder that holds a run unless the recipe resumes it or asks to start over; the folder (or
    the nearest existing parent) must be a writable directory."""
    folder = Path(output_dir).expanduser()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise RecipeError("output_dir", f"{existing} is a file, not a folder", "choose another --output_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RecipeError(
            "output_dir", f"{existing} is not writable", "choose a folder you can write to with --output_dir"
        )
    if resume_requested(resume) and overwrite:
        raise RecipeError("overwrite_output_dir", "set together with resume_from_checkpoint",
                          "resume the run (drop --overwrite_output_dir) or start over (drop --resume_from_checkpoint)")
    entries = run_entries(folder)
    if entries and not resume_requested(resume) and not overwrite:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise RecipeError(
            "output_dir", f"{folder} already holds a run ({shown})",
            "continue it with --resume_from_checkpoint true, start over with --overwrite_output_dir true "
            "(deletes that folder's contents), or pick another --output_dir",
        )
    if overwrite and folder.resolve() in (Path.cwd().resolve(), *Path.cwd().resolve().parents, Path.home().resolve()):
        raise RecipeError(
            "overwrite_output_dir", f"would delete {folder.resolve()}, which holds the current directory "
            "or is your home", "point --output_dir at the run's own folder",
        )


# What a recipe's ``env:`` may set without --allow_unsafe_env: runtime knobs only, by exact name, each with what it
# tunes. An allowlist, because every other variable can decide
# which code runs (LD_PRELOAD, PYTHONPATH, CC, WINNOW_VLLM_PYTHON, NVCC_PREPEND_FLAGS, GCONV_PATH, BASH_FUNC_*), which
# host the run talks to with its tokens (WANDB_BASE_URL, a WANDB_CONFIG_DIR whose settings name a base_url, proxies,
# OPENAI_API_BASE, MLFLOW_TRACKING_URI), which files it trusts (HOME, XDG_*, HF_HOME, HF_TOKEN_PATH, TMPDIR, the
# compile caches, NCCL_CONF_FILE, CA bundles) or which address it binds (VLLM_HOST_IP), and new ones appear with every
# library release. Case-sensitive: ``https_proxy`` is another variable than ``HTTPS_PROXY``, and neither is listed.
ALLOWED_ENV = {
    # threads of the numeric libraries and of the tokenizers
    "OMP_NUM_THREADS": "threads", "MKL_NUM_THREADS": "threads", "OPENBLAS_NUM_THREADS": "threads",
    "NUMEXPR_NUM_THREADS": "threads", "RAYON_NUM_THREADS": "threads", "TOKENIZERS_PARALLELISM": "threads",
    # NCCL's logging and transport tuning (no file, library or interface: NCCL_CONF_FILE, NCCL_NET_PLUGIN,
    # NCCL_SOCKET_IFNAME stay out) and torch's collective watchdog
    "NCCL_DEBUG": "logging", "NCCL_DEBUG_SUBSYS": "logging", "NCCL_P2P_DISABLE": "transport",
    "NCCL_P2P_LEVEL": "transport", "NCCL_IB_DISABLE": "transport", "NCCL_SHM_DISABLE": "transport",
    "NCCL_NVLS_ENABLE": "transport", "NCCL_CUMEM_ENABLE": "transport", "NCCL_ALGO": "transport",
    "NCCL_PROTO": "transport", "NCCL_MIN_NCHANNELS": "transport", "NCCL_MAX_NCHANNELS": "transport",
    "NCCL_BUFFSIZE": "transport", "NCCL_ASYNC_ERROR_HANDLING": "watchdog",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "watchdog", "TORCH_NCCL_BLOCKING_WAIT": "watchdog",
    "TORCH_NCCL_ENABLE_MONITORING": "watchdog",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "watchdog",
    # devices, allocator, determinism and debugging output of torch / CUDA
    "CUDA_VISIBLE_DEVICES": "devices", "CUDA_DEVICE_ORDER": "devices", "CUDA_LAUNCH_BLOCKING": "debugging",
    "PYTORCH_CUDA_ALLOC_CONF": "allocator", "PYTORCH_ALLOC_CONF": "allocator",
    "CUBLAS_WORKSPACE_CONFIG": "determinism",
    "TORCH_DISTRIBUTED_DEBUG": "logging", "TORCH_CPP_LOG_LEVEL": "logging", "TORCH_SHOW_CPP_STACKTRACES": "logging",
    "DS_ACCELERATOR": "devices",
    # W&B: which project and run, how it is labelled, whether it is online (never where it is sent, nor the key)
    "WANDB_PROJECT": "tracking", "WANDB_NAME": "tracking", "WANDB_TAGS": "tracking", "WANDB_NOTES": "tracking",
    "WANDB_RUN_GROUP": "tracking", "WANDB_JOB_TYPE": "tracking", "WANDB_MODE": "tracking", "WANDB_SILENT": "tracking",
    "WANDB_CONSOLE": "tracking", "WANDB_WATCH": "tracking",
    # offline switches and the libraries' own verbosity
    "HF_HUB_OFFLINE": "offline", "TRANSFORMERS_OFFLINE": "offline", "HF_DATASETS_OFFLINE": "offline",
    "HF_HUB_DISABLE_TELEMETRY": "offline", "HF_HUB_DISABLE_PROGRESS_BARS": "logging",
    "TRANSFORMERS_VERBOSITY": "logging",
    "DATASETS_VERBOSITY": "logging", "ACCELERATE_LOG_LEVEL": "logging", "VLLM_LOGGING_LEVEL": "logging",
    "TRL_EXPERIMENTAL_SILENCE": "logging",
}


def unsafe_env_keys(env: dict) -> list[str]:
    """The keys of ``env`` that a recipe may not set without --allow_unsafe_env (not in :data:`ALLOWED_ENV`)."""
    return [str(key) for key in env if str(key) not in ALLOWED_ENV]


def check_env(env: dict, allow_unsafe: bool) -> None:
    """Refuse a recipe's ``env:`` that sets anything but a runtime knob of :data:`ALLOWED_ENV` unless the command
    line opted in."""
    unsafe = unsafe_env_keys(env)
    if unsafe and not allow_unsafe:
        raise RecipeError(
            "env", f"the recipe sets {', '.join(unsafe)}: a recipe's env may set only runtime knobs (threads, NCCL "
            "logging and transport, devices, the allocator, W&B project/name/tags/mode, offline switches, "
            "verbosity: ALLOWED_ENV in trainer/config/recipe_checks.py, docs/security.md); any other variable can "
            "decide which code runs, where the run's tokens go or which files it trusts",
            f"set {'it' if len(unsafe) == 1 else 'them'} in your shell instead, or, only if you trust this recipe, "
            "pass --allow_unsafe_env true on the command line",
        )


def check_checkpoint_location(output_dir: str, resume: Any, allow_external: bool) -> None:
    """The checkpoint a resume loads must lie inside ``output_dir``, symlinks and ``..`` resolved: resuming unpickles
    the checkpoint's files (DeepSpeed's ``*_states.pt``, ``weights_only=False``), so only the run's own checkpoints
    load unless the command line opted in. For ``true``/``latest``/``auto`` that is the ``checkpoint-N`` folder HF's
    ``get_last_checkpoint`` picks there, resolved: a symlink named like one may point anywhere."""
    if allow_external or not resume_requested(resume):
        return
    if resumes_latest(resume) or resumes_if_any(resume):
        latest = get_last_checkpoint(output_dir) if Path(output_dir).expanduser().is_dir() else None
        if latest is None:
            return  # nothing to load (a fresh start, or the resume's own "no checkpoint" error)
        resume = latest
    checkpoint = Path(str(resume)).expanduser().resolve()
    folder = Path(output_dir).expanduser().resolve()
    if not checkpoint.is_relative_to(folder):
        raise RecipeError(
            "resume_from_checkpoint", f"{resume} lies outside output_dir {output_dir} (resolved: {checkpoint} is "
            f"not under {folder}); resuming unpickles the checkpoint, which can run any code",
            "resume a checkpoint of this run (true for the latest), or, only if you trust that checkpoint, pass "
            "--allow_external_checkpoint true on the command line",
        )


def resumes_latest(resume: Any) -> bool:
    """Whether ``resume_from_checkpoint`` names no folder but asks for the latest checkpoint of output_dir."""
    return str(resume).strip().lower() in ("true", "latest", "yes", "1")


def resumes_if_any(resume: Any) -> bool:
    """Whether ``resume_from_checkpoint`` is ``auto``: the latest checkpoint of output_dir if it has one, else a
    fresh start (a requeued job runs the same command line whether or not its first run saved anything)."""
    return str(resume).strip().lower() == "auto"


def resolve_auto_resume(output_dir: str, resume: Any) -> Any:
    """``resume_from_checkpoint: auto`` as the launch will run it: ``"true"`` (the latest checkpoint-N of
    ``output_dir``) when there is one, None (a fresh start) when the folder holds no run; any other value unchanged.
    A folder that holds a run but no checkpoint is refused: starting fresh there would overwrite that run."""
    if not resumes_if_any(resume):
        return resume

    if Path(output_dir).is_dir() and get_last_checkpoint(output_dir) is not None:
        return "true"
    entries = run_entries(output_dir)
    if entries:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise RecipeError(
            "resume_from_checkpoint", f"auto found no checkpoint-N folder to resume in {output_dir}, which holds a "
            f"run ({shown}); starting fresh would overwrite it",
            "start over with --overwrite_output_dir true instead of auto (deletes that folder's contents), or pick "
            "another --output_dir",
        )
    return None


def check_resume(output_dir: str, resume: Any, allow_external: bool = False) -> None:
    """A resume needs a checkpoint: ``true``/``latest`` one in ``output_dir``, a path an existing folder inside
    ``output_dir`` (anywhere with ``allow_external``: :func:`check_checkpoint_location`)."""
    if not resume_requested(resume):
        return
    check_checkpoint_location(output_dir, resume, allow_external)

    if resumes_latest(resume):
        if not Path(output_dir).is_dir() or get_last_checkpoint(output_dir) is None:
            raise RecipeError(
                "resume_from_checkpoint", f"no checkpoint-N folder in {output_dir} to resume from",
                "start the run without --resume_from_checkpoint, or point --output_dir at the run to continue",
            )
    elif not (Path(resume) / "trainer_state.json").is_file():
        raise RecipeError("resume_from_checkpoint", f"{resume} is not a checkpoint folder (no trainer_state.json)",
                          "pass a checkpoint-N folder of a run, or true for the latest one in output_dir")


# What a run writes at the top of output_dir (HF's save_model and checkpoints, TRL's model card, winnow's own files):
# all that --overwrite_output_dir deletes. Anything else there (a user's notes, keys, data) is kept.
_WRITTEN_BY_A_RUN = re.compile(
    r"^(checkpoint-\d+|model.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?|adapter_(model|config)"
    r"\..*|config\.json|generation_config\.json|tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\.json|"
    r"merges\.txt|chat_template\..*|training_args\.bin|trainer_state\.json|(all|train|eval)_results\.json|README\.md|"
    r"metrics\.(jsonl|png)|recipe\.resolved\.yaml|wandb_run_id|weight_sync|winnow_.*|runs)$")


def clear_output_dir(output_dir: str) -> list[str]:
    """``overwrite_output_dir``: delete what a run wrote in the folder (main process only; a symlink is removed, never
    followed) so the new run starts clean; returns the names of the entries kept (written by no run)."""
    folder = Path(output_dir)
    if not is_main_process() or not folder.is_dir():
        return []
    kept = []
    for entry in sorted(folder.iterdir()):
        if not _WRITTEN_BY_A_RUN.match(entry.name):
            kept.append(entry.name)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return kept


def check_model_path(field_name: str, name: str | None, aliases: Sequence[str], revision: str | None = None) -> None:
    """A model that cannot be found fails here: an unknown ``offline:`` alias, a local path with no model,
    or (offline) a hub id that is not in the local cache."""
    if not name:
        raise RecipeError(
            field_name, "no model given", f"set {field_name}: a hub id, a local folder or one of {list(aliases)}"
        )
    if name.startswith("offline:"):
        if name not in aliases:
            raise RecipeError(field_name, f"unknown offline alias {name!r}", f"use one of {list(aliases)}")
        return
    path = Path(name).expanduser()
    if path.exists() or name.startswith(("/", ".", "~")):
        if not ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()):
            raise RecipeError(field_name, f"no model at {name} (no config.json there)",
                              f"give a folder written by save_pretrained, a hub id, or one of {list(aliases)}")
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        if not isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str):
            raise RecipeError(
                field_name, f"{name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1",
                f"download it first (hf download {name}), give a local folder, or use one of {list(aliases)}",
            )


def check_field_combinations(task: Any, args: Any, model_args: Any) -> None:
    """Fields of different dataclasses that only make sense together."""
    if args.weight_sync == "lora" and not model_args.use_peft:
        raise RecipeError("weight_sync", "'lora' sends LoRA adapters to the server, but use_peft is false",
                          "set use_peft: true (with lora_r / lora_target_modules), or use weight_sync: auto")
    entries = task.reward_entries  # reward_model_name_or_path counts (first), as in the trainer
    if args.reward_weights is not None and len(args.reward_weights) != len(entries):
        raise RecipeError("reward_weights", f"{len(args.reward_weights)} weights for {len(entries)} reward "
                          f"functions {entries}", "give one weight per entry of reward_funcs (same order; "
                          "reward_model_name_or_path first when given)")

    if (str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no" and not task.is_env_task
            and is_registered(task.dataset_name)):
        # The environment tasks build an evaluation set (held-out levels), a Hub id or local path has its
        # dataset_test_split (checked when it loads); the registered text loaders have none to give (DAPO-Math-17k,
        # DeepMath-103K publish a train split only), and TRL would fail after the weights load.
        raise RecipeError("eval_strategy", f"dataset {task.dataset_name!r} has no evaluation set: only environment "
                          "tasks (sokoban, frozenlake) and a Hub id or local path with a dataset_test_split evaluate "
                          "during training",
                          "set eval_strategy: no, and evaluate checkpoints with launch/eval.py")
    check_quantization(model_args)


def check_quantization(model_args: Any) -> None:
    """``load_in_4bit`` / ``load_in_8bit`` load the policy through bitsandbytes (TRL's get_quantization_config);
    without the package installed they are refused here, not after the tokenizer and dataset loaded."""
    for name in ("load_in_4bit", "load_in_8bit"):
        if getattr(model_args, name, False) and not optional.installed("bitsandbytes"):
            raise RecipeError(name, "quantized loading needs the bitsandbytes package, which is not installed",
                              f"drop {name} (or set it false), or pip install bitsandbytes on a CUDA machine")


def check_model_loading(args: Any, model_args: Any) -> None:
    """What would fail only once the weights load or the run ends: flash-attention without its package (transformers
    raises at load) and pushing to the Hub from a machine that is offline (the push fails after training)."""
    if model_args.attn_implementation in ("flash_attention_2", "flash_attention_3"):
        package = "flash_attn" if model_args.attn_implementation == "flash_attention_2" else "flash_attn_interface"
        if not optional.installed(package):
            raise RecipeError("attn_implementation", f"{model_args.attn_implementation} needs the {package} package, "
                              "which is not installed", "pip install flash-attn on a CUDA machine, or write "
                              "attn_implementation: sdpa")
    if args.push_to_hub and huggingface_hub.constants.HF_HUB_OFFLINE:
        raise RecipeError("push_to_hub", "is true but HF_HUB_OFFLINE is set: the push would fail after training",
                          "set push_to_hub: false (push the saved output_dir later with `hf upload`), or unset "
                          "HF_HUB_OFFLINE on a machine with Hub access")


def resolve_reward(name: str, options: dict[str, Any], recipe_dir: str | Path | None = None,
                   aliases: Sequence[str] = ()) -> Callable | str:
    """One entry of ``reward_funcs`` (or ``reward_model_name_or_path``) as the trainer takes it, in this order:

    - a registered name (rewards/: winnow's own, TRL's ``trl grpo`` names, open-r1's ``accuracy`` / ``format``);
    - a reward model -- an ``offline:`` alias, a local folder or a hub id ``org/name``: returned as a string, which
      TRL's GRPOTrainer loads with AutoModelForSequenceClassification (num_labels=1), checked here like the policy;
    - a dotted path ``module.function`` (as ``trl grpo``): a module file beside the recipe (``recipe_dir``), then in
      the current directory, is loaded from that file under a name of its own -- so a user's ``rewards.py`` is not
      shadowed by winnow's ``rewards`` package, which stays what ``import rewards`` gives -- else the module is
      imported (installed packages; the current directory is on sys.path, as in ``trl grpo``).
    """
    name = foreign.TRL_DOTTED.get(name, name)  # TRL's accuracy rewards by dotted path: the bare name's reward
    if name in rewards.available():
        return rewards.get_reward(name, **options)
    if name in foreign.OPEN_R1_NOT_HERE:
        raise RecipeError(
            "reward_funcs", f"{name!r} is one of open-r1's reward functions that winnow does not implement; of "
            f"open-r1's, {' and '.join(foreign.OPEN_R1_NAMES)} are here",
            f"use one of {', '.join(rewards.available())}, or write it as a function and name it by dotted path "
            "(my_rewards.fn, a my_rewards.py beside the recipe)",
        )
    if is_reward_model(name):
        check_model_path("reward_funcs", name, aliases)
        return name
    if "." in name:
        fn = _import_reward(name, recipe_dir)
        if callable(fn):
            return fn
        raise RecipeError("reward_funcs", f"{name!r} is a {type(fn).__name__}, not a function",
                          "name a function module.function that takes completions and returns one float each")
    raise RecipeError(
        "reward_funcs", f"no reward function named {name!r}",
        f"use a registered one ({', '.join(rewards.available())}), a dotted path my_pkg.module.function, or a reward "
        "model (hub id org/name, local folder)",
    )


def is_reward_model(name: str) -> bool:
    """Whether a ``reward_funcs`` entry names a model rather than a function: an ``offline:`` alias, a path (an
    existing folder, or written as one) or a hub id ``org/name`` -- a dotted function path has no ``/``."""
    return (name.startswith(("offline:", "/", "./", "../", "~")) or "/" in name
            or Path(name).expanduser().is_dir())


def _user_module_file(base: Path, parts: list[str]) -> tuple[Path, Path] | None:
    """The file of module ``parts[0]`` under ``base`` (``name.py`` or a package ``name/__init__.py``) if the dotted
    module ``parts`` exists there as files; with the top-level file, the one of the full module."""
    top = base / f"{parts[0]}.py"
    if len(parts) == 1 and top.is_file():
        return top, top
    package = base / parts[0] / "__init__.py"
    if not package.is_file():
        return None
    tail = base.joinpath(*parts)
    if (tail.with_suffix(".py")).is_file() or (tail / "__init__.py").is_file() or len(parts) == 1:
        return package, package
    return None


def _import_reward(name: str, recipe_dir: str | Path | None) -> Any:
    """The object a dotted reward path names; a module file beside the recipe or in the current directory first
    (:func:`resolve_reward`)."""
    module_name, attr = name.rsplit(".", 1)
    parts = module_name.split(".")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # as `trl grpo` (which prepends it) and import_modules
    module = None
    for base in dict.fromkeys(Path(b).resolve() for b in (recipe_dir, os.getcwd()) if b):
        found = _user_module_file(base, parts)
        if found is None:
            continue
        top_file = found[0]
        loaded = sys.modules.get(parts[0])
        if loaded is not None and getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == top_file:
            break  # that file is what `import` gives anyway (e.g. run from the folder of a user's package)
        # A name of its own, one per file: winnow's `rewards` (or any module of that name) stays in sys.modules, and
        # two entries of one file share the module. Its folder goes on sys.path so its own sibling imports work.
        alias = f"winnow_recipe_{parts[0]}_{hashlib.sha1(str(top_file).encode()).hexdigest()[:8]}"
        try:
            if alias not in sys.modules:
                is_package = top_file.name == "__init__.py"
                spec = importlib.util.spec_from_file_location(
                    alias, top_file, submodule_search_locations=[str(top_file.parent)] if is_package else None)
                mod = importlib.util.module_from_spec(spec)
                if str(base) not in sys.path:
                    sys.path.append(str(base))
                sys.modules[alias] = mod
                try:
                    spec.loader.exec_module(mod)
                except BaseException:
                    del sys.modules[alias]
                    raise
            module = importlib.import_module(".".join([alias, *parts[1:]]))
        except Exception as e:  # noqa: BLE001 -- the user's module failed to import: one line
            raise RecipeError("reward_funcs", f"cannot import {module_name!r} from {top_file} "
                              f"({type(e).__name__}: {e})", "fix that module (it is loaded from the file named)"
                              ) from None
        break
    try:
        if module is None:
            module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as e:
        raise RecipeError("reward_funcs", f"cannot import {name!r} ({e})",
                          "give a module.function path importable from here or a module file beside the recipe, or "
                          "a registered name") from None


def check_dataset(dataset: Any, task: Any) -> None:
    """A dataset with no rows would train nothing and save the untouched model as the result."""
    if next(iter(dataset), None) is None:  # a streamed dataset (dataset_streaming) has no len()
        raise RecipeError(
            "dataset_kwargs", f"dataset {task.dataset_name!r} has 0 rows with {task.dataset_kwargs or {}} "
            "(empty file, num_samples: 0, or every prompt over max_prompt_tokens)",
            "point path at a file with rows, raise num_samples, or raise max_prompt_tokens",
        )


def probe_rewards(reward_funcs: Sequence[Callable], names: Sequence[str], dataset: Any) -> None:
    """Call each reward once on the first row with an empty completion: a missing or malformed column raises
    there (the rewards fail loudly on recipe errors and score any model output), not after the model loaded."""
    row = next(iter(dataset))  # dataset[0], also of a streamed dataset
    columns = {key: [value] for key, value in row.items() if key != "prompt"}
    conversational = isinstance(row["prompt"], list)
    completion = [{"role": "assistant", "content": ""}] if conversational else ""
    for name, fn in zip(names, reward_funcs):
        if isinstance(fn, str):  # a reward model: TRL scores prompt + completion text, no dataset column
            continue
        try:
            fn(prompts=[row["prompt"]], completions=[completion], completion_ids=[[]], trainer_state=None,
               log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None, **columns)
        except Exception as e:  # noqa: BLE001 -- any failure here is the recipe's, reported as one line
            text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)  # KeyError's repr quotes
            problem = " ".join(text.split())[:400]
            raise RecipeError(
                "reward_funcs", f"{name!r} cannot score rows of dataset with columns {sorted(row)}: "
                f"{type(e).__name__}: {problem}",
                "pick a reward made for this task's columns (or a dataset whose columns it reads)",
            ) from None
