"""W&B for real: two training steps of WinnowGRPOTrainer with ``report_to="wandb"`` (offline), then the run's
transaction log read back from disk must hold, for every logged step, TRL's metrics and the stages' metrics with
exactly the values the trainer logged.

wandb 0.31 ships no Python reader for ``run-<id>.wandb`` (the old ``wandb.sdk.internal.datastore`` is gone; the
Go ``wandb-core`` writes the file), so :func:`read_wandb_history` decodes the format itself. It is small: a
7-byte file header, then the LevelDB log framing, each record a serialised ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import glob
import json
import struct
import time
import zlib
from pathlib import Path

import wandb  # a hard dependency (pyproject): no skip, a missing wandb is a failure
from harness import BASE_ARGS, prompt_dataset, reward_length, reward_token_parity

from trainer import WinnowConfig, WinnowGRPOTrainer

# Metrics that must reach W&B at every logged step: TRL/Trainer's own and the stage pipeline's.
REQUIRED = ["train/loss", "train/reward", "train/entropy", "train/stages/kept_ratio", "train/advantage/frac_zero_std"]

_HEADER = struct.Struct("<4sHB")  # ident ":W&B", magic 0xBEE1, version 0
_CHUNK = struct.Struct("<IHB")  # crc32, payload length, chunk type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_wandb_history(path: str | Path, timeout: float = 30.0) -> list[dict]:
    """The history rows (one dict per ``wandb.log`` call, in order) of a ``run-<id>.wandb`` transaction log.

    Format (what wandb-core 0.31 writes, the same as the removed Python ``DataStore``): a header
    ``struct('<4sHB')`` = (b":W&B", 0xBEE1, 0); then 32 KiB blocks of chunks, each ``struct('<IHB')`` =
    (crc, length, type) + payload, where crc = ``zlib.crc32(payload, zlib.crc32(bytes([type])))``, type is
    FULL/FIRST/MIDDLE/LAST (records spanning blocks are split), and a block tail shorter than a chunk header
    is zero padding. Each record is a ``wandb.proto.wandb_internal_pb2.Record``; ``history`` records carry
    items (key or nested_key, JSON value).

    wandb-core may still be flushing when ``wandb.finish()`` returns, so this waits (up to ``timeout``
    seconds) for the run's final ``exit`` record before trusting the history; a missing exit record, a bad
    header or a bad checksum raise ``AssertionError``.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + timeout
    while True:
        records = _read_records(Path(path).read_bytes(), pb)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, f"{path}: no exit record after {timeout}s ({len(records)} records)"
        time.sleep(0.1)
    rows = []
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            rows.append(
                {(item.key or ".".join(item.nested_key)): json.loads(item.value_json) for item in rec.history.item}
            )
    return rows


def _read_records(data: bytes, pb) -> list:
    """Decode every complete record of a (possibly still growing) transaction log."""
    if len(data) < _HEADER.size:
        return []
    ident, magic, version = _HEADER.unpack_from(data)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"not a W&B transaction log: {(ident, magic, version)}"
    records, pending, pos = [], b"", _HEADER.size
    while pos + _CHUNK.size <= len(data):
        if _BLOCK - pos % _BLOCK < _CHUNK.size:  # block trailer padding
            pos += _BLOCK - pos % _BLOCK
            continue
        crc, length, kind = _CHUNK.unpack_from(data, pos)
        payload = data[pos + _CHUNK.size : pos + _CHUNK.size + length]
        if len(payload) < length:
            break  # chunk still being written
        if kind == 0 and length == 0 and crc == 0:  # zero padding up to the block end
            pos += _BLOCK - pos % _BLOCK
            continue
        assert crc == zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF, f"bad checksum at byte {pos}"
        pos += _CHUNK.size + length
        if kind in (_FULL, _FIRST):
            pending = payload
        else:
            assert kind in (_MIDDLE, _LAST), f"unknown chunk type {kind} at byte {pos}"
            pending += payload
        if kind in (_FULL, _LAST):
            rec = pb.Record()
            rec.ParseFromString(pending)
            records.append(rec)
    return records


def test_metrics_reach_wandb_offline_log(tiny_model, tmp_path, monkeypatch):
    """Two logged steps, offline W&B run: every value of trainer.state.log_history for both steps -- TRL's
    metrics and the stage pipeline's -- is in the run's .wandb history under train/..., unchanged."""
    for key, value in dict(
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path),
        WANDB_PROJECT="winnow-test",
        WANDB_SILENT="true",
        WANDB_CONSOLE="off",
        WANDB__DISABLE_STATS="true",  # no system-metrics sampler: 2 CPU cores
    ).items():
        monkeypatch.setenv(key, value)
    args = WinnowConfig(
        output_dir=str(tmp_path / "out"), **{**BASE_ARGS, "report_to": "wandb", "max_steps": 2, "logging_steps": 1}
    )
    trainer = WinnowGRPOTrainer(
        model=tiny_model, reward_funcs=[reward_token_parity, reward_length], args=args, train_dataset=prompt_dataset()
    )
    try:
        trainer.train()
    finally:
        wandb.finish()
        wandb.teardown()  # wandb keeps its process-wide settings (WANDB_DIR) until then: a later run would write here

    logs = [e for e in trainer.state.log_history if "train_runtime" not in e]
    assert [e["step"] for e in logs] == [1, 2]
    for e in logs:  # the trainer itself produced what we are about to look for
        assert {k.removeprefix("train/") for k in REQUIRED} <= e.keys(), sorted(e)

    paths = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(paths) == 1, paths
    rows = read_wandb_history(paths[0])
    by_step: dict[int, dict] = {}
    # The Trainer's rows carry train/epoch; TRL also logs one row per profiled call ("profiling/Time taken: ...")
    # and the end-of-train row adds only train/epoch, so take each step's first row with train/epoch.
    for row in rows:
        if "train/epoch" in row:
            by_step.setdefault(row["train/global_step"], row)
    assert sorted(by_step) == [1, 2], f"W&B history steps: {sorted(by_step)} in {len(rows)} rows"

    for e in logs:
        row = by_step[e["step"]]
        missing = [k for k in REQUIRED if k not in row]
        assert not missing, f"step {e['step']}: {missing} not in W&B history; it has {sorted(row)}"
        expected = {f"train/{k}": v for k, v in e.items() if k != "step"}
        got = {k: row.get(k, "<missing>") for k in expected}
        assert got == expected, f"step {e['step']}: W&B history differs from trainer.state.log_history"
