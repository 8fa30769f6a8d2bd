"""Run by the vLLM server's interpreter (tests/server/test_weight_version.py): winnow's real route guard, served by
uvicorn (what vLLM serves its app with) in front of a stand-in for vLLM's app that answers what TRL's client asks
(``/health``, ``/v1/models``, ``/reset_prefix_cache``, ``/v1/completions``).

    .venv-vllm/bin/python tests/server/guarded_fake_vllm.py PORT [--no-guard]
"""

import json
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "trainer" / "server" / "guard"))  # as vLLM imports it
from vllm_route_guard import RouteGuard  # noqa: E402


async def fake_vllm(scope, receive, send):
    """vLLM's answers, just enough of them: completions are a function of the prompt ids."""
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    path = scope["path"]
    if path == "/v1/completions":
        payload = json.loads(body)
        choices = [{"index": i, "text": "", "prompt_token_ids": p, "token_ids": [sum(p) % 50 + 1],
                    "logprobs": None, "finish_reason": "length"}
                   for i, p in enumerate(q for q in payload["prompt"] for _ in range(payload.get("n", 1)))]
        answer = {"id": "cmpl", "object": "text_completion", "model": "tiny", "choices": choices}
    elif path == "/v1/models":
        answer = {"object": "list", "data": [{"id": "tiny", "object": "model"}]}
    else:  # /health, /reset_prefix_cache
        answer = {}
    raw = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


if __name__ == "__main__":
    app = fake_vllm if "--no-guard" in sys.argv else RouteGuard(fake_vllm, allow_from="", weights_dir="")
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
