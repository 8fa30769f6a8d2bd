"""What a training launch reports (issue 35, items 8 and 10): its W&B run (project, name, the whole recipe as config,
recipe.resolved.yaml among its files, the same run continued by a resume), its model card (winnow-rl's tags, the
method and the dataset), its console (winnow's INFO lines, the closing lines naming the run's files, --dry-run in
--help, no per-step FutureWarning from TRL).

One fresh 1-step run and its 2-step resume through launch/train.py's ``main`` (W&B offline, read back from the run's
transaction log); everything else is checked without training."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from harness import TRAIN_CLI_RECIPE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launch"))

import train as train_cli  # noqa: E402  (launch/train.py)

RECIPE = {**TRAIN_CLI_RECIPE, "report_to": "wandb"}
# TRL 1.16 calls these deprecated transformers aliases at every step (trainer/tools/console.py)
STEP_WARNINGS = ("is_gradient_checkpointing", "gradient_checkpointing_disable", "gradient_checkpointing_enable")


def _wandb_run(folder: Path, timeout: float = 30.0) -> tuple[object, dict, list[str]]:
    """(run record, logged config, saved files) of the offline run in ``folder``, from its ``run-<id>.wandb``
    transaction log (wandb 0.31 writes no config.yaml offline), once its exit record is written."""
    from grpo_trainer.test_wandb import _read_records
    from wandb.proto import wandb_internal_pb2

    [log] = folder.glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        records = _read_records(log.read_bytes(), wandb_internal_pb2)
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}  # wandb.init(config=...)
    for rec in records:
        if rec.WhichOneof("record_type") == "config":  # config.update: WandbCallback's args and model config
            config.update({item.key: json.loads(item.value_json) for item in rec.config.update})
    files = [f.path for rec in records if rec.WhichOneof("record_type") == "files" for f in rec.files.files]
    return run, config, files


def test_wandb_run_card_and_console_of_a_run_and_its_resume(tmp_path, capsys, monkeypatch):
    """A 1-step run with report_to wandb (offline): its W&B run is in project winnow-rl, named after the output
    folder, its config holds the whole recipe and recipe.resolved.yaml is among its files; the model card carries
    winnow-rl's tag and the dataset; winnow's INFO lines and the closing lines (paths that exist) are printed, and
    TRL's per-step FutureWarnings are not. A resume (--resume_from_checkpoint true, 2 steps) logs into the same
    run id."""
    import wandb

    for key, value in dict(WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true", WANDB_CONSOLE="off",
                           WANDB__DISABLE_STATS="true").items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "arith-exp-7"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "output_dir": str(out)}))
    capsys.readouterr()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("default")
            assert train_cli.main(["--config", str(recipe)]) == 0
        printed = capsys.readouterr()
        first_recipe = (out / "recipe.resolved.yaml").read_text()  # the resume rewrites it (max_steps: 2)
        assert train_cli.main(["--config", str(recipe), "--resume_from_checkpoint", "true", "--max_steps", "2"]) == 0
        resumed_printed = capsys.readouterr()
    finally:
        wandb.finish()
        wandb.teardown()  # wandb keeps its process-wide settings (WANDB_DIR) until then: a later run would write here

    first, second = sorted((tmp_path / "wandb").glob("offline-run-*"))  # named by start time
    run, config, files = _wandb_run(first)
    assert (run.project, run.display_name) == ("winnow-rl", "arith-exp-7")
    assert config["dataset_name"] == "arithmetic" and config["reward_funcs"] == ["math_accuracy", "think_format"]
    assert config["dataset_kwargs"] == {"num_samples": 16, "seed": 1}
    assert config["model_name_or_path"] == "offline:tiny-qwen3" and config["use_peft"] is False
    assert "lora_r" in config and "launch_processes" in config and config["rollout_dropout"] == "none"
    assert config["learning_rate"] == 1e-3 and config["model/num_parameters"] > 0  # WandbCallback's additions kept
    assert "recipe.resolved.yaml" in files
    assert (first / "files" / "recipe.resolved.yaml").read_text() == first_recipe
    assert (out / "wandb_run_id").read_text().strip() == run.run_id

    resumed, resumed_config, _ = _wandb_run(second)
    assert resumed.run_id == run.run_id and resumed.display_name == "arith-exp-7"
    assert resumed_config["max_steps"] == 2
    assert (second / "files" / "recipe.resolved.yaml").read_text() == (out / "recipe.resolved.yaml").read_text()
    assert (out / "wandb_run_id").read_text().strip() == run.run_id

    card = (out / "README.md").read_text()
    meta = yaml.safe_load(card.split("---")[1])
    assert {"winnow-rl", "grpo", "trl"} <= set(meta["tags"])
    assert "trained with winnow-rl: GRPO (every stage off: TRL's GRPO), on the `arithmetic` dataset." in card

    assert "[INFO|trainer.data] arithmetic: generated 16" in printed.err
    assert "[INFO|trainer.cli.train] training offline:tiny-qwen3 on arithmetic" in printed.err
    assert f"[INFO|trainer.tools.wandb_run] W&B run arith-exp-7 (id {run.run_id}) in project winnow-rl" in printed.err
    closing = printed.out[printed.out.index("Training done (1 steps)"):].splitlines()
    listed = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in closing[1:] if line.startswith("  "))
    wandb_line = listed.pop("W&B run")
    assert listed.keys() == {"model", "metrics", "plot", "recipe", "model card"}, closing
    assert all(Path(path).exists() for path in listed.values()), closing
    assert listed["metrics"] == str(out.resolve() / "metrics.jsonl") and listed["model"] == str(out.resolve())
    assert wandb_line.startswith(f"{first} (offline: `wandb sync {first}`"), closing
    assert "Training done (2 steps)" in resumed_printed.out and str(second) in resumed_printed.out

    step_warnings = [str(w.message) for w in seen if any(f"`{name}`" in str(w.message) for name in STEP_WARNINGS)]
    assert not step_warnings, step_warnings[:3]


def test_help_lists_dry_run():
    from trainer.recipe import recipe_parser

    text = " ".join(recipe_parser().format_help().split())
    run_section = text[text.index("run:"):text.index("task: what to train on:")]
    assert "--dry-run Check the launch and print the preflight" in run_section
    assert "--wandb_project" in run_section and "default: WANDB_PROJECT, else winnow-rl" in run_section
    assert "--run_name" in run_section and "default: the output folder's name" in run_section


def test_wandb_project_id_and_name_defaults(tmp_path, monkeypatch):
    """Project: field, else WANDB_PROJECT, else winnow-rl. Id: WANDB_RUN_ID, else the kept id on a resume only (a
    fresh start gets wandb's new one), else None. Name: the output folder's."""
    from trainer.tools import wandb_run

    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    assert wandb_run.project_name(None) == "winnow-rl"
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    assert wandb_run.project_name(None) == "from-env" and wandb_run.project_name("field") == "field"
    (tmp_path / wandb_run.RUN_ID_FILE).write_text("abc123\n")
    assert wandb_run.run_id(str(tmp_path), resumed=True) == "abc123"
    assert wandb_run.run_id(str(tmp_path), resumed=False) is None
    assert wandb_run.run_id(str(tmp_path / "empty"), resumed=True) is None
    monkeypatch.setenv("WANDB_RUN_ID", "fromenv1")
    assert wandb_run.run_id(str(tmp_path), resumed=True) == "fromenv1"
    assert wandb_run.default_run_name(str(tmp_path / "runs" / "exp-3")) == "exp-3"
    assert not wandb_run.reports_to_wandb(SimpleNamespace(report_to=[]))
    assert wandb_run.reports_to_wandb(SimpleNamespace(report_to=["tensorboard", "wandb"]))


def test_method_tags_and_card_dataset(tmp_path):
    from trainer.tools.model_card import hub_dataset_id, method_tags, method_text

    off = SimpleNamespace(rollout_filter="none", rollout_dropout="none", advantage="grpo", loss_variant="none")
    assert method_tags(off) == [] and method_text(off) == "GRPO (every stage off: TRL's GRPO)"
    on = SimpleNamespace(rollout_filter="snr", rollout_dropout="grpodropout", advantage="grpo", loss_variant="kl_cov")
    assert method_tags(on) == ["rollout_filter:snr", "rollout_dropout:grpodropout", "loss_variant:kl_cov"]
    assert method_text(on) == "GRPO with rollout_filter `snr`, rollout_dropout `grpodropout`, loss_variant `kl_cov`"
    assert hub_dataset_id("org/data", None, registered=False) == "org/data"
    assert hub_dataset_id("arithmetic", None, registered=True) is None
    assert hub_dataset_id("dapo_math_17k", {"path": "open-r1/DAPO-Math-17k-Processed"}, True) == \
        "open-r1/DAPO-Math-17k-Processed"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("")
    assert hub_dataset_id(str(tmp_path / "data"), None, registered=False) is None  # a local path is no Hub dataset
    assert hub_dataset_id("data/train.jsonl", None, registered=False) is None  # nor a (relative) data file


def test_card_names_method_dataset_and_local_base_model(tmp_path):
    """create() around TRL's card: the stages that are on become tags and a line of text with the dataset, and a
    local base model is named by its path where TRL wrote [None]."""
    from trainer.tools.model_card import CardFacts, create

    def trl_card(model_name=None, dataset_name=None, tags=None):  # what TRL's create_model_card writes, in short
        (tmp_path / "README.md").write_text(
            f"---\ndatasets: {dataset_name}\ntags: {sorted(tags)}\n---\nThis model is a fine-tuned version of "
            "[None](https://huggingface.co/None).\nIt has been trained using [TRL](https://github.com/huggingface/trl).\n")

    args = SimpleNamespace(output_dir=str(tmp_path), rollout_filter="none", rollout_dropout="grpodropout",
                           advantage="grpo", loss_variant="none")
    trainer = SimpleNamespace(args=args, model=SimpleNamespace(config=SimpleNamespace(_name_or_path="x")),
                              is_world_process_zero=lambda: True,
                              card_facts=CardFacts("/models/base", "/models/base", "dapo_math_17k",
                                                   "open-r1/DAPO-Math-17k-Processed"))
    create(trainer, trl_card, model_name="run", tags=["mine"])
    card = (tmp_path / "README.md").read_text()
    assert "datasets: open-r1/DAPO-Math-17k-Processed" in card
    assert "tags: ['mine', 'rollout_dropout:grpodropout']" in card
    assert "fine-tuned version of `/models/base` (a local model)." in card
    assert ("It has been trained with winnow-rl: GRPO with rollout_dropout `grpodropout`, on the `dapo_math_17k` "
            "dataset.") in card


def test_card_of_an_offline_alias_names_the_published_model(tmp_path):
    """An offline: alias loads from a local folder, so TRL's real card (generate_model_card with TRL's template)
    has no base model; the winnow card names the published model the alias was built from, in the metadata and the
    link, as TRL names a Hub model."""
    from trl.trainer.utils import generate_model_card

    from trainer.tools.model_card import CardFacts, create

    def trl_card(model_name=None, dataset_name=None, tags=None):
        card = generate_model_card(base_model=None, model_name=model_name, hub_model_id="run",
                                   dataset_name=dataset_name, tags=tags, wandb_url=None, comet_url=None,
                                   trackio_url=None, trainer_name="GRPO")
        card.save(tmp_path / "README.md")

    args = SimpleNamespace(output_dir=str(tmp_path), rollout_filter="none", rollout_dropout="none",
                           advantage="grpo", loss_variant="none")
    trainer = SimpleNamespace(args=args, is_world_process_zero=lambda: True,
                              card_facts=CardFacts("offline:smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                   "arithmetic", None))
    create(trainer, trl_card, model_name="run", tags=["winnow-rl"])
    card = (tmp_path / "README.md").read_text()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and "winnow-rl" in meta["tags"]
    assert ("fine-tuned version of [HuggingFaceTB/SmolLM2-135M-Instruct]"
            "(https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct)") in card
    assert "[None]" not in card and "trained with winnow-rl: GRPO (every stage off" in card


def test_winnow_log_level_and_held_lines(capsys):
    """passive: INFO on the process that logs, WARNING on the others; an explicit log_level wins. Lines logged
    before the checks pass wait, and are dropped when a recipe error is the one line to show."""
    from trainer.tools import console

    args = SimpleNamespace(log_level="passive", log_level_replica="passive", log_on_each_node=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("LOCAL_RANK", raising=False)
        assert console.winnow_log_level(args) == logging.INFO
        assert console.winnow_log_level(SimpleNamespace(**{**vars(args), "log_level": "error"})) == logging.ERROR
        mp.setenv("LOCAL_RANK", "1")
        assert console.winnow_log_level(args) == logging.WARNING
        mp.delenv("LOCAL_RANK")
        log = logging.getLogger("rewards.probe")
        console.configure_logging(args)
        log.info("held then dropped")
        assert "held then dropped" not in capsys.readouterr().err
        console.release_held(show=False)
        console.configure_logging(args)
        log.info("held then shown")
        assert "held then shown" not in capsys.readouterr().err
        console.release_held()
        log.info("straight through")
        log.debug("below the level")
        err = capsys.readouterr().err
        assert err.splitlines() == ["[INFO|rewards.probe] held then shown", "[INFO|rewards.probe] straight through"]


def test_only_trls_step_warnings_are_silenced(tiny_model):
    """The filter drops transformers' FutureWarnings for the deprecated checkpointing aliases (as TRL calls them),
    and nothing else: another message of the same module, or the same message from another module, still shows."""
    from transformers import AutoModelForCausalLM

    from trainer.tools import console

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        console.quiet_trl_step_warnings()
        assert model.is_gradient_checkpointing is False
        model.gradient_checkpointing_enable()
        model.gradient_checkpointing_disable()
        warnings.warn_explicit("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning,
                               "user.py", 1, module="user_code")
        warnings.warn_explicit("`other_alias` is deprecated and will be removed in v6.", FutureWarning,
                               "modeling_utils.py", 1, module="transformers.modeling_utils")
    assert [(str(w.message).split("`")[1], w.filename) for w in seen if w.category is FutureWarning] == [
        ("is_gradient_checkpointing", "user.py"), ("other_alias", "modeling_utils.py")]


def test_a_run_refused_in_train_marks_its_wandb_run_failed(tmp_path, capsys, monkeypatch):
    """A recipe error raised once the W&B run is open (a resume that cannot continue exactly is refused in
    ``train``) prints one line, returns 2, and finishes the W&B run with exit code 1, not as a finished run."""
    import wandb

    from trainer import WinnowGRPOTrainer
    from trainer.config.errors import ConfigError

    for key, value in dict(WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true", WANDB_CONSOLE="off",
                           WANDB__DISABLE_STATS="true").items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)

    def refused(self, *args, **kwargs):
        raise ConfigError("resume_from_checkpoint", "the checkpoint cannot continue its generation batch exactly",
                          "resume from a checkpoint at a generation-batch boundary")

    monkeypatch.setattr(WinnowGRPOTrainer, "train", refused)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "output_dir": str(tmp_path / "refused")}))
    try:
        assert train_cli.main(["--config", str(recipe)]) == 2
    finally:
        wandb.teardown()
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: WinnowConfig.resume_from_checkpoint")
    from grpo_trainer.test_wandb import _read_records
    from wandb.proto import wandb_internal_pb2

    [log] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    records = _read_records(log.read_bytes(), wandb_internal_pb2)
    [exit_record] = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 1


def test_wandb_records_the_redacted_command_line(tmp_path, monkeypatch):
    """W&B records sys.argv in its run file (issue "Security II", item 2: ``--hub_token`` and a password in
    ``--vllm_server_base_url`` reached run-*.wandb on main). During the run sys.argv is the redacted command line,
    after it the real one again; the offline run file holds neither secret."""
    import sys

    import wandb

    from trainer.tools import wandb_run

    secret, password = "hf_WANDBsecret123", "pw-in-the-url-9"
    argv = ["launch/train.py", "--hub_token", secret, "--vllm_server_base_url", f"http://u:{password}@h:8000"]
    monkeypatch.setattr(sys, "argv", list(argv))
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                       "WANDB__DISABLE_STATS": "true"}.items():
        monkeypatch.setenv(key, value)
    args = SimpleNamespace(report_to=["wandb"], run_name="r", output_dir=str(tmp_path / "out"))
    try:
        with wandb_run.started(args, "p", {"lr": 1}, tmp_path / "none.yaml", False, True) as run:
            assert secret not in " ".join(sys.argv) and password not in " ".join(sys.argv)
            assert run is not None and secret not in " ".join(run.settings._args)
        assert sys.argv == argv
        written = b"".join(p.read_bytes() for p in tmp_path.rglob("*.wandb"))
        assert written and secret.encode() not in written and password.encode() not in written
    finally:
        wandb.teardown()
