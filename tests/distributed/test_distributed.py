"""Distributed correctness, tested for real: 2 CPU processes over gloo, and DeepSpeed ZeRO-3 on 2 CPU processes.

Two launches (each costs ~15-30 s of start-up) run every multi-process scenario of
tests/distributed/scenarios.py; one plain process runs the same scenarios on the same global batch as the
reference. Each rank holds different local rows; the pipeline must make identical decisions on both ranks
(and the same as one process), and training must produce the same parameters as one process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from launches import SCRIPT, one_process_reference, run_logged

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
DDP_SCENARIOS = ["filter_dapo", "filter_grpo_kl_accum", "off_dr_grpo", "filter_grpodropout", "authors_grpodropout",
                 "snr_collapse_empty_step",
                 "filter_grpo_kl_accum_masked", "rank_keeps_none", "rank_keeps_none_masked", "filter_dapo_masked",
                 "clip_cov", "kl_cov", "beyond8020", "dynamic_sampling", "uecr", "env_rollout", "ppo",
                 # token-budget chunks; bnpo is left out: its normaliser counts each rank's own tokens, so 2
                 # processes differ from 1 by TRL's definition (chunked vs unchunked bnpo is checked below)
                 "tail_grpo_kl_accum", "budget_grpo_kl_accum", "tail_dr_grpo", "budget_dr_grpo", "tail_dapo",
                 "budget_dapo", "balanced_grpo_kl_accum", "balanced_dapo_all_kept", "overlap",
                 "overlap_dynamic_sampling"]
PARAM_TOL = 1e-5  # fp32 reduction order differs between 1 and 2 processes; measured max diff ~4e-7


@pytest.fixture(scope="module")
def results(request, tmp_path_factory, tiny_model) -> Path:
    """reference/ (one process, built once per source state: tests/distributed/launches.py), world2/ (DDP) and
    world2-zero3/ (ZeRO-3), each scenario's per-rank records and final parameters."""
    out = tmp_path_factory.mktemp("distributed")
    (out / "reference").symlink_to(one_process_reference(request.config, tmp_path_factory), target_is_directory=True)
    launch = [ACCELERATE, "launch", "--config_file"]
    run_logged(
        launch + ["launch/accelerate/multi_cpu_2.yaml", str(SCRIPT), "--out", str(out), "--suite", "ddp"],
        out / "ddp.log",
    )
    run_logged(
        launch + ["launch/accelerate/zero3_cpu_2.yaml", str(SCRIPT), "--out", str(out), "--suite", "zero3"],
        out / "zero3.log",
    )
    return out


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def _check_against_reference(results: Path, run: str, name: str, ref_name: str | None = None) -> dict:
    """``name`` on 2 processes against one process (``ref_name``: a scenario trained there that must give the same
    decisions and update, e.g. the unchunked one)."""
    ref_name = ref_name or name
    ref = _load(results / "reference" / f"{ref_name}.rank0.pt")
    ranks = [_load(results / run / f"{name}.rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["world"] == 2
    # different local data on each rank
    a, b = (r["local_completion_ids"] for r in ranks)
    assert a.shape != b.shape or not torch.equal(a, b)
    # identical decisions on both ranks and the same as one process, over the same global batch
    assert len(ref["decisions"]) == len(ranks[0]["decisions"]) == len(ranks[1]["decisions"])
    for d_ref, d0, d1 in zip(ref["decisions"], ranks[0]["decisions"], ranks[1]["decisions"]):
        for key in ("keep", "R"):
            assert torch.equal(d0[key], d1[key]), f"{name}: ranks disagree on {key}"
        assert torch.equal(d_ref["keep"], d0["keep"])
        assert torch.allclose(d_ref["R"], d0["R"], atol=0, rtol=0)
        T = min(d_ref["completion_ids"].shape[1], d0["completion_ids"].shape[1])
        assert torch.equal(d_ref["completion_ids"][:, :T], d0["completion_ids"][:, :T])
    # the same update as one process
    p_ref = _load(results / "reference" / f"{ref_name}.params.pt")
    p_two = _load(results / run / f"{name}.params.pt")
    assert p_ref.keys() == p_two.keys()
    assert max(float((p_ref[k] - p_two[k]).abs().max()) for k in p_ref) <= PARAM_TOL
    logged = lambda rec, key: [h[key] for h in rec["log_history"] if key in h]  # noqa: E731
    assert logged(ref, "loss") == pytest.approx(logged(ranks[0], "loss"), abs=1e-5)
    # every stage's decisions (kept counts, and GRPODropout's when configured) match one process
    for key in ("stages/kept_rollouts", "dropout/kept_ratio", "dropout/groups_with_deletion", "snr/kept_groups",
                "stages/empty_step", "collapse/num_samples", "collapse/num_prompts", "dynamic_sampling/gen_batches",
                "dynamic_sampling/mixed_groups", "clip_cov/selected_frac", "kl_cov/selected_frac"):
        assert logged(ref, key) == logged(ranks[0], key) == logged(ranks[1], key), key
    # collapse checks: the pairs are scored on both ranks in other micro-batches; same numbers up to fp32 noise
    for key in ("collapse/mi_estimate", "collapse/retrieval_accuracy", "collapse/conditional_entropy_seq"):
        assert logged(ref, key) == pytest.approx(logged(ranks[0], key), abs=1e-4), key
    return {"ref": ref, "ranks": ranks}


def _check_snr_collapse_empty_step(out: dict) -> None:
    """Step 2 was empty and skipped (identical parameters to one process prove it was skipped alike); the
    collapse detector ran at every step."""
    logged = lambda rec, key: [h[key] for h in rec["log_history"] if key in h]  # noqa: E731
    for rec in (out["ref"], *out["ranks"]):
        assert logged(rec, "stages/empty_step") == [0.0, 1.0, 0.0]
        assert len(logged(rec, "collapse/mi_estimate")) == 3


@pytest.mark.parametrize("name", DDP_SCENARIOS)
def test_two_processes_match_one(results, name):
    out = _check_against_reference(results, "world2", name)
    if name == "filter_grpodropout":
        assert any(h.get("dropout/groups_with_deletion", 0) > 0 for h in out["ref"]["log_history"]), "nothing deleted"
    if name == "authors_grpodropout":  # rows deleted, and the verl mini-batch count is the same decision everywhere
        logged = lambda rec, key: [h[key] for h in rec["log_history"] if key in h]  # noqa: E731
        assert any(h.get("dropout/groups_with_deletion", 0) > 0 for h in out["ref"]["log_history"]), "nothing deleted"
        steps = logged(out["ref"], "stages/optimizer_steps")
        assert steps and steps == logged(out["ranks"][0], "stages/optimizer_steps") == logged(out["ranks"][1],
                                                                                             "stages/optimizer_steps")
        kept = logged(out["ref"], "stages/kept_rollouts")
        assert any(k < 16 for k in kept), "no partial mini-batch: the fixed 1/16 normaliser was not exercised"
    if name == "snr_collapse_empty_step":
        _check_snr_collapse_empty_step(out)
    if name in ("clip_cov", "kl_cov"):
        _check_token_choices(out)
    if name == "beyond8020":
        ref, (r0, r1) = out["ref"]["entropy_mask_tokens"], (r["entropy_mask_tokens"] for r in out["ranks"])
        assert ref and len(ref) == len(r0) == len(r1)
        # TRL pools entropies over processes: the ranks' kept tokens add up to what one process keeps
        assert [a + b for a, b in zip(r0, r1)] == ref
    if name == "uecr":
        _check_teacher(out, partitioned=False)
    if name == "dynamic_sampling":
        gen = [
            h["dynamic_sampling/gen_batches"] for h in out["ref"]["log_history"] if "dynamic_sampling/gen_batches" in h
        ]
        assert max(gen) >= 2, "no refill happened: the scenario tests nothing"
    if name == "env_rollout":  # real Sokoban episodes: moves were made, returns differ, the filter chose
        logged = [h for h in out["ref"]["log_history"] if "env/actions" in h]
        assert logged and all(h["env/actions"] > 0 and h["reward_std"] > 0 for h in logged)
        assert any(not bool(d["keep"].all()) for d in out["ref"]["decisions"])
    if name == "ppo":  # the critic trained (its weights are in the compared parameters), its value clip engaged
        params = _load(results / "reference" / "ppo.params.pt")
        assert any(k.startswith("critic.") for k in params)
        logged = lambda rec, key: [h[key] for h in rec["log_history"] if key in h]  # noqa: E731
        for key in ("critic/vf_loss", "critic/vf_explained_var", "critic/vf_clipfrac"):
            assert logged(out["ref"], key) == pytest.approx(logged(out["ranks"][0], key), abs=1e-5), key
        assert logged(out["ref"], "critic/vf_clipfrac")[-1] > 0
        assert any(not bool(d["keep"].all()) for d in out["ref"]["decisions"])
    if name.startswith("filter"):
        # the filter really removed something on some step, so the decisions above were not trivial
        assert any(not bool(d["keep"].all()) for d in out["ref"]["decisions"])


def _check_token_choices(out: dict) -> None:
    """Clip-Cov / KL-Cov: both ranks chose the same global tokens at every micro-step (bit for bit), and the same
    tokens as one process -- compared by their covariance values, since the rows sit in another order there."""
    ref, (r0, r1) = out["ref"]["selections"], (r["selections"] for r in out["ranks"])
    assert ref and len(ref) == len(r0) == len(r1)
    for s_ref, s0, s1 in zip(ref, r0, r1):
        assert torch.equal(s0["selected"], s1["selected"]) and torch.equal(s0["cov"], s1["cov"])
        assert int(s0["selected"].sum()) == int(s_ref["selected"].sum()) > 0
        chosen = lambda s: torch.sort(s["cov"][s["selected"]]).values  # noqa: E731
        assert torch.allclose(chosen(s0), chosen(s_ref), atol=1e-5)


def test_overlapped_generation_on_two_processes(results):
    """max_staleness 1 on 2 processes: the server got the same requests from the same weights as from one process
    (batch k from version max(0, k - 1); the weights differ only by fp32 reduction order, below the emulator's
    fingerprint resolution), no sync landed during a generation, and training matched one process."""
    ref = _load(results / "reference" / "overlap.rank0.pt")
    two = _load(results / "world2" / "overlap.rank0.pt")
    assert ref["generations"] == two["generations"] and len(two["generations"]) == 4
    assert [loaded for loaded, *_ in two["generations"]] == [1, 1, 2, 3]  # (reloads, fingerprint, settings)
    assert ref["overlaps"] == two["overlaps"] == 0


@pytest.mark.parametrize("compacted, masked", [("filter_grpo_kl_accum", "filter_grpo_kl_accum_masked"),
                                               ("filter_dapo", "filter_dapo_masked"),
                                               ("rank_keeps_none", "rank_keeps_none_masked")])
def test_compaction_trains_like_masking_on_two_processes(results, compacted, masked):
    """Removing dropped rollouts from the batch (re-dealt over ranks, zero-weight fillers) reaches the same
    parameters as masking them, on 2 processes (row- and token-normalised losses; 2 accumulation steps and a KL
    term) -- also when one rank held no kept rollout (rank_keeps_none: every kept row starts on rank 0)."""
    for run in ("world2", "reference"):
        a, b = (_load(results / run / f"{name}.params.pt") for name in (compacted, masked))
        assert max(float((a[k] - b[k]).abs().max()) for k in a) <= PARAM_TOL, run
    ranks = [_load(results / "world2" / f"rank_keeps_none.rank{r}.pt") for r in (0, 1)]
    rows = [int(rank["local_completion_ids"].shape[0]) for rank in ranks]
    assert rows == [2, 2], f"5 kept rows over 2 ranks x 2 micro-steps: 2 rows per micro-step each, got {rows}"


def test_zero3_two_processes(results):
    out = _check_against_reference(results, "world2-zero3", "filter_dapo")
    for rank in out["ranks"]:
        assert rank["partitioned"] and all(rank["partitioned"]), "policy parameters must be ZeRO-3 partitioned"


def test_ppo_critic_under_zero3(results):
    """PPO under ZeRO-3 with RAGEN-2's SNR filter and collapse checks, an empty step and token-budget chunks on
    long-tailed rows: the critic is a DeepSpeed engine of its own, sharded over the 2 ranks like the policy; it runs
    the policy's chunks (filler forwards where a rank has fewer) and skips the empty step with the policy (its
    engine counts the skip); both models end where the 1-process run (no DeepSpeed, plain AdamW) ends, with the same
    value statistics and critic gradient norm at every step."""
    out = _check_against_reference(results, "world2-zero3", "ppo_collapse_budget")
    _check_snr_collapse_empty_step(out)
    for rank in out["ranks"]:
        assert rank["partitioned"] and all(rank["partitioned"]), "policy parameters must be ZeRO-3 partitioned"
        # every matrix is sharded; vectors under stage3_param_persistence_threshold (10 x hidden) stay whole
        assert sum(rank["critic_partitioned"]) >= len(rank["critic_partitioned"]) // 2
        assert rank["ds_skipped_steps"] == rank["critic_skipped_steps"] == 1
    params = _load(results / "world2-zero3" / "ppo_collapse_budget.params.pt")
    assert any(k.startswith("critic.") for k in params)
    logged = lambda rec, key: [h[key] for h in rec["log_history"] if key in h]  # noqa: E731
    ref, rank0 = out["ref"], out["ranks"][0]
    assert sum(logged(rank0, "tokens/loss_chunks")) > len(logged(rank0, "tokens/loss_chunks"))  # really chunked
    trained = lambda rec, key: [h[key] for h in rec["log_history"] if h.get("stages/empty_step") == 0]  # noqa: E731
    for key in ("critic/vf_loss", "critic/vpred_mean", "critic/grad_norm"):
        assert len(trained(ref, key)) == 2  # the two steps with rows
        assert trained(rank0, key) == pytest.approx(trained(ref, key), rel=1e-4), key


def test_ppo_resumes_exactly_under_zero3(results):
    """A PPO run under ZeRO-3 resumed from its step-1 checkpoint (each rank's shards of the policy's and the critic's
    engines: weights and optimizer states) ends bit-identical to the run that was not interrupted, as on one process
    without DeepSpeed; and that run equals one process."""
    _check_against_reference(results, "world2-zero3", "ppo_resume")
    for run in ("reference", "world2-zero3"):
        whole = _load(results / run / "ppo_resume.params.pt")
        resumed = _load(results / run / "ppo_resume.resumed.params.pt")
        assert whole.keys() == resumed.keys() and any(k.startswith("critic.") for k in whole)
        for key in whole:
            assert torch.equal(whole[key], resumed[key]), (run, key)


def _check_teacher(out: dict, partitioned: bool) -> None:
    """The teacher scored on every rank with the same number of forwards although the ranks' completions differ in
    length, and its scores on a fixed batch equal those of the unpartitioned copy of the 1-process run."""
    ref, ranks = out["ref"], out["ranks"]
    calls = [r["teacher_calls"] for r in ranks]
    assert len(calls[0]) == len(calls[1]) > 0
    assert calls[0] != calls[1], "the ranks' sequences had the same lengths: the check would be vacuous"
    for rank in ranks:
        for got, want in zip(rank["teacher_fixed_scores"], ref["teacher_fixed_scores"]):
            assert torch.allclose(got, want, atol=1e-5)
        assert bool(rank["teacher_partitioned"]) == partitioned and all(rank["teacher_partitioned"] or [True])


def test_uecr_teacher_under_zero3(results):
    """UECR-GRPO trains under ZeRO-3 with the teacher partitioned over the 2 ranks: the same decisions and parameters
    as one process (unpartitioned teacher), the same number of teacher forwards on both ranks."""
    out = _check_against_reference(results, "world2-zero3", "uecr")
    _check_teacher(out, partitioned=True)


def test_overlapped_generation_under_zero3(results):
    """max_staleness 1 under ZeRO-3 with the teacher and token-budget chunks: the server got the same requests from
    the same weights as from one process (batch k from version max(0, k - 1)), no sync landed during a generation,
    the decisions and parameters match one process, and the partitioned teacher ran as many forwards on each rank."""
    out = _check_against_reference(results, "world2-zero3", "overlap_uecr_budget")
    ref, two = out["ref"], out["ranks"][0]
    assert ref["generations"] == two["generations"] and len(two["generations"]) == 4
    assert [loaded for loaded, *_ in two["generations"]] == [1, 1, 2, 3]  # (reloads, fingerprint, settings)
    assert ref["overlaps"] == two["overlaps"] == 0
    _check_teacher(out, partitioned=True)


def test_zero3_snr_collapse_and_skipped_step(results):
    """Under ZeRO-3 the collapse forward passes run on both ranks and the empty step goes through DeepSpeed's
    skip path: the final parameters equal the 1-process run's, where the step was skipped too."""
    out = _check_against_reference(results, "world2-zero3", "snr_collapse_empty_step")
    _check_snr_collapse_empty_step(out)
    assert [rank["ds_skipped_steps"] for rank in out["ranks"]] == [1, 1]


BUDGET_LOSSES = ["grpo_kl_accum", "bnpo", "dr_grpo", "dapo"]  # TRL's weighting classes: rows, local tokens, global
BUDGET_METRICS = ("loss", "grad_norm", "policy_loss", "kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
                  "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max")


def _check_budget_like_unchunked(results: Path, run: str, loss: str, unchunked_run: str | None = None) -> list[dict]:
    """``budget_<loss>`` (token-budget chunks) against ``tail_<loss>`` (TRL's unchunked micro-batches) on the same
    long-tailed batches: the same parameters, and per step the same loss, gradient norm and TRL metrics (relative
    1e-5). Returns the chunked run's per-rank records."""
    ranks = 1 if run == "reference" else 2
    budget = [_load(results / run / f"budget_{loss}.rank{r}.pt") for r in range(ranks)]
    tail = _load(results / (unchunked_run or run) / f"tail_{loss}.rank0.pt")
    p_tail = _load(results / (unchunked_run or run) / f"tail_{loss}.params.pt")
    p_budget = _load(results / run / f"budget_{loss}.params.pt")
    assert max(float((p_tail[k] - p_budget[k]).abs().max()) for k in p_tail) <= PARAM_TOL, (run, loss)
    steps = lambda rec: [h for h in rec["log_history"] if "loss" in h and "train_runtime" not in h]  # noqa: E731
    for rec in budget:
        got, want = steps(rec), steps(tail)
        assert len(got) == len(want) == 2
        # really chunked and trimmed (values are means over the step's micro-steps)
        assert sum(g["tokens/loss_chunks"] for g in got) > len(got)
        assert sum(g["tokens/padded_loss"] for g in got) < sum(w["tokens/padded_loss"] for w in want)
        for g, w in zip(got, want):
            for key in BUDGET_METRICS:
                if key in w:
                    assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-7), (run, loss, key)
    assert any(h.get("kl", 0) > 0 for h in steps(tail)) or "kl" not in steps(tail)[0]
    assert steps(tail)[1]["clip_ratio/region_mean"] > 0  # the second step is off-policy: clipping is exercised
    return budget


@pytest.mark.parametrize("loss", BUDGET_LOSSES)
def test_token_budget_chunks_train_like_unchunked(results, loss):
    """Token-budget micro-batches on 2 processes (and 1) train exactly like TRL's unchunked micro-batches: the ranks
    chunk different rows into different numbers of chunks, gradients are all-reduced once per sync micro-step."""
    for run in ("reference", "world2"):
        ranks = _check_budget_like_unchunked(results, run, loss)
    forwards = [len(r["policy_forwards"]) for r in ranks]  # loss chunks and no-grad chunks, this rank's own
    assert forwards[0] != forwards[1], "both ranks ran as many chunks: uneven chunk counts were not exercised"


@pytest.mark.parametrize("loss", ["grpo_kl_accum", "dapo"])
def test_token_budget_chunks_under_zero3(results, loss):
    """Under ZeRO-3 the chunked run equals the unchunked one on 2 DDP processes (parameters, loss, grad norm, metrics)
    and one process (decisions, parameters, loss; with accumulation TRL's logged metrics are means over micro-steps,
    which hold other rows on 1 process), and although the ranks hold different chunk counts, both ran the same
    number of policy forwards (filler chunks)."""
    ranks = _check_budget_like_unchunked(results, "world2-zero3", loss, unchunked_run="world2")
    _check_against_reference(results, "world2-zero3", f"budget_{loss}")
    for rank in ranks:
        assert rank["partitioned"] and all(rank["partitioned"])
    # the ranks hold the same rows as under DDP, where their chunk counts differ; under ZeRO-3 fillers even them out
    ddp = [len(_load(results / "world2" / f"budget_{loss}.rank{r}.pt")["policy_forwards"]) for r in (0, 1)]
    assert ddp[0] != ddp[1], "both ranks ran as many chunks: the filler chunks were not exercised"
    assert len(ranks[0]["policy_forwards"]) == len(ranks[1]["policy_forwards"]) >= max(ddp)


def test_token_budget_balances_tokens_across_ranks(results):
    """With a budget on 2 processes the rows are dealt so both ranks hold about as many tokens (verl's balance_batch):
    the update is unchanged -- the same parameters as the round-robin deal and as one process (grpo with KL and
    accumulation; dapo with nothing removed, where the re-deal replaces TRL's own split) -- and the ranks' real
    tokens, counted from the rows each rank trained, differ by at most one row, less than round-robin's on the same
    batch; the logged tokens/rank_max and tokens/rank_min are those counts. Under ZeRO-3 the deal and the update are
    the same."""
    def dealt(run: str, name: str) -> tuple[list[int], int]:
        ranks = [_load(results / run / f"{name}.rank{r}.pt") for r in (0, 1)]
        return [r["dealt_tokens"] for r in ranks], max(r["longest_row"] for r in ranks)

    def logged(name: str, key: str) -> list[float]:
        return [h[key] for h in _load(results / "world2" / f"{name}.rank0.pt")["log_history"] if key in h]

    balanced, longest = dealt("world2", "balanced_grpo_kl_accum")
    round_robin, _ = dealt("world2", "budget_grpo_kl_accum")
    assert sum(balanced) == sum(round_robin)  # the same rows (and fillers), dealt differently
    assert abs(balanced[0] - balanced[1]) <= longest
    assert abs(balanced[0] - balanced[1]) < abs(round_robin[0] - round_robin[1]), (balanced, round_robin)
    assert logged("balanced_grpo_kl_accum", "tokens/rank_max")[-1] == max(balanced)
    assert logged("balanced_grpo_kl_accum", "tokens/rank_min")[-1] == min(balanced)
    assert logged("budget_grpo_kl_accum", "tokens/rank_max")[-1] == max(round_robin)
    # the same update as the round-robin deal unchunked (TRL's own micro-batches) and as one process; TRL's logged
    # kl / clip means are means over micro-steps, so they follow which rows share a micro-step and are not compared
    p_tail, p_balanced = (_load(results / "world2" / f"{name}.params.pt")
                          for name in ("tail_grpo_kl_accum", "balanced_grpo_kl_accum"))
    assert max(float((p_tail[k] - p_balanced[k]).abs().max()) for k in p_tail) <= PARAM_TOL
    for key in ("loss", "grad_norm"):
        assert logged("balanced_grpo_kl_accum", key) == pytest.approx(logged("tail_grpo_kl_accum", key), rel=1e-5)
    _check_against_reference(results, "world2", "balanced_grpo_kl_accum")

    zero3, _ = dealt("world2-zero3", "balanced_grpo_kl_accum")  # the same deal under ZeRO-3, the same update
    assert zero3 == balanced
    _check_against_reference(results, "world2-zero3", "balanced_grpo_kl_accum")

    all_kept, longest = dealt("world2", "balanced_dapo_all_kept")
    assert abs(all_kept[0] - all_kept[1]) <= longest
    assert logged("balanced_dapo_all_kept", "stages/kept_ratio") == [1.0]
    _check_against_reference(results, "world2", "balanced_dapo_all_kept")


def test_teacher_and_collapse_scoring_in_budget_chunks_under_zero3(results):
    """With a token budget the teacher's scoring (UECR-GRPO, teacher partitioned) and the collapse detector's
    cross-scoring run in token-budget chunks under ZeRO-3: both ranks run the same number of teacher forwards
    although their chunks differ, and decisions, collapse metrics and parameters equal one process's unchunked run."""
    out = _check_against_reference(results, "world2-zero3", "budget_uecr", ref_name="uecr")
    _check_teacher(out, partitioned=True)
    unchunked = [_load(results / "world2-zero3" / f"uecr.rank{r}.pt")["teacher_calls"] for r in (0, 1)]
    assert [r["teacher_calls"] for r in out["ranks"]] != unchunked, "the budget did not change the teacher's batching"
    out = _check_against_reference(results, "world2-zero3", "budget_snr_collapse", ref_name="snr_collapse_empty_step")
    _check_snr_collapse_empty_step(out)
    for rank in out["ranks"]:
        logged = [h["tokens/padded_collapse"] for h in rank["log_history"] if "tokens/padded_collapse" in h]
        assert len(logged) == 3 and all(v > 0 for v in logged)
