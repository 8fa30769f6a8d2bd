"""A request that keeps failing at ``max_staleness`` 1 with two processes (run by
tests/distributed/test_overlap_failure.py):

    accelerate launch --config_file launch/accelerate/multi_cpu_2.yaml tests/distributed/overlap_failure.py --out DIR

The main process runs the HTTP emulator of vLLM (tests/server/emulated_vllm.py), which answers HTTP 500 from its
third request on (batch 2's). Only the main process talks to the server; each rank writes what it raised, and when,
to ``DIR/rank<r>.json`` -- and then exits normally, so no launcher's SIGTERM is what ends a rank. ``ddp_timeout`` is
short: a rank left waiting in a collective raises its timeout instead of the server's error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (harness)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))  # the emulator
os.environ.setdefault("OMP_NUM_THREADS", "1")

from accelerate import PartialState  # noqa: E402
from accelerate.utils import broadcast_object_list  # noqa: E402
from emulated_vllm import EmulatedVLLM  # noqa: E402
from harness import BASE_ARGS, prompt_dataset, reward_token_parity, tiny_model_path  # noqa: E402

from trainer import WinnowConfig, WinnowGRPOTrainer  # noqa: E402

DDP_TIMEOUT_S = 90


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    out = parser.parse_args().out
    args = WinnowConfig(output_dir=str(out / "run"), **{
        **BASE_ARGS, "use_vllm": True, "vllm_mode": "server", "vllm_server_timeout": 30,
        "vllm_request_timeout": 60, "weight_sync": "disk", "vllm_importance_sampling_correction": False,
        "max_steps": 4, "max_staleness": 1, "ddp_timeout": DDP_TIMEOUT_S})
    state = PartialState()  # after the config, which starts the process group (before it, each rank is alone)
    assert state.num_processes == 2, state
    server = EmulatedVLLM(generation_s=0.05, fail_from=2).start() if state.is_main_process else None
    url = [server.url if server is not None else None]
    broadcast_object_list(url, from_process=0)
    args.vllm_server_base_url = url[0]
    trainer = WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity], args=args,
                                train_dataset=prompt_dataset(64))
    record = {"rank": state.process_index, "error": None}
    try:
        trainer.train()
    except Exception as error:  # noqa: BLE001 -- what each rank raised is the record
        record.update(error=type(error).__name__, message=str(error), at=time.time())
    record["step"] = trainer.state.global_step
    (out / f"rank{state.process_index}.json").write_text(json.dumps(record))
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
