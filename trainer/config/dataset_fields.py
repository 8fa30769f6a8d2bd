"""Recipe fields of a generic dataset (a Hub id or local path in ``dataset_name``), mixed into ``TaskArguments``.

``dataset_config``, ``dataset_train_split``, ``dataset_test_split`` and ``dataset_streaming`` have the names,
defaults and meaning of TRL's ``ScriptArguments`` (trl/scripts/utils.py), so a ``trl grpo`` recipe's dataset keys
read the same here. They are declared, not inherited: ``ScriptArguments`` also brings ``dataset_name`` (default None;
winnow-rl's is ``arithmetic``) and ``ignore_bias_buffers``, a DDP debugging switch of TRL's DPO example that
``trl grpo`` itself never reads -- inheriting it would add a field that does nothing. ``dataset_columns`` is
winnow-rl's: a column mapping for files whose columns have other names (verl's parquet).

A registered loader (trainer/data/__init__.py) ignores these fields, so giving one with it is refused; its split and
columns are keyword arguments in ``dataset_kwargs``. Loading (trainer/data/generic.py) happens in
``prepare_run``; every failure there is one :class:`RecipeError` line, before any weights load.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, fields
from typing import Any

from trainer.config.errors import RecipeError
from trainer.data import list_task_datasets
from trainer.data.common import DatasetUnavailableError, MissingSplitError
from trainer.data.generic import GENERIC_KWARGS, load_generic, load_generic_split


@dataclass
class DatasetFields:
    """How a Hub id or local path in ``dataset_name`` is read (TRL's ScriptArguments names, plus a column map)."""

    dataset_config: str | None = field(
        default=None,
        metadata={"help": "Dataset configuration name (datasets.load_dataset's `name`), as in TRL's scripts. Hub ids "
                  "and local folders only."},
    )
    dataset_train_split: str = field(
        default="train",
        metadata={"help": "Split to train on (a single local file or saved Dataset is that split, whatever its "
                  "name), as in TRL's scripts."},
    )
    dataset_test_split: str = field(
        default="test",
        metadata={"help": "Split to evaluate on when eval_strategy is not 'no', as in TRL's scripts (a Hub id or a "
                  "folder with e.g. train.parquet and test.parquet; a single file has none)."},
    )
    dataset_streaming: bool = field(
        default=False,
        metadata={"help": "Read the dataset as a stream (datasets' IterableDataset) instead of loading it whole, as "
                  "in TRL's scripts; needs max_steps (a stream has no length) and no dynamic_sampling."},
    )
    dataset_columns: dict | str | None = field(
        default=None,
        metadata={"help": "Columns to add under the names the trainer and rewards read: {new_name: column or "
                  "dotted.path into a struct column}, e.g. verl's parquet {answer: reward_model.ground_truth}, or "
                  "{prompt: messages}. A mapping in YAML, a JSON string on the command line. Every column stays and "
                  "reaches the reward functions as a keyword argument; `prompt` is used as it is (a string, or chat "
                  "messages)."},
    )

    dataset_prompt_column: str | None = field(
        default=None,
        metadata={"help": "Build the chat prompt from this text column: [system_prompt as a system message, if set] + "
                  "the column as the user message, as open-r1's grpo.py does (open-r1's default is `problem`; "
                  "winnow-rl's, None, uses the `prompt` column as it is, as TRL does). The column itself stays."},
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System message put before the user message built from dataset_prompt_column (open-r1's "
                  "system_prompt). A registered loader takes its own in dataset_kwargs."},
    )

    def validate_dataset_fields(self) -> None:
        """``dataset_columns`` as a ``{str: str}`` mapping (parsed from JSON on the command line)."""
        columns = self.dataset_columns
        if isinstance(columns, str):
            try:
                columns = json.loads(columns)
            except json.JSONDecodeError as e:
                raise RecipeError("dataset_columns", f"not valid JSON ({e})",
                                  'pass e.g. \'{"answer": "reward_model.ground_truth"}\'') from None
        if columns is not None and not (isinstance(columns, dict) and all(
                isinstance(k, str) and k and isinstance(v, str) and v for k, v in columns.items())):
            raise RecipeError("dataset_columns", f"must map new column names to columns (got {columns!r})",
                              "write e.g. {answer: reward_model.ground_truth, prompt: question}")
        self.dataset_columns = columns or None
        if self.system_prompt is not None and self.dataset_prompt_column is None:
            raise RecipeError("system_prompt", "applies to the prompt built from dataset_prompt_column, which is not "
                              "set (a ready `prompt` column is used as it is)",
                              "set dataset_prompt_column: <the text column> (open-r1's default is problem), or put "
                              "the system message into the dataset's chat prompts")


def is_registered(name: str) -> bool:
    """Whether ``name`` is a registered loader (else a Hub id or local path, trainer/data/generic.py)."""
    return name in list_task_datasets()


def check_dataset_fields(task: Any, args: Any) -> None:
    """The generic fields against the dataset kind and the trainer's fields (before anything loads)."""
    if is_registered(task.dataset_name):
        defaults = {f.name: f.default for f in fields(DatasetFields)}
        given = [name for name, default in defaults.items() if getattr(task, name) != default]
        if given:
            raise RecipeError(given[0], f"applies to a Hub id or local path in dataset_name, not to the registered "
                              f"loader {task.dataset_name!r}",
                              "remove it (a registered loader takes its split and column options in dataset_kwargs, "
                              "e.g. {split: test}), or set dataset_name to the file, folder or Hub id")
        return
    if task.dataset_streaming and args.max_steps <= 0:
        raise RecipeError("dataset_streaming", "a streamed dataset has no length, so the run cannot count its epochs",
                          "set max_steps: N (or dataset_streaming: false)")
    evaluates = str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no"
    if getattr(args, "low_success_stop_steps", 0) and evaluates:
        # its evaluation on dataset_test_split logs rewards, not the env/success_rate the stop reads (it would fail at
        # the first evaluation, after the weights loaded)
        raise RecipeError("low_success_stop_steps", "reads the environment tasks' evaluation success rate, which a "
                          "Hub id or local dataset does not log", "set low_success_stop_steps: 0 for this task")
    if task.dataset_streaming and args.dynamic_sampling:
        raise RecipeError("dataset_streaming", "dynamic_sampling refills groups by indexing the training set, which "
                          "a stream cannot", "set dataset_streaming: false, or dynamic_sampling: false")


def load_generic_inputs(task: Any, eval_strategy: str) -> tuple[Any, Any]:
    """(training set, evaluation set or None) of a generic ``dataset_name``; every failure a :class:`RecipeError`
    line naming the field to change. The evaluation set is ``dataset_test_split`` when ``eval_strategy`` is not
    ``no``, as ``trl grpo`` does."""
    kwargs = dict(task.dataset_kwargs or {})
    unknown = sorted(set(kwargs) - set(GENERIC_KWARGS))
    if unknown:
        raise RecipeError("dataset_kwargs", f"{unknown} are not options of a Hub id or local path "
                          f"({task.dataset_name!r} is not a registered loader)",
                          f"use only {', '.join(GENERIC_KWARGS)}, or name a registered loader in dataset_name")
    common = dict(config=task.dataset_config, streaming=task.dataset_streaming, columns=task.dataset_columns,
                  prompt_column=task.dataset_prompt_column, system_prompt=task.system_prompt, **kwargs)
    try:
        train = load_generic(task.dataset_name, split=task.dataset_train_split, **common)
    except MissingSplitError as e:
        raise RecipeError("dataset_train_split", " ".join(str(e).split()),
                          "name one of the dataset's splits") from None
    except (FileNotFoundError, DatasetUnavailableError) as e:
        problem = " ".join(str(e).split(" Fix: ")[0].split())  # the hub error's own fix is said again below
        raise RecipeError("dataset_name", f"{task.dataset_name!r} is not a registered loader, and as a path or Hub "
                          f"id: {problem}", _not_found_fix(task.dataset_name)) from None
    except ValueError as e:
        field_name = "dataset_columns" if task.dataset_columns else "dataset_name"
        raise RecipeError(field_name, " ".join(str(e).split()),
                          "map a column to the name the trainer reads, e.g. dataset_columns: {prompt: question} "
                          "(a string or a list of {role, content} messages)") from None
    if eval_strategy == "no":
        return train, None
    try:
        test = load_generic_split(task.dataset_name, task.dataset_test_split, **common)
    except MissingSplitError as e:
        raise RecipeError("eval_strategy", f"no evaluation set: {' '.join(str(e).split())}",
                          "set eval_strategy: no (and evaluate checkpoints with launch/eval.py), or name an existing "
                          "split in dataset_test_split (a folder with train.parquet and test.parquet has 'test')",
                          ) from None
    return train, test


def _not_found_fix(name: str) -> str:
    registered = list_task_datasets()
    close = difflib.get_close_matches(name, registered, n=1)
    mean = f"did you mean the registered {close[0]!r}? " if close else ""
    return (f"{mean}use a registered loader ({', '.join(registered)}), a local .parquet/.jsonl/.json/.csv file or "
            "folder, or a Hub id in the local cache (hf download --repo-type dataset ID on a machine with hub access)")
