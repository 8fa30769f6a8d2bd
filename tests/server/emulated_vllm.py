"""A deterministic vLLM stand-in over real HTTP for overlapped generation through the trainer: generation is a
function of the prompt and of the weights the server last loaded, and takes a set time.

It speaks what the trainer uses in server mode with ``weight_sync: disk``: ``/health``, ``/v1/models``,
``/server_info``, ``/v1/completions`` (TRL's client: token-id prompts, ``n`` choices, prompt-major), and the disk
sync's ``/collective_rpc`` (``reload_weights`` from a folder of safetensors shards) and ``/reset_prefix_cache``.
The weights are read at each reload and reduced to a fingerprint, so the completions say which weights made them
-- also across a restart, where a reload counter would start over. A reload while a generation runs is recorded as
an error (``overlaps``): the overlap's rule forbids it. Completions are drawn from a small id range with lengths
that vary by prompt; log-probs are fixed numbers (tests keep TRL's importance-sampling correction off)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from safetensors.torch import load_file


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler that answers JSON and logs nothing (the fake servers of tests/server share it)."""

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, status: int, body: dict | None = None):
        data = json.dumps(body if body is not None else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class EmulatedVLLM:
    """The server; ``generation_s`` seconds per /v1/completions call. ``log``: ("reload", fingerprint) and
    ("generate", reloads so far, fingerprint, the request's sampling settings as JSON) in arrival order.

    ``lag`` > 0 makes a synchronous trainer's batches stale on purpose: each request is answered by the weights
    loaded ``lag`` reloads before the last, so the trainer's own sync-generate-train loop (``max_staleness`` 0)
    trains on exactly the rollouts that ``max_staleness`` = ``lag`` generates on a plain server."""

    def __init__(self, generation_s: float = 0.0, lag: int = 0, slow: dict[int, float] | None = None,
                 fail: set[int] | None = None, fail_from: int | None = None):
        self.generation_s = generation_s
        self.slow = dict(slow or {})  # request ordinal (0-based) -> its seconds instead of generation_s
        # HTTP 500 for these request ordinals (a retry is a new request), and for every one from fail_from on
        self.fail, self.fail_from = set(fail or ()), fail_from
        self.requests = 0
        self.lag = lag  # generate from the weights loaded ``lag`` reloads before the last (0: the last)
        self.fingerprints: list[int] = []  # of every reload, in order
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.fingerprint = 0
        self.reloads = 0
        self.log: list[tuple] = []
        self.overlaps = 0  # reloads that arrived while a generation ran
        self._generating = 0
        self._lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def completions(self, payload: dict, fingerprint: int) -> dict:
        choices = []
        for i, prompt in enumerate(payload["prompt"]):
            for j in range(payload.get("n", 1)):
                # the prompt's place in the request counts too: a multi-turn rollout sends a group's G identical
                # contexts as G prompts with n = 1, and they must not all get the same answer
                seed = sum(prompt) * 31 + 7 * j + 5 * i + 13 * fingerprint
                length = 2 + seed % max(1, payload.get("max_tokens", 8) - 1)
                toks = [1000 + (seed * (t + 3)) % 997 for t in range(length)]
                lps = [-0.5 - 0.1 * (t % 4) for t in range(length)]
                choices.append({"index": len(choices), "text": "", "prompt_token_ids": prompt, "token_ids": toks,
                                "logprobs": {"tokens": [f"token_id:{t}" for t in toks], "token_logprobs": lps,
                                             "top_logprobs": [{f"token_id:{t}": lp} for t, lp in zip(toks, lps)]},
                                "finish_reason": "length"})
        return {"id": "cmpl-emulated", "object": "text_completion", "model": "emulated", "choices": choices}

    def reload(self, folder: str) -> None:
        total = 0.0
        for shard in sorted(Path(folder).glob("*.safetensors")):
            total += sum(float(t.double().sum()) for t in load_file(str(shard)).values())
        with self._lock:
            self.overlaps += self._generating > 0
            # coarse: weights that differ only by fp32 reduction order (1 vs 2 processes) get the same fingerprint
            self.fingerprints.append(int(round(abs(total) * 10)) % 100_003)
            self.fingerprint = self.fingerprints[max(0, len(self.fingerprints) - 1 - self.lag)]
            self.reloads += 1
            self.log.append(("reload", self.fingerprints[-1]))

    def _handler(self):
        fake = self

        class Handler(JsonHandler):
            def do_GET(self):
                path = self.path.split("?")[0]
                if path == "/health":
                    return self._send(200)
                if path == "/v1/models":
                    return self._send(200, {"object": "list", "data": [{"id": "emulated", "object": "model"}]})
                if path == "/server_info":
                    return self._send(200, {"vllm_config": {"model_config": {"dtype": "torch.float32"}}})
                self._send(404, {"error": "not found"})

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/collective_rpc" and payload.get("method") == "reload_weights":
                    fake.reload(payload["kwargs"]["weights_path"])
                    return self._send(200, {"results": [None]})
                if self.path == "/reset_prefix_cache":
                    return self._send(200)
                if self.path != "/v1/completions":
                    return self._send(404, {"error": "not found"})
                with fake._lock:
                    fake._generating += 1
                    fingerprint, reloads = fake.fingerprint, fake.reloads
                    ordinal, fake.requests = fake.requests, fake.requests + 1
                if ordinal in fake.fail or (fake.fail_from is not None and ordinal >= fake.fail_from):
                    with fake._lock:
                        fake._generating -= 1
                        fake.log.append(("failed", ordinal))
                    return self._send(500, {"error": "engine dead"})
                try:
                    time.sleep(fake.slow.get(ordinal, fake.generation_s))
                    with fake._lock:
                        settings = json.dumps({k: v for k, v in payload.items() if k != "prompt"}, sort_keys=True)
                        fake.log.append(("generate", reloads, fingerprint, settings))
                    self._send(200, fake.completions(payload, fingerprint))
                finally:
                    with fake._lock:
                        fake._generating -= 1

        return Handler

    def start(self) -> EmulatedVLLM:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
