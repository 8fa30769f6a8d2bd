"""The weight-sync pieces that need no server (tests/server/test_vllm_server_real.py runs them against a real one):
version folders, shard writing, tied-embedding detection, LoRA feasibility checks and the config rules."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from trainer.config.core import ConfigError, WinnowConfig
from trainer.config.server import resolve_weight_sync
from trainer.server.weight_sync import ShardWriter, VersionFolders, lora_problems, tied_embedding_names


def test_version_folders_publish_prune_and_clean_leftovers(tmp_path):
    (tmp_path / "v000007").mkdir()
    (tmp_path / ".staging-000002").mkdir()
    (tmp_path / "notes").mkdir()  # not ours: never touched
    folders = VersionFolders(str(tmp_path), "/srv/sync", keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]
    for expected in (1, 2, 3):
        staging = folders.staging()
        assert os.path.basename(staging).startswith(".staging-") and not os.listdir(staging)
        local, remote = folders.publish(staging)
        assert (local, remote) == (str(tmp_path / f"v{expected:06d}"), f"/srv/sync/v{expected:06d}")
        folders.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "v000003"]
    keep_two = VersionFolders(str(tmp_path / "lora"), None, keep=2)
    for _ in range(3):
        local, remote = keep_two.publish(keep_two.staging())
        keep_two.prune()
    assert local == remote and sorted(os.listdir(tmp_path / "lora")) == ["v000002", "v000003"]


def test_shard_writer_bounds_shards_and_indexes_every_tensor(tmp_path):
    tensors = {f"layer.{i}.weight": torch.full((10, 10), float(i)) for i in range(5)}  # 400 bytes each
    writer = ShardWriter(str(tmp_path), shard_bytes=1000)
    for name, t in tensors.items():
        writer.add(name, t)
    writer.close()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 2000
    assert writer.files == ["model-00001.safetensors", "model-00002.safetensors", "model-00003.safetensors"]
    loaded = {}
    for file in writer.files:
        shard = load_file(str(tmp_path / file))
        assert sum(t.numel() * t.element_size() for t in shard.values()) <= 1000
        loaded.update(shard)
    assert set(index["weight_map"]) == set(tensors) == set(loaded)
    assert all(torch.equal(loaded[n], t) for n, t in tensors.items())


def test_one_tensor_larger_than_a_shard_gets_its_own(tmp_path):
    writer = ShardWriter(str(tmp_path), shard_bytes=100)
    writer.add("big", torch.zeros(1000))
    writer.add("small", torch.zeros(2))
    writer.close()
    assert len(writer.files) == 2 and writer.weight_map == {"big": writer.files[0], "small": writer.files[1]}


def _tiny(tied: bool):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=tied)
    return Qwen3ForCausalLM(config)


def test_tied_embedding_names_detects_sharing_only():
    assert tied_embedding_names(_tiny(tied=True), lambda n: n) == ("model.embed_tokens.weight", "lm_head.weight")
    assert tied_embedding_names(_tiny(tied=False), lambda n: n) is None
    # named_parameters yields the shared tensor once -- why the sync writes the output name itself
    assert "lm_head.weight" not in dict(_tiny(tied=True).named_parameters())


def test_lora_problems_name_each_obstacle():
    from peft import LoraConfig, get_peft_model

    assert "needs a PEFT model" in lora_problems(_tiny(False), None)[0]
    plain = get_peft_model(_tiny(False), LoraConfig(r=16, target_modules=["q_proj"]))
    ok_server = {"lora_config": {"max_lora_rank": 16}}
    assert lora_problems(plain, ok_server) == []
    assert "--enable-lora" in lora_problems(plain, {"lora_config": None})[0]
    assert (
        "r=16 exceeds the server's --max-lora-rank 8" in lora_problems(plain, {"lora_config": {"max_lora_rank": 8}})[0]
    )
    dora = get_peft_model(_tiny(False), LoraConfig(r=8, target_modules=["q_proj"], use_dora=True))
    assert any("DoRA" in p for p in lora_problems(dora, ok_server))
    saved = get_peft_model(_tiny(False), LoraConfig(r=8, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    assert any("modules_to_save" in p for p in lora_problems(saved, ok_server))


def test_config_rules(tmp_path):
    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(ConfigError, match="WinnowConfig.weight_sync: 'rsync' is not an option"):
        WinnowConfig(**base, weight_sync="rsync")
    with pytest.raises(ConfigError, match=r"weight_sync: 'disk' syncs into a vLLM server.*set use_vllm: true"):
        WinnowConfig(**base, weight_sync="disk")
    with pytest.raises(ConfigError, match="weight_sync_dtype"):
        WinnowConfig(**base, weight_sync_dtype="int8")
    with pytest.raises(ConfigError, match="weight_sync_lora_name"):
        WinnowConfig(**base, weight_sync_lora_name="a/b")
    assert WinnowConfig(**base, use_vllm=True, vllm_mode="server", weight_sync="lora").weight_sync == "lora"
    assert resolve_weight_sync("auto", cuda_available=True) == "nccl"
    assert resolve_weight_sync("auto", cuda_available=False) == "disk"
    assert resolve_weight_sync("lora", cuda_available=True) == "lora"


def test_nccl_without_cuda_fails_fast_naming_the_alternatives(tmp_path):
    from harness import BASE_ARGS, prompt_dataset, reward_token_parity, tiny_model_path

    from trainer import WinnowGRPOTrainer

    args = WinnowConfig(output_dir=str(tmp_path), **{**BASE_ARGS, "use_vllm": True, "vllm_mode": "server",
                                                     "weight_sync": "nccl"})
    with pytest.raises(ConfigError, match="needs CUDA.*use weight_sync: disk"):
        WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity], args=args,
                          train_dataset=prompt_dataset())
