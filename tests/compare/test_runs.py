"""winnow-compare's plan, skip/resume/failure handling (trainer/compare/plan.py, runner.py) and its report's pairing
check and paired numbers (report.py), on run folders written the way the trainer writes them.

The runner's trainer here is a small script standing in for ``python -m trainer.cli.train`` (``--launcher``): it
records its arguments and writes a metrics.jsonl, so the test sees which runs were started, resumed and skipped. The
real trainer's side of the contract (the end-of-training record, the prompt digest) is tested below on
:func:`prompt_digest` and by the committed CPU comparison (docs/comparison/).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.compare import plan, report, runner
from trainer.config.errors import RecipeError
from trainer.pipeline.step_logs import PROMPT_DIGEST, prompt_digest

FAKE_TRAINER = r'''
import json, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--output_dir") + 1]); out.mkdir(parents=True, exist_ok=True)
with open(out.parent.parent / "calls.jsonl", "a") as fh:
    fh.write(json.dumps(args) + "\n")
if "--fail" in args:
    sys.exit(3)
seed = int(args[args.index("--seed") + 1])
with open(out / "metrics.jsonl", "a") as fh:
    for step in (1, 2, 3, 4):
        fh.write(json.dumps({"step": step, "reward": 0.1 * step, "step_time": 1.0, "completions/mean_length": 10.0,
                             "data/prompt_digest": float(seed * 100 + step)}) + "\n")
    fh.write(json.dumps({"step": 4, "train_runtime": 4.0}) + "\n")
'''


def write_run(folder: Path, rewards, seed: int, finished: bool = True, digest_offset: int = 0):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [{"step": i + 1, "reward": float(r), "step_time": 2.0, "completions/mean_length": 5.0,
              PROMPT_DIGEST: float(seed * 100 + i + 1 + (digest_offset if i >= 2 else 0))}
             for i, r in enumerate(rewards)]
    if finished:
        lines.append({"step": len(rewards), "train_runtime": 1.0})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "recipe.resolved.yaml").write_text("per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n"
                                                  "launch_processes: 2\n")


def test_arm_specs(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 1\n")
    assert plan.parse_arm("grpo") == plan.Arm("grpo")
    arm = plan.parse_arm("drop:rollout_dropout=grpodropout --dropout_delete=positive")
    assert arm.overrides == (("rollout_dropout", "grpodropout"), ("dropout_delete", "positive"))
    assert plan.parse_arm(f"own:{recipe}").recipe == str(recipe)
    bad_specs = (("a b:x=1", "name"), ("x:seed=3", "seed"), ("x:novalue", "key=value"), ("x:missing.yaml", "no"))
    for bad, field in bad_specs:
        with pytest.raises(RecipeError, match=field):
            plan.parse_arm(bad)
    with pytest.raises(RecipeError, match="repeat"):
        plan.plan("r.yaml", [plan.Arm("a"), plan.Arm("a")], [0], tmp_path)
    runs = plan.plan("r.yaml", [plan.Arm("a"), arm], [0, 1], tmp_path, ["--max_steps", "4"])
    assert [r.label for r in runs] == ["a/seed-0", "drop/seed-0", "a/seed-1", "drop/seed-1"]  # seed-major
    assert runs[1].train_args(resume=True) == [
        "--config", "r.yaml", "--rollout_dropout", "grpodropout", "--dropout_delete", "positive", "--max_steps", "4",
        "--seed", "0", "--output_dir", str(tmp_path / "drop" / "seed-0"), "--resume_from_checkpoint", "auto"]


def test_a_half_finished_comparison_continues(tmp_path):
    trainer = tmp_path / "fake_train.py"
    trainer.write_text(FAKE_TRAINER)
    root = tmp_path / "cmp"
    arms = [plan.Arm("base"), plan.Arm("other", overrides=(("x", "1"),)),
            plan.Arm("broken", overrides=(("fail", "1"),))]
    runs = plan.plan("r.yaml", arms, [0, 1], root)
    write_run(root / "base" / "seed-0", [0.1, 0.2], seed=0)  # finished earlier
    write_run(root / "other" / "seed-0", [0.1], seed=0, finished=False)  # killed mid-run
    # the fake script stands in for `python -m trainer.cli.train`: drop the "-m trainer.cli.train" the runner adds
    launcher_script = tmp_path / "launch.py"
    launcher_script.write_text("import runpy, sys\nsys.argv = [sys.argv[0]] + sys.argv[3:]\n"
                               f"runpy.run_path({str(trainer)!r}, run_name='__main__')\n")
    outcomes = runner.run_local(runs, launcher=[sys.executable, str(launcher_script)], progress=False)
    calls = [json.loads(line) for line in (root / "calls.jsonl").read_text().splitlines()]
    started = [c[c.index("--output_dir") + 1].split("cmp/")[1] for c in calls]
    assert "base/seed-0" not in started  # finished: not run again
    assert outcomes["base/seed-0"] == "finished"
    resumed = [c for c in calls if c[c.index("--output_dir") + 1].endswith("other/seed-0")]
    assert resumed and resumed[0][-2:] == ["--resume_from_checkpoint", "auto"]  # started: resumed
    fresh = [c for c in calls if c[c.index("--output_dir") + 1].endswith("base/seed-1")]
    assert "--resume_from_checkpoint" not in fresh[0]
    assert outcomes["broken/seed-0"].startswith("failed (exit 3") and outcomes["broken/seed-1"].startswith("failed")
    assert outcomes["other/seed-1"] == "ok"  # the rest went on after a failure
    assert plan.read_status(root / "broken" / "seed-0")["exit_status"] == 3
    # a second invocation runs only what is not finished: the two failed runs
    (root / "calls.jsonl").unlink()
    runner.run_local(runs, launcher=[sys.executable, str(launcher_script)], progress=False)
    again = [json.loads(line) for line in (root / "calls.jsonl").read_text().splitlines()]
    assert sorted(c[c.index("--output_dir") + 1].split("cmp/")[1] for c in again) == ["broken/seed-0", "broken/seed-1"]
    text = report.build_report(runs, report.read_logs(runs), ["base", "other", "broken"], [0, 1],
                               "winnow-compare ...", None)
    assert "broken/seed-0: failed (exit 3" in text


def test_slurm_lines_hold_the_runs_left(tmp_path):
    arms = [plan.Arm("a"), plan.Arm("b", recipe="b.yaml")]
    runs = plan.plan("r.yaml", arms, [0, 1], tmp_path, ["--max_steps", "4"])
    write_run(tmp_path / "a" / "seed-0", [0.1], seed=0)
    command = runner.submit_slurm(runs, tmp_path, ["--nodes=2"], dry_run=True)
    lines = (tmp_path / runner.RUNS_FILE).read_text().splitlines()
    assert command[:2] == ["sbatch", "--array=0-2"] and command[-1] == runner.SLURM_SCRIPT
    assert lines[0].split("\t") == ["b.yaml", f"--max_steps 4 --seed 0 --output_dir {tmp_path / 'b' / 'seed-0'}"]
    assert [line.split("\t")[0] for line in lines] == ["b.yaml", "r.yaml", "b.yaml"]


def test_report_pairing_and_paired_numbers(tmp_path):
    arms = [plan.Arm("base"), plan.Arm("better"), plan.Arm("drifted")]
    runs = plan.plan("r.yaml", arms, [0, 1, 2], tmp_path)
    rng = np.random.default_rng(0)
    for seed in (0, 1, 2):
        curve = rng.uniform(0, 1, 8)
        write_run(tmp_path / "base" / f"seed-{seed}", curve, seed)
        write_run(tmp_path / "better" / f"seed-{seed}", curve + 0.5, seed)  # a constant shift of 0.5
        write_run(tmp_path / "drifted" / f"seed-{seed}", curve, seed, digest_offset=7 if seed == 1 else 0)
    logs = report.read_logs(runs)
    assert logs["base/seed-0"].generated_tokens[-1] == pytest.approx(8 * 5.0 * 4 * 2 * 2)  # length x rollouts
    assert logs["base/seed-0"].wall_s[-1] == pytest.approx(16.0)
    ok, problems = report.pairing(logs, [0, 1, 2], ["base", "better", "drifted"])
    assert not ok and problems == ["seed 1: drifted saw other prompts than base from step 3 on"]
    ok, _ = report.pairing(logs, [0, 1, 2], ["base", "better"])
    assert ok
    text = report.build_report(runs, logs, ["base", "better", "drifted"], [0, 1, 2], "cmd", "f.png")
    row = next(line for line in text.splitlines() if line.startswith("| better | final reward |"))
    assert "| 3 | 0.500 | [0.500, 0.500] | 1.00 | 3 of 3 |" in row
    row = next(line for line in text.splitlines() if line.startswith("| drifted | reward AUC |"))
    assert "| 3 | 0.000 | [0.000, 0.000] | 0.50 | 0 of 3 |" in row
    assert "NOT held" in text
    pytest.importorskip("matplotlib")
    assert report.plot(logs, ["base", "better"], tmp_path / "f.png").stat().st_size > 10_000


class _OneProcess:
    def gather(self, t):
        return t


class _TwoProcesses:
    """Rank 0's view of a 2-process gather: its rows, then the other rank's (as accelerate concatenates them)."""

    def __init__(self, other_output):
        self.other = other_output

    def gather(self, t):
        import zlib

        ids, mask = self.other["prompt_ids"], self.other["prompt_mask"].bool()
        theirs = [zlib.crc32(r[m].to(torch.int64).numpy().tobytes()) for r, m in zip(ids, mask)]
        return torch.cat([t, torch.tensor(theirs, dtype=torch.int64)])


def test_prompt_digest_sees_order_and_tokens_not_padding():
    ids = torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    digest = prompt_digest({"prompt_ids": ids, "prompt_mask": mask}, _OneProcess())
    repadded = prompt_digest({"prompt_ids": torch.tensor([[1, 1, 1, 5, 6], [1, 1, 7, 8, 9]]),
                              "prompt_mask": torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])}, _OneProcess())
    swapped = prompt_digest({"prompt_ids": ids.flip(0), "prompt_mask": mask.flip(0)}, _OneProcess())
    assert digest == repadded and digest != swapped and digest == float(int(digest)) < 2**32
    # 2 processes holding a row each log what 1 process holding both logs
    halves = prompt_digest({"prompt_ids": ids[:1], "prompt_mask": mask[:1]},
                           _TwoProcesses({"prompt_ids": ids[1:], "prompt_mask": mask[1:]}))
    assert halves == digest


def test_every_reader_of_metrics_jsonl_passes_over_a_line_a_kill_cut_short(tmp_path):
    """One reader (trainer/tools/run_artifacts.read_records) for the plot, the eval report's curves and the
    comparison: a run killed while writing its last record leaves half a line, which all of them pass over."""
    from trainer.eval.report import read_run_metrics
    from trainer.tools.run_artifacts import read_metrics

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.7}\n\n{"step": 3, "rew')
    assert [r["step"] for r in plan.read_records(run)] == [1, 2]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    assert [r["step"] for r in read_run_metrics(run)] == [1, 2]
    assert plan.read_records(tmp_path / "absent") == []
    with pytest.raises(FileNotFoundError):
        read_run_metrics(tmp_path / "absent")
