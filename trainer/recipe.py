"""A recipe *is* the experiment: one YAML file of ``TaskArguments`` + ``WinnowConfig`` + TRL ``ModelConfig``.

``parse_recipe`` reads ``--config recipe.yaml`` plus CLI overrides (TRL's ``TrlParser``: CLI beats YAML
beats defaults); every config error surfaces here, before any model is loaded. ``check_run`` checks what a launch
needs before it prepares anything; ``resolved_recipe`` is the recipe as it ran. Turning the parsed recipe into a
ready trainer is trainer/build.py's job.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Sequence

import yaml
from transformers import TrainingArguments
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, ModelConfig

from trainer.config import recipe_checks as checks
from trainer.config import redaction
from trainer.config.core import ConfigError, WinnowConfig
from trainer.config.dataset_fields import DatasetFields, check_dataset_fields
from trainer.config.env import EnvTaskFields
from trainer.config.model_path import OFFLINE_MODELS
from trainer.config.recipe_checks import check_process_count, resumes_latest
from trainer.config.recipe_parser import (
    RecipeError,
    RecipeParser,
    check_keys,
    cli_values,
    import_modules,
    own_fields,
    pop_cli_flag,
    read_recipe_file,
    split_config_flag,
)
from trainer.config.server import ServerFields
from trainer.config.yaml_types import check_recipe_types
from trainer.data.envs import ENV_TASKS
from trainer.guards.generation_resume import check_resumable
from trainer.pipeline import stages
from trainer.tools import optional


@dataclass
class TaskArguments(DatasetFields, EnvTaskFields):
    """What to train on: dataset, reward functions, prompt handling, and the launch the recipe is sized for
    (plus TRL's dataset keys for a Hub id or local path, trainer/config/dataset_fields.py, and, for the environment
    tasks sokoban / frozenlake, the episode settings of trainer/config/env.py)."""

    dataset_name: str = field(
        default="arithmetic",
        metadata={"help": "Registered task dataset (trainer.data): arithmetic, dapo_math_17k, deepmath_103k, "
                  "metamathqa, countdown, champ, json, or an environment played turn by turn: sokoban, frozenlake. "
                  "Any other value is a Hub id or local path (.parquet/.jsonl/.json/.csv file, folder, save_to_disk "
                  "folder) read as TRL's scripts do (dataset_config, dataset_train_split, ...): its `prompt` column "
                  "is used as it is and every other column reaches the reward functions as a keyword argument."},
    )
    dataset_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments of the dataset loader (a mapping in YAML, a JSON string on the CLI), "
                  "e.g. {path: ..., num_samples: 1000, min_difficulty: 5}. A Hub id or local path takes num_samples, "
                  "shuffle, seed, revision, data_dir, data_files, cache_dir."},
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward functions, combined with GRPOConfig.reward_weights: registered names (rewards/: "
                  "winnow's, TRL's accuracy_reward, reasoning_accuracy_reward, think_format_reward, "
                  "get_soft_overlong_punishment, open-r1's accuracy, format), dotted paths module.function (a module "
                  "file beside the recipe first, then the current directory, then installed packages), or reward "
                  "models (hub id, local folder) as TRL's GRPOTrainer takes them. Default: [math_accuracy], or none "
                  "when reward_model_name_or_path is given (as trl grpo)."},
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Reward model id of a pretrained model hosted inside a model repo on huggingface.co or "
                  "local path to a directory containing model weights saved using `PreTrainedModel.save_pretrained` "
                  "(as trl grpo: put before reward_funcs; TRL loads it with AutoModelForSequenceClassification, "
                  "num_labels=1, and its own tokenizer)."},
    )
    reward_timeout: float = field(
        default=2.0,
        metadata={"help": "Hard wall-clock limit in seconds of one math-verify call (answers over it score 0)."},
    )
    overlong_buffer_len: int = field(
        default=4096,
        metadata={"help": "DAPO overlong shaping (reward 'overlong_penalty'): L_cache, the last tokens before "
                  "max_completion_length in which the penalty grows linearly from 0 to -overlong_penalty_factor."},
    )
    overlong_penalty_factor: float = field(
        default=1.0,
        metadata={"help": "DAPO overlong shaping: the penalty at max_completion_length (verl's penalty_factor). "
                  "With a 0/1 task reward, 0.5 is equivalent to DAPO's 1.0 on its +1/-1 reward."},
    )
    enable_thinking: bool | None = field(
        default=None,
        metadata={"help": "Qwen3 thinking mode (chat template kwarg enable_thinking); None leaves the template "
                  "default."},
    )
    max_prompt_tokens: int | None = field(
        default=None,
        metadata={"help": "Drop dataset prompts longer than this many tokens as the model sees them: after the chat "
                  "template, the think prefill included (think_prefill), so max_prompt_tokens + max_completion_length "
                  "bounds every sequence and is the vLLM server's --max-model-len."},
    )
    launch_processes: int | None = field(
        default=None,
        metadata={"help": "Number of training processes the batch sizes of this recipe assume (the accelerate config "
                  "it is meant for). A launch with another count fails fast instead of running a different "
                  "experiment."},
    )
    plot: bool = field(default=True, metadata={"help": "Write metrics.png (reward and entropy per step) at the end."})
    wandb_project: str | None = field(
        default=None,
        metadata={"help": "W&B project of the run (report_to: wandb); default: WANDB_PROJECT, else winnow-rl. The run "
                  "is named run_name, logs this whole recipe as its config, and a resume continues it "
                  "(trainer/tools/wandb_run.py)."},
    )
    import_modules: list[str] = field(
        default_factory=list,
        metadata={"help": "Python modules imported before the recipe is checked, e.g. [my_pkg.stages]: a module that "
                  "registers its own stage, reward or dataset makes that name valid in this recipe. Importing runs "
                  "the module's code, as a dotted reward path does: a recipe is code."},
    )
    # Command line only (CLI_ONLY): each lifts a guard that protects a user running someone else's recipe, so the
    # recipe file cannot set it (it would opt itself in); init=False keeps them out of the parser's fields and out
    # of recipe.resolved.yaml. parse_recipe reads them off the command line.
    allow_unsafe_env: bool = field(
        default=False, init=False,
        metadata={"help": "Let the recipe's env: set variables other than the runtime knobs of ALLOWED_ENV "
                  "(trainer/config/recipe_checks.py: threads, NCCL logging, devices, W&B project/name/tags/mode, "
                  "...): any other can change which code runs or where data and tokens go. Command line only, for a "
                  "recipe you trust."},
    )
    # The folder of the --config file, set by parse_recipe: a dotted reward path looks for its module file there
    # first. Not a recipe field (a recipe cannot say where it lies): recipe.resolved.yaml leaves it out.
    recipe_dir: str | None = field(default=None, init=False)
    allow_external_checkpoint: bool = field(
        default=False, init=False,
        metadata={"help": "Resume from a checkpoint folder outside output_dir. Resuming unpickles the checkpoint "
                  "(it can run any code): command line only, for a checkpoint you trust."},
    )
    overwrite_output_dir: bool = field(
        default=False, init=False,
        metadata={"help": "Start over in an output_dir that holds a run: what a run writes there (checkpoints, "
                  "metrics, the saved model, recipe.resolved.yaml, ...) is deleted before training, anything else is "
                  "kept. Without it (and without resume_from_checkpoint) such a folder is refused, so no run is lost. "
                  "Command line only: a recipe cannot decide to delete a folder."},
    )

    def __post_init__(self) -> None:
        if isinstance(self.dataset_kwargs, str):
            try:
                self.dataset_kwargs = json.loads(self.dataset_kwargs)
            except json.JSONDecodeError as e:
                raise RecipeError(
                    "dataset_kwargs", f"not valid JSON ({e})", 'pass e.g. \'{"num_samples": 100}\''
                ) from None
        if self.dataset_kwargs is not None and not isinstance(self.dataset_kwargs, dict):
            raise RecipeError(
                "dataset_kwargs",
                f"must be a mapping (got {self.dataset_kwargs!r})",
                'pass e.g. \'{"num_samples": 100}\'',
            )
        if self.reward_funcs is None:
            self.reward_funcs = [] if self.reward_model_name_or_path else ["math_accuracy"]
        if not self.reward_entries:
            raise RecipeError("reward_funcs", "no reward function given", "name at least one, e.g. [math_accuracy]")
        if self.reward_timeout <= 0:
            raise RecipeError("reward_timeout", f"must be > 0 (got {self.reward_timeout})", "use e.g. 2.0")
        self.validate_env_fields()
        self.validate_dataset_fields()
        env_rewards = sorted({"env_return", "env_success"} & set(self.reward_funcs))
        if env_rewards and not self.is_env_task:
            raise RecipeError("reward_funcs", f"{env_rewards} need an environment task, not {self.dataset_name!r}",
                              "set dataset_name: sokoban | frozenlake, or use a reward of the dataset's task")

    @property
    def reward_entries(self) -> list[str]:
        """What scores completions, in the trainer's order: reward_model_name_or_path first (as trl grpo), then
        reward_funcs; one reward weight each."""
        return [self.reward_model_name_or_path] * bool(self.reward_model_name_or_path) + list(self.reward_funcs)

    @property
    def is_env_task(self) -> bool:
        """Whether the dataset is an environment played through the multi-turn rollout."""
        return self.dataset_name in ENV_TASKS


DESCRIPTION = """Train a language model with GRPO and winnow-rl's stage pipeline (TRL's GRPOTrainer underneath).

A recipe is one YAML file of the fields below; flags on the command line override it:

  accelerate launch launch/train.py --config configs/demo/smollm2-arithmetic.yaml --output_dir outputs/demo
  python launch/train.py --config RECIPE.yaml --resume_from_checkpoint true   # continue the run in output_dir

A recipe is code: run only trusted recipes (import_modules and dotted reward paths import and run Python, env: sets
the environment; a resume unpickles its checkpoint). --allow_unsafe_env and --allow_external_checkpoint lift the
two guards, and only the command line can give them.
"""

EPILOG = """The run folder (output_dir) receives checkpoints, metrics.jsonl, metrics.png, the final model and
recipe.resolved.yaml (every field, flat: --config recipe.resolved.yaml runs the same experiment again).
A folder that holds a run is refused unless --resume_from_checkpoint or --overwrite_output_dir is given
(--resume_from_checkpoint auto: resume if output_dir has a checkpoint, else start fresh).
Mistakes are reported as one line `error: ... Fix: ...` (exit 2) before any weights load; set
WINNOW_TRACEBACK=1 (or pass --traceback) for the full traceback. Under `accelerate launch`, its -q flag
drops accelerate's own CalledProcessError traceback that follows the line.
"""

RUN_FIELDS = ("output_dir", "overwrite_output_dir", "resume_from_checkpoint", "model_name_or_path", "import_modules",
              "launch_processes", "max_steps", "num_train_epochs", "seed", "report_to", "wandb_project", "run_name")
# TaskArguments' opt-ins that only the command line may give (see the fields).
CLI_ONLY = ("allow_unsafe_env", "allow_external_checkpoint", "overwrite_output_dir")
CLASSES = (TaskArguments, WinnowConfig, ModelConfig)


def method_sections() -> list[tuple[str, str, list[str]]]:
    """One --help section per method whose knobs are a mixin of WinnowConfig (trainer/methods/<method>/fields.py),
    titled by the mixin's docstring."""
    mixins = [c for c in WinnowConfig.__mro__ if c.__module__.startswith("trainer.methods.")]
    titles = [c.__doc__.strip().splitlines()[0].rstrip(".").replace("``", "") for c in mixins]
    return [(f"method: {title}", "", own_fields(c)) for title, c in zip(titles, mixins)]


def recipe_parser() -> RecipeParser:
    """The parser of recipes (three dataclasses, one YAML namespace), its --help grouped by topic."""
    sections = [
        ("run", "", RUN_FIELDS),
        ("task: what to train on", "", own_fields(TaskArguments)),
        ("dataset: a Hub id or local path in dataset_name (TRL's dataset keys)", "", own_fields(DatasetFields)),
        ("stages: winnow-rl's pipeline (rollout_filter -> rollout_dropout -> advantage -> loss_variant) and its knobs",
         "", own_fields(WinnowConfig)),
        *method_sections(),
        ("vLLM server and weight sync", "", own_fields(ServerFields)),
        ("environment tasks (dataset_name: sokoban | frozenlake)", "", own_fields(EnvTaskFields)),
        ("model (TRL ModelConfig; LoRA with use_peft)", "", own_fields(ModelConfig)),
        ("TRL GRPOConfig", "", own_fields(GRPOConfig)),
        ("transformers TrainingArguments", "", own_fields(TrainingArguments)),
    ]
    parser = RecipeParser(CLASSES, sections, DESCRIPTION, EPILOG)
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(TaskArguments) if f.name in CLI_ONLY}
    for name in CLI_ONLY:  # read (and removed) by parse_recipe before argparse runs; declared for --help only
        parser.run_group.add_argument(f"--{name}", f"--{name.replace('_', '-')}", metavar="BOOL",
                                      default=argparse.SUPPRESS, help=f"{helps[name]} (default: false)")
    # handled by the entry point (trainer/cli/train.py) before argparse runs; declared for --help only
    parser.run_group.add_argument("--dry-run", action="store_true", default=argparse.SUPPRESS,
                                  help="Check the launch and print the preflight (trainer/tools/preflight.py): the "
                                  "recipe, processes, vLLM server, packages, W&B, disk. Loads no weights, trains "
                                  "nothing; exit status 1 if a check fails.")
    for action in parser.actions:
        if action.dest in stages.STAGE_KINDS:
            action.help = f"{action.help} Choices: {', '.join(stages.available(action.dest))}."
        elif action.dest == "resume_from_checkpoint":
            action.help = ("Continue a run: a checkpoint folder, `true` for the latest checkpoint-N in output_dir "
                           "(its metrics.jsonl is kept and continued), or `auto`: the latest checkpoint-N if "
                           "output_dir has one, else a fresh start (for requeued jobs; a folder holding a run without "
                           "a checkpoint is still refused). A resume trusts the checkpoint: it unpickles "
                           "its files, so a folder outside output_dir needs --allow_external_checkpoint true.")
        elif action.dest == "run_name":
            action.help = "The run's name in W&B (and trackio, MLflow, ...); default: the output folder's name."
        elif action.dest == "model_name_or_path":
            action.help = ("The policy: a hub id, a local model folder or an offline alias "
                           f"({', '.join(OFFLINE_MODELS)}; built locally by trainer/tools/assets.py).")
    return parser


def parse_recipe(argv: Sequence[str] | None = None) -> tuple[TaskArguments, WinnowConfig, ModelConfig]:
    """Parse ``--config recipe.yaml`` and CLI overrides (CLI beats YAML beats defaults). Every mistake --
    missing or malformed file, unknown key, wrong type, invalid value -- raises a ``ConfigError`` naming the
    field and the fix; nothing heavy has happened yet. A recipe is code: an unsafe ``env:`` key or a checkpoint
    outside output_dir is refused before the recipe's modules are imported or os.environ changes, unless the
    command line (never the recipe) gives --allow_unsafe_env / --allow_external_checkpoint."""
    path, rest = split_config_flag(sys.argv[1:] if argv is None else list(argv))
    opt_ins = {}
    for name in CLI_ONLY:
        opt_ins[name], rest = pop_cli_flag(rest, name)
    config = read_recipe_file(path) if path else {}
    # A recipe is code: what only a trusted recipe may do is refused here, before import_modules (or anything else)
    # runs and before os.environ changes -- the opt-ins come from the command line, never from the recipe itself.
    for name in CLI_ONLY:
        if name in config:
            raise RecipeError(name, "a recipe cannot opt itself in", f"remove it from the recipe; pass --{name} true "
                              "on the command line, and only for a recipe you trust")
    env = config.pop("env", None) or {}
    if not isinstance(env, dict):
        raise RecipeError(
            "env", f"must be a mapping of environment variables (got {env!r})", "write env: {NAME: value}"
        )
    checks.check_env(env, opt_ins["allow_unsafe_env"])
    # The values as given (check_run checks the parsed ones again); TrainingArguments' default output_dir.
    resume = _given(rest, config, "resume_from_checkpoint")
    output_dir = _given(rest, config, "output_dir") or "trainer_output"
    checks.check_checkpoint_location(str(output_dir), resume, opt_ins["allow_external_checkpoint"])
    modules = config.get("import_modules") or []
    import_modules([modules] if isinstance(modules, str) else list(modules))
    import_modules(cli_values(rest, "import_modules") or [])
    parser = recipe_parser()
    check_keys(parser, config, [])
    check_recipe_types(config, CLASSES)
    for key, value in env.items():  # TrlParser's `env` key
        os.environ[str(key)] = str(value)
    # Under a launcher (WORLD_SIZE set), before TrainingArguments exists: its __post_init__ already sets up the
    # distributed state. A plain `python` start is checked by check_run (a parse alone, e.g. of a recipe sized
    # for 8 GPUs on a laptop, stays possible).
    launch_processes = str((cli_values(rest, "launch_processes") or [config.get("launch_processes")])[-1])
    if "WORLD_SIZE" in os.environ and launch_processes.isdigit():  # else argparse's type check names the flag
        check_process_count(int(launch_processes))
    parser.set_defaults_with_config(**config)
    try:
        with warnings.catch_warnings():
            # TRL's GRPOConfig itself sets the deprecated alias; the warning is for code authors, not recipe users
            warnings.filterwarnings("ignore", message="`gradient_checkpointing", category=FutureWarning)
            task, args, model_args, remaining = parser.parse_args_into_dataclasses(
                args=rest, return_remaining_strings=True
            )
    except ConfigError:
        raise
    except ValueError as e:  # transformers' / TRL's own validation of their fields: a message, no field name
        problem = " ".join(str(e).split())
        fix = ("on a machine without a GPU pass --bf16 false --use_cpu true" if "bf16" in problem
               else "change the value the message names (python launch/train.py --help describes each field)")
        raise RecipeError("recipe", problem, fix) from None
    check_keys(parser, {}, remaining)
    for name, value in opt_ins.items():
        setattr(task, name, value)
    task.recipe_dir = str(Path(path).resolve().parent) if path else None
    if (cli_values(rest, "dataset_kwargs") is not None and config.get("dataset_kwargs")
            and task.dataset_name == config.get("dataset_name", task.dataset_name)):
        # The command line adds to (or changes keys of) the recipe's mapping instead of replacing it -- unless it
        # also names another dataset, whose loader takes other arguments.
        base = config["dataset_kwargs"]
        base = json.loads(base) if isinstance(base, str) else dict(base)
        task.dataset_kwargs = {**base, **(task.dataset_kwargs or {})}
    if task.enable_thinking is not None:
        kwargs = dict(args.chat_template_kwargs or {})
        kwargs["enable_thinking"] = task.enable_thinking
        args.chat_template_kwargs = kwargs
    if "overlong_penalty" in task.reward_funcs and not 0 < task.overlong_buffer_len <= args.max_completion_length:
        raise RecipeError(
            "overlong_buffer_len",
            f"must be in (0, max_completion_length={args.max_completion_length}] (got {task.overlong_buffer_len})",
            "DAPO uses 4096 of 20480; pick a buffer smaller than the response budget",
        )
    return task, args, model_args


def _given(argv: Sequence[str], config: dict[str, Any], name: str) -> Any:
    """The value of field ``name`` as given, before parsing: the command line's last (either spelling), else the
    recipe's."""
    values = cli_values(argv, name) or cli_values(argv, name.replace("_", "-"))
    return values[-1] if values else config.get(name)


def check_launch(task: TaskArguments, num_processes: int) -> None:
    """Fail fast when the recipe is launched on a process count it was not sized for."""
    if task.launch_processes is not None and task.launch_processes != num_processes:
        raise RecipeError(
            "launch_processes",
            f"the recipe's batch sizes assume {task.launch_processes} training processes, "
            f"but this launch has {num_processes}",
            "launch with the accelerate config the recipe names, or adjust per_device_train_batch_size / "
            "gradient_accumulation_steps / steps_per_generation and launch_processes together",
        )


def check_run(task: TaskArguments, args: WinnowConfig, model_args: ModelConfig) -> None:
    """What a launch checks before it prepares anything: process count, output folder, resume, models,
    fields that only work together (each a RecipeError naming the field and the fix)."""
    checks.check_process_count(task.launch_processes)
    # `auto` becomes `true` (a checkpoint to resume) or None (a fresh start) here, so every check below and the
    # launch itself see what will actually run.
    args.resume_from_checkpoint = checks.resolve_auto_resume(args.output_dir, args.resume_from_checkpoint)
    checks.check_output_dir(args.output_dir, args.resume_from_checkpoint, task.overwrite_output_dir)
    checks.check_resume(args.output_dir, args.resume_from_checkpoint, task.allow_external_checkpoint)
    if checks.resume_requested(args.resume_from_checkpoint):
        check_resume_continues(args)
    checks.check_model_path("model_name_or_path", model_args.model_name_or_path, list(OFFLINE_MODELS),
                            model_args.model_revision)
    if args.teacher_model_name_or_path:
        checks.check_model_path("teacher_model_name_or_path", args.teacher_model_name_or_path, list(OFFLINE_MODELS))
    checks.check_field_combinations(task, args, model_args)
    check_dataset_fields(task, args)
    checks.check_model_loading(args, model_args)
    if task.dataset_name == "frozenlake":
        if not optional.installed("gymnasium"):  # FrozenLake's transitions are gymnasium's (the `envs` extra)
            raise RecipeError("dataset_name", optional.missing_message("gymnasium", "frozenlake"),
                              "install the extra (Sokoban needs nothing more)")


def check_resume_continues(args: WinnowConfig) -> None:
    """Refuse a resume from a checkpoint inside a generation batch that cannot continue exactly (the trainer's own
    check, trainer/guards/generation_resume.py), here before any weight loads or the run's files are rewritten."""
    resume = args.resume_from_checkpoint
    checkpoint = get_last_checkpoint(args.output_dir) if resumes_latest(resume) else str(resume)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # accelerate launch sets it on every process
    check_resumable(args, world, checkpoint)


NOT_RESOLVED = ("resume_from_checkpoint", "overwrite_output_dir", "hub_token", "generation_batch_size",
                "gradient_checkpointing", "gradient_checkpointing_kwargs")


def resolved_recipe(task: TaskArguments, args: WinnowConfig, model_args: ModelConfig) -> dict[str, Any]:
    """Every field of the parsed recipe (defaults included) as one flat mapping that ``--config`` reads back, its
    secrets redacted (trainer/config/redaction.py: a re-run reads them from the environment or the command line)."""
    out: dict[str, Any] = {}
    for obj in (task, model_args, args):
        out.update({f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                    if f.init and f.name not in NOT_RESOLVED})
    return redaction.redact(out)


def save_resolved_recipe(recipe: dict[str, Any], path: str | Path) -> None:
    """Write :func:`resolved_recipe`'s mapping so a run folder documents -- and re-runs -- its own experiment."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# Every field of this run (defaults included). "
        "Re-run: python launch/train.py --config THIS_FILE --output_dir NEW\n"
    )
    Path(path).write_text(header + yaml.safe_dump(recipe, sort_keys=True))


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):  # before str: TrainingArguments' strategies are str-valued enums
        return _plain(value.value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # e.g. TrainingArguments.accelerator_config
        return _plain(dataclasses.asdict(value))
    return str(value)
