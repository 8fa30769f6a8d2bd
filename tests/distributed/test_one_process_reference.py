"""The one-process reference of the distributed scenarios (tests/distributed/launches.py): every DDP scenario trained
on one process, each with its decisions, log and final parameters. Not `serial`: ``make test`` builds it here, in its
parallel part, and the 2-process launches of tests/distributed/test_distributed.py compare against the same folder."""

from __future__ import annotations

import torch
from launches import one_process_reference, source_key
from test_distributed import DDP_SCENARIOS


def test_one_process_reference_trains_every_scenario(request, tmp_path_factory, tiny_model):
    ref = one_process_reference(request.config, tmp_path_factory)
    assert ref.parent.name == source_key() and (ref.parent / "COMPLETE").read_text().strip() == source_key()
    trained = sorted(p.name.removesuffix(".rank0.pt") for p in ref.glob("*.rank0.pt"))
    assert set(DDP_SCENARIOS) <= set(trained)
    for name in trained:
        record = torch.load(ref / f"{name}.rank0.pt", weights_only=False)
        assert record["world"] == 1 and any("loss" in h for h in record["log_history"]), name
        assert (ref / f"{name}.params.pt").exists(), name
