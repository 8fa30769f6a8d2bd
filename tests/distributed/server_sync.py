"""Weight sync under DeepSpeed ZeRO-3 with two processes, against a real vLLM server (run by
tests/server/test_vllm_server_real.py):

    accelerate launch --config_file launch/accelerate/zero3_cpu_2.yaml tests/distributed/server_sync.py \\
        --url http://127.0.0.1:PORT --model DIR --out DIR

Trains 2 steps with ``weight_sync: lora`` and 2 with ``disk`` (small shards, so the writer streams several). Every
parameter lives partitioned over the two ranks: the sync must gather them (every rank takes part, only the main
process writes). After training the main process gathers the full weights once more and writes to
``OUT/result.json``: whether the last version on disk equals them (bf16-rounded, exactly), and the server's vs a
plain fp32 copy's log-probs of a fixed sequence.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (harness)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from harness import BASE_ARGS, prompt_dataset, reward_token_parity  # noqa: E402

from trainer import WinnowConfig, WinnowGRPOTrainer  # noqa: E402

PROBE = torch.randint(0, 151_000, (48,), generator=torch.Generator().manual_seed(0)).tolist()
PROBE_PROMPT = 8
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def full_state(trainer) -> dict[str, torch.Tensor]:
    """Every parameter gathered (collective), as CPU copies on every rank."""
    import deepspeed

    model = trainer.accelerator.unwrap_model(trainer.model)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


def probe_logprobs(model) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROBE])).logits[0].float()
    logps = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(PROBE[1:]).unsqueeze(1)).squeeze(1)
    return logps[PROBE_PROMPT - 1:].tolist()


def server_logprobs(client) -> list[float]:
    out = client.get_sequence_logprobs([PROBE], [PROBE_PROMPT], top_logprobs=1)
    return [row[0] for row in out["actual_logprobs"][0]]


def run(kind: str, url: str, model_dir: str, out: Path, plain, peft_config=None) -> dict:
    args = WinnowConfig(output_dir=str(out / kind), **{
        **BASE_ARGS, "use_cpu": False, "ddp_backend": "gloo", "per_device_train_batch_size": 4, "max_steps": 2,
        "learning_rate": 3e-2 if kind == "disk" else 2e-1, "lr_scheduler_type": "constant", "use_vllm": True,
        "vllm_mode": "server", "vllm_server_base_url": url, "vllm_server_timeout": 60, "weight_sync": kind,
        "weight_sync_shard_mb": 8})
    trainer = WinnowGRPOTrainer(model=model_dir, reward_funcs=[reward_token_parity], args=args,
                                train_dataset=prompt_dataset(), peft_config=peft_config)
    trainer.train()
    trainer.vllm_generation.sync_weights()  # the sync the next generation would run: the final weights (collective)
    state = full_state(trainer)
    if not trainer.accelerator.is_main_process:
        return {}
    version = sorted(p for p in Path(args.weight_sync_dir).iterdir() if p.name.startswith("v"))[-1]
    if kind == "disk":
        from safetensors.torch import load_file

        written = {}
        for shard in version.glob("*.safetensors"):
            written.update(load_file(str(shard)))
        names = {n.removeprefix("module."): t for n, t in state.items()}
        plain.load_state_dict(names)
        equal = sorted(written) == sorted(names) and all(
            torch.equal(written[n], t.to(torch.bfloat16)) for n, t in names.items())
        result = {"shards": len(list(version.glob("*.safetensors"))), "written_equals_gathered": equal}
    else:
        from peft import get_peft_model
        from safetensors.torch import load_file

        plain = get_peft_model(plain, peft_config)
        plain.load_state_dict({n.removeprefix("module."): t for n, t in state.items()})
        written = load_file(str(version / "adapter_model.safetensors"))  # PEFT's names: no adapter name
        gathered = {n.replace(".default.", "."): t for n, t in state.items() if ".lora_" in n}
        result = {"adapter_tensors": len(written), "written_equals_gathered": sorted(written) == sorted(gathered)
                  and all(torch.equal(written[n], gathered[n]) for n in written)}
    result["trainer"] = probe_logprobs(plain.eval())
    result["server"] = server_logprobs(trainer.vllm_generation.vllm_client)
    result["sync_metrics"] = [e for e in trainer.state.log_history if "weight_sync/seconds" in e]
    return result


def failing_sync(url: str, model_dir: str, out: Path, peft_config) -> dict:
    """A sync the server cannot load (wrong server-side folder): every rank must raise, none may wait."""
    from trainer.server.client import GenerationServerError

    args = WinnowConfig(output_dir=str(out / "failure"), **{
        **BASE_ARGS, "use_cpu": False, "ddp_backend": "gloo", "per_device_train_batch_size": 4, "max_steps": 1,
        "use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": url, "vllm_server_timeout": 60,
        "weight_sync": "lora", "weight_sync_server_dir": "/nonexistent/sync"})
    trainer = WinnowGRPOTrainer(model=model_dir, reward_funcs=[reward_token_parity], args=args,
                                train_dataset=prompt_dataset(), peft_config=peft_config)
    try:
        trainer.train()
    except GenerationServerError as exc:
        message = str(exc)
    else:
        message = None
    messages = [None, None]
    torch.distributed.all_gather_object(messages, message)
    return {"messages": messages}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    # Plain fp32 copies, loaded before any trainer config exists: once one does, transformers would build every
    # later model partitioned (its ZeRO-3 hook), and those are what the written weights are checked against.
    plain = [AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32) for _ in range(2)]
    # LoRA first: an adapter applies to the server's base weights, which must still be the checkpoint's (the disk
    # run replaces them).
    lora = LoraConfig(r=8, lora_alpha=64, target_modules=LORA_TARGETS)
    results = {"lora": run("lora", a.url, a.model, a.out, plain[1], peft_config=lora)}
    results["disk"] = run("disk", a.url, a.model, a.out, plain[0])
    results["failure"] = failing_sync(a.url, a.model, a.out, lora)
    if results["disk"]:
        (a.out / "result.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
