"""Every generation answer is checked against the weights the trainer synced (issue "Generation at GPU scale", item
6): winnow's route guard records the version each sync's closing ``/reset_prefix_cache`` completes and stamps every
generation answer with the version it holds (trainer/server/guard/vllm_route_guard.py); the trainer's hardened
client counts its syncs and refuses an answer from other weights (trainer/server/client.py ``WeightVersion``).

First the guard alone, through the ASGI protocol; then the real guard under uvicorn in the vLLM venv, in front of a
stand-in app, with TRL's real ``VLLMClient`` hardened as the trainer hardens it: a server restarted between a sync
and a generation (TRL's Retry re-sends a POST across exactly that window) answers from its base weights, and the
answer is refused.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from emulated_vllm import free_port

from trainer.server.client import GenerationServerError, harden_client, weight_version_of

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "trainer" / "server" / "guard"))  # as the server imports it: by path
import vllm_route_guard as guard  # noqa: E402

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
PROMPTS = [[1, 2, 3], [4, 5]]


def through_guard(g, method: str, path: str, headers=(), status: int = 200) -> dict:
    """One request through ``g`` to an app answering ``status``; the answer's headers."""
    sent = []

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    g.app = app
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "client": ("127.0.0.1", 40000),
             "headers": list(headers)}
    asyncio.run(g(scope, receive, send))
    return dict(next(m for m in sent if m["type"] == "http.response.start")["headers"])


def test_the_guard_records_a_completed_sync_and_stamps_each_generation():
    g = guard.RouteGuard(None, allow_from="", weights_dir="")
    assert through_guard(g, "POST", "/v1/completions")[guard.VERSION_HEADER] == b"none"  # the weights it started with
    through_guard(g, "POST", "/reset_prefix_cache", [(guard.VERSION_HEADER, b"3")])
    for path in ("/v1/completions", "/v1/chat/completions", "/inference/v1/generate"):
        assert through_guard(g, "POST", path)[guard.VERSION_HEADER] == b"3", path
    through_guard(g, "POST", "/reset_prefix_cache", [(guard.VERSION_HEADER, b"4")], status=500)  # a failed sync
    through_guard(g, "POST", "/reset_prefix_cache", [(guard.VERSION_HEADER, b"x")])  # no version: not one
    through_guard(g, "POST", "/reset_prefix_cache")
    assert through_guard(g, "POST", "/v1/completions")[guard.VERSION_HEADER] == b"3"
    assert guard.VERSION_HEADER not in through_guard(g, "GET", "/v1/models")


class GuardedServer:
    """The real guard under uvicorn in the vLLM venv (tests/server/guarded_fake_vllm.py) on a fixed port."""

    def __init__(self, guarded: bool = True):
        self.port, self.guarded, self.process = free_port(), guarded, None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> GuardedServer:
        if not VLLM_PYTHON.exists():
            pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make setup` (it builds .venv-vllm)")
        self.process = subprocess.Popen([str(VLLM_PYTHON), str(REPO / "tests" / "server" / "guarded_fake_vllm.py"),
                                         str(self.port)] + ([] if self.guarded else ["--no-guard"]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                time.sleep(0.1)
        raise RuntimeError("the guarded stand-in did not come up")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None


@pytest.fixture
def hardened_client(monkeypatch):
    import trl.generation.vllm_client as vc

    # Only the "is vLLM installed" import guard is bypassed; every request below is real HTTP.
    monkeypatch.setattr(vc, "is_vllm_available", lambda *a, **k: True)

    def make(url: str):
        client = vc.VLLMClient(base_url=url, connection_timeout=30.0)
        harden_client(client, request_timeout=30.0)
        return client

    return make


def test_an_answer_from_other_weights_is_refused(hardened_client):
    server = GuardedServer().start()
    try:
        client = hardened_client(server.url)
        assert client.generate(PROMPTS, n=2, max_tokens=1)["completion_ids"]  # version 0: the started weights
        client.reset_prefix_cache()  # a sync's closing request (TRL's NCCL sync ends so; winnow's disk and LoRA too)
        client.reset_prefix_cache()
        assert weight_version_of(client).synced == 2
        assert client.generate(PROMPTS, n=2, max_tokens=1)["completion_ids"]  # the guard holds version 2
        server.stop()
        server.start()  # a restart: the server answers from the weights it was started with
        with pytest.raises(GenerationServerError) as info:
            client.generate(PROMPTS, n=2, max_tokens=1)
        msg = str(info.value)
        assert "answered from weights version none, but the trainer synced version 2" in msg, msg
        assert f"127.0.0.1:{server.port}" in msg and "/v1/completions" in msg
    finally:
        server.stop()


def test_a_server_without_the_guard_is_unchecked_and_says_so_once(hardened_client, caplog):
    server = GuardedServer(guarded=False).start()
    try:
        client = hardened_client(server.url)
        with caplog.at_level(logging.WARNING, logger="trainer.server.client"):
            client.reset_prefix_cache()
            for _ in range(2):
                assert client.generate(PROMPTS, n=1, max_tokens=1)["completion_ids"]
        said = [r.getMessage() for r in caplog.records if "does not say which weights answered" in r.getMessage()]
        assert len(said) == 1, said
    finally:
        server.stop()
