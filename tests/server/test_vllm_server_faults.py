"""Fault handling of vLLM server mode against a REAL local HTTP server that misbehaves on demand.

The server is an ``http.server.ThreadingHTTPServer`` on 127.0.0.1 speaking just enough of vLLM's OpenAI API for
TRL's ``VLLMClient`` (``/health``, ``/v1/models``, ``/v1/completions``). Nothing on the client's HTTP path is mocked:
requests, urllib3's retries and the sockets are real. The only thing patched is TRL's import guard
``trl.generation.vllm_client.is_vllm_available`` (the client refuses to construct without vLLM installed, which
this CPU venv does not have); server mode itself never imports vLLM for HTTP.

Timing asserts are correctness bounds of a timeout (budget + a generous margin), not performance claims.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from http.server import ThreadingHTTPServer

import pytest
from emulated_vllm import JsonHandler, free_port

from trainer.server.client import (
    GenerationServerError,
    backoff_sleeps,
    harden_client,
    hardening_of,
    max_attempts,
    request_budget,
    trl_default_retry,
    wait_for_server,
)

MARGIN = 5.0  # seconds of slack on top of a computed budget (slow CI, thread start-up)
HANG_S = 60.0  # how long a "never answering" handler blocks unless teardown releases it


def completions_response(payload: dict) -> dict:
    """Prompt-major choices in the shape TRL's ``generate``/``parse_logprobs`` read (completions format)."""
    choices = []
    for prompt in payload["prompt"]:
        ids = prompt if isinstance(prompt, list) else [ord(c) for c in prompt]
        for k in range(payload.get("n", 1)):
            toks = [(sum(ids) + 7 * k + j) % 50 + 1 for j in range(payload.get("max_tokens", 16))]
            lps = [-0.25 * (j + 1) for j in range(len(toks))]
            logprobs = None if payload.get("logprobs") is None else {
                "tokens": [f"token_id:{t}" for t in toks], "token_logprobs": lps,
                "top_logprobs": [{f"token_id:{t}": lp} for t, lp in zip(toks, lps)]}
            choices.append({"index": len(choices), "text": "", "prompt_token_ids": ids, "token_ids": toks,
                            "logprobs": logprobs, "finish_reason": "length"})
    return {"id": "cmpl-test", "object": "text_completion", "model": "tiny", "choices": choices}


class FakeVLLM:
    """Switchable server. ``health``: "ok" | "503" | "hang"; ``completions``: "ok" | "500" | "400" | "hang";
    ``health_503_left`` / ``completions_500_left``: transient failures served before behaving."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.health, self.completions = "ok", "ok"
        self.health_503_left = self.completions_500_left = 0
        self.hits: dict[str, int] = {}
        self.release = threading.Event()  # set at teardown: hanging handlers return at once
        self.server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    def _handler(self):
        fake = self

        class Handler(JsonHandler):
            def _count(self) -> None:
                with fake._lock:
                    fake.hits[self.path] = fake.hits.get(self.path, 0) + 1

            def do_GET(self):
                self._count()
                if self.path == "/health":
                    if fake.health == "hang":
                        fake.release.wait(HANG_S)  # accepted, never answered
                        return
                    with fake._lock:
                        transient = fake.health_503_left > 0
                        fake.health_503_left -= transient
                    return self._send(503 if transient or fake.health == "503" else 200)
                if self.path == "/v1/models":
                    return self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
                self._send(404, {"error": "not found"})

            def do_POST(self):
                self._count()
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/v1/completions":
                    return self._send(404, {"error": "not found"})
                if fake.completions == "hang":
                    fake.release.wait(HANG_S)
                    return
                with fake._lock:
                    transient = fake.completions_500_left > 0
                    fake.completions_500_left -= transient
                if transient or fake.completions == "500":
                    return self._send(500, {"error": "engine dead"})
                if fake.completions == "400":
                    return self._send(400, {"error": "bad request: max_tokens too large"})
                self._send(200, completions_response(payload))

        return Handler

    def start(self, delay: float = 0.0) -> None:
        def run():
            self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
            self.server.daemon_threads = True  # teardown never joins a hanging handler
            self.server.serve_forever(poll_interval=0.05)

        timer = threading.Timer(delay, run)
        timer.daemon = True
        timer.start()
        if delay == 0:
            deadline = time.monotonic() + 5
            while self.server is None and time.monotonic() < deadline:
                time.sleep(0.01)

    def stop(self) -> None:
        """Die: stop serving and close the listening socket (later connects are refused)."""
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def fake():
    server = FakeVLLM()
    yield server
    server.stop()


@pytest.fixture
def make_client(monkeypatch):
    import trl.generation.vllm_client as vc

    # Only the "is vLLM installed" import guard is bypassed; every request below is real HTTP.
    monkeypatch.setattr(vc, "is_vllm_available", lambda *a, **k: True)
    return lambda url: vc.VLLMClient(base_url=url, connection_timeout=5.0)


def small_retry(total: int = 1):
    """TRL's Retry with fewer attempts and a short backoff, so a test spends seconds, not minutes."""
    return trl_default_retry(total=total, backoff_factor=0.05)


PROMPTS = [[1, 2, 3], [4, 5]]


def test_budget_numbers_match_trl_default_retry(fake, make_client):
    fake.start()
    client = make_client(fake.url)
    adapter_retry = client.session.get_adapter(fake.url).max_retries
    ours = trl_default_retry()
    for attr in ("total", "connect", "read", "status", "backoff_factor", "status_forcelist", "allowed_methods"):
        assert getattr(adapter_retry, attr) == getattr(ours, attr), attr
    assert max_attempts(adapter_retry) == 6
    assert backoff_sleeps(adapter_retry) == 60.0  # 0 + 4 + 8 + 16 + 32
    assert request_budget(600) == 60 + 6 * (10 + 600) == 3720
    assert request_budget(60) == 60 + 6 * (10 + 60) == 480
    harden_client(client, request_timeout=600)
    assert hardening_of(client).budget() == 3720


def test_healthy_generate_matches_trl_and_harden_is_idempotent(fake, make_client):
    fake.start()
    plain, hardened = make_client(fake.url), make_client(fake.url)
    harden_client(hardened, request_timeout=1.0)
    adapter = hardened.session.get_adapter(fake.url)
    harden_client(hardened, request_timeout=2.0)  # updates settings, no second adapter
    assert hardened.session.get_adapter(fake.url) is adapter and hardening_of(hardened).read_timeout == 2.0
    # Through requests' public transport API only: no method of TRL's client or of its session is replaced.
    assert not {"_get", "_post"} & set(vars(hardened)) and "request" not in vars(hardened.session)
    expected = plain.generate(PROMPTS, n=2, max_tokens=3)
    out = hardened.generate(PROMPTS, n=2, max_tokens=3)
    assert out == expected
    assert out["prompt_ids"] == PROMPTS and len(out["completion_ids"]) == 4
    assert out["logprobs"][0] == [[-0.25], [-0.5], [-0.75]]
    assert out["logprob_token_ids"][0] == [[t] for t in out["completion_ids"][0]]
    assert hardened.model == "tiny"


def test_wait_for_server_late_start_logs_retries(fake, caplog):
    caplog.set_level(logging.INFO, logger="trainer.server.client")
    fake.start(delay=1.5)
    waited = wait_for_server(fake.url, total_timeout=10, retry_interval=0.25, request_timeout=1.0)
    assert 1.0 < waited < 10
    retries = [r.getMessage() for r in caplog.records if "not up yet" in r.getMessage()]
    assert retries and "attempt 1" in retries[0] and "ConnectionError" in retries[0]
    assert any("is up after" in r.getMessage() for r in caplog.records)


def test_wait_for_server_503_then_up(fake, caplog):
    caplog.set_level(logging.INFO, logger="trainer.server.client")
    fake.health_503_left = 3
    fake.start()
    wait_for_server(fake.url, total_timeout=10, retry_interval=0.1, request_timeout=1.0)
    assert fake.hits["/health"] == 4
    assert sum("HTTP 503" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.parametrize("mode", ["never_up", "503_forever", "never_answers"])
def test_wait_for_server_gives_up_within_budget(fake, mode):
    if mode != "never_up":
        fake.health = "503" if mode == "503_forever" else "hang"
        fake.start()
    total, per_request = 2.0, 1.0
    start = time.monotonic()
    with pytest.raises(GenerationServerError) as info:
        wait_for_server(fake.url, total_timeout=total, retry_interval=0.2, request_timeout=per_request)
    assert time.monotonic() - start < total + per_request + MARGIN
    msg = str(info.value)
    assert f"127.0.0.1:{fake.port}" in msg and "/health" in msg and "launch/vllm_server.py" in msg
    assert {"never_up": "ConnectionError", "503_forever": "HTTP 503", "never_answers": "Timeout"}[mode] in msg


def test_generation_read_timeout_is_not_resent(fake, make_client):
    """A generation POST that timed out raises once: TRL's own Retry (read=5, POST allowed; trl==1.16.0:
    trl/generation/vllm_client.py:224-232) would re-send it 5 times, each waiting out the timeout again, with 60 s
    of backoff in between (6 POSTs, ~66 s here). The error names the request, the seconds waited and the knob."""
    fake.start()
    client = make_client(fake.url)
    harden_client(client, request_timeout=1.0)  # TRL's Retry as TRL mounted it
    fake.completions = "hang"
    with pytest.raises(GenerationServerError) as info:
        client.generate(PROMPTS, n=2, max_tokens=3)
    assert fake.hits["/v1/completions"] == 1  # counted by the server: one POST (one read timeout), not six
    msg = str(info.value)
    assert f"127.0.0.1:{fake.port}" in msg and "POST /v1/completions (2 prompts x n=2, max_tokens 3)" in msg
    assert re.search(r"waited \d+\.\ds \(read timeout 1\.0s; vllm_request_timeout=1s\)", msg), msg
    assert "not re-sent" in msg
    assert "raise vllm_request_timeout" in msg and "--dry-run" in msg


def test_get_read_timeout_is_still_retried(fake, make_client):
    """Only a POST is exempt: a GET (idempotent) is re-sent after a read timeout as TRL's Retry says."""
    fake.start()
    client = make_client(fake.url)
    harden_client(client, request_timeout=0.5, retries=small_retry(total=1))
    fake.health = "hang"
    with pytest.raises(GenerationServerError) as info:
        client.session.get(f"{fake.url}/health")
    assert fake.hits["/health"] == 1 + 2  # the client's start-up probe, then the GET and its one re-send
    assert "up to 2 attempt(s)" in str(info.value)


def test_generate_after_server_died_raises(fake, make_client):
    fake.start()
    client = make_client(fake.url)
    harden_client(client, request_timeout=1.0, retries=small_retry(total=2))
    assert len(client.generate(PROMPTS, max_tokens=2)["completion_ids"]) == 2
    fake.stop()  # dies between two generate calls
    start = time.monotonic()
    with pytest.raises(GenerationServerError) as info:
        client.generate(PROMPTS, max_tokens=2)
    assert time.monotonic() - start < request_budget(1.0, small_retry(total=2)) + MARGIN
    msg = str(info.value)
    assert f"127.0.0.1:{fake.port}" in msg and "/v1/completions" in msg and "ConnectionError" in msg


def test_transient_500_is_retried_and_succeeds(fake, make_client):
    fake.start()
    client = make_client(fake.url)
    harden_client(client, request_timeout=1.0, retries=small_retry(total=3))
    fake.completions_500_left = 2
    out = client.generate(PROMPTS, max_tokens=2)
    assert out["prompt_ids"] == PROMPTS
    assert fake.hits["/v1/completions"] == 3


@pytest.mark.parametrize("mode, needle", [("500", "too many 500 error responses"), ("400", "HTTP 400")])
def test_failing_status_raises_clear_error(fake, make_client, mode, needle):
    fake.start()
    client = make_client(fake.url)
    harden_client(client, request_timeout=1.0, retries=small_retry(total=2))
    fake.completions = mode
    with pytest.raises(GenerationServerError) as info:
        client.generate(PROMPTS, max_tokens=2)
    msg = str(info.value)
    assert needle in msg and f"127.0.0.1:{fake.port}" in msg and "/v1/completions" in msg
    assert ("refused the request" in msg) == (mode == "400")
    assert fake.hits["/v1/completions"] == (3 if mode == "500" else 1)  # 4xx is not in TRL's status_forcelist


def test_404_that_trl_explains_passes_through_others_name_the_endpoint(fake, make_client):
    """TRL answers a 404 on /server_info with its own fix (VLLM_SERVER_DEV_MODE=1): kept. Any other 404 (here
    /get_world_size, through TRL's _get) becomes the named error instead of TRL's bare "Request failed: 404"."""
    fake.start()
    client = make_client(fake.url)
    harden_client(client, request_timeout=1.0, retries=small_retry(total=0))
    with pytest.raises(RuntimeError, match="VLLM_SERVER_DEV_MODE=1"):
        client.get_server_info()
    with pytest.raises(GenerationServerError) as info:
        client.get_world_size()
    msg = str(info.value)
    assert "/get_world_size" in msg and "HTTP 404" in msg and "refused the request" in msg


def test_explicit_caller_timeout_wins(fake, make_client):
    fake.start()
    client = make_client(fake.url)
    harden_client(client, request_timeout=30.0, retries=small_retry(total=0))
    fake.completions = "hang"
    start = time.monotonic()
    with pytest.raises(GenerationServerError):
        client.session.post(f"{fake.url}/v1/completions", json={"prompt": [[1]]}, timeout=(1.0, 0.3))
    assert time.monotonic() - start < 0.3 + MARGIN


def test_unhardened_trl_post_to_never_answering_server_does_not_return(fake, make_client):
    """Why harden_client exists: TRL's own _post has no timeout and just waits."""
    fake.start()
    client = make_client(fake.url)
    fake.completions = "hang"
    outcome = []

    def post():
        try:
            outcome.append(client._post(f"{fake.url}/v1/completions", json={"prompt": [[1]]}))
        except Exception as exc:  # the fake server stops after the test: the abandoned call then fails quietly
            outcome.append(exc)

    worker = threading.Thread(target=post, daemon=True)  # left behind on purpose: teardown must not wait for it
    worker.start()
    worker.join(3.0)
    assert worker.is_alive() and not outcome


def test_trainer_in_server_mode_fails_fast_naming_the_server(tmp_path):
    """WinnowGRPOTrainer waits for the server (bounded by vllm_server_timeout) before TRL's client polls /health
    without a timeout: nothing listening -> GenerationServerError naming host:port, not a hang."""
    from harness import BASE_ARGS, prompt_dataset, reward_token_parity, tiny_model_path

    from trainer import WinnowConfig, WinnowGRPOTrainer

    port = free_port()
    args = WinnowConfig(output_dir=str(tmp_path), **BASE_ARGS, use_vllm=True, vllm_mode="server",
                        vllm_server_base_url=f"http://127.0.0.1:{port}", vllm_server_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(GenerationServerError, match=f"127.0.0.1:{port}"):
        WinnowGRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_token_parity], args=args,
                          train_dataset=prompt_dataset())
    assert time.monotonic() - started < 1.0 + 10.0 + 5.0  # budget + one probe's timeout + margin
