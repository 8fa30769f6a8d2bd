"""The vLLM server's route guard: only the endpoints winnow's trainer calls, only from the job's own hosts.

vLLM loads this class as ASGI middleware (``--middleware vllm_route_guard.RouteGuard``, added by
``launch/vllm_server.py``, which puts this folder on the server's ``PYTHONPATH``). Why it exists: TRL's weight sync
needs ``VLLM_SERVER_DEV_MODE=1``, which opens ``/collective_rpc`` (vLLM calls any worker method by name), ``/sleep``,
``/pause``, the weight-transfer endpoints and, with runtime LoRA updating, adapter loading -- to anyone who can reach
the port. vLLM's ``--api-key`` does not cover them (vLLM 0.31 ``entrypoints/serve/middleware/authenticate.py`` guards
only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``), and TRL's client sends no key anyway.

Rules (every refusal is HTTP 403 with a one-line reason, and logged):

* ``GET /health`` is open (it says nothing but "up").
* Everything else must come from an allowed client: loopback, or an address of a host in
  ``WINNOW_SERVER_ALLOW_FROM`` (comma-separated host names, IP addresses or CIDR networks, resolved once at start).
* Only the routes in :data:`ROUTES` (what TRL 1.16's ``VLLMClient`` and winnow's disk/LoRA sync call) are served.
* ``/init_weight_transfer_engine``: the ``master_address`` the server's workers will join (and unpickle from) must be
  the IP address of an allowed client, so nobody can point them at a rendezvous of their own (a host name is refused:
  it is resolved again when the workers join, and could name another host by then).
* ``/collective_rpc``: only ``reload_weights`` (winnow's disk sync), with no argument but ``weights_path``.
* ``weights_path`` and ``lora_path`` must lie under ``WINNOW_SERVER_WEIGHTS_DIR`` when it is set.

The guard also says which weights the server holds. Every weight sync (TRL's NCCL one, winnow's disk and LoRA ones)
ends with ``POST /reset_prefix_cache``; the trainer's sends the version it completes in :data:`VERSION_HEADER`, and
the guard records it once the reset answered 200. Every generation answer carries the version held then (``none``:
the weights the server was started with, as after a restart), which the trainer checks against its own count
(trainer/server/client.py ``WeightVersion``). One API-server process holds the count (vLLM's default).

Standard library only: it runs inside vLLM's interpreter, which on CPU is another venv than the trainer's.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket

ALLOW_FROM_ENV = "WINNOW_SERVER_ALLOW_FROM"
WEIGHTS_DIR_ENV = "WINNOW_SERVER_WEIGHTS_DIR"
OPEN_ROUTES = frozenset({("GET", "/health")})
# What TRL 1.16's trl/generation/vllm_client.py requests (every f"{self.base_url}/..." in it) and what
# trainer/server/weight_sync.py posts (reload_weights through /collective_rpc, /v1/load_lora_adapter).
ROUTES = frozenset({
    ("GET", "/server_info"), ("GET", "/get_world_size"), ("GET", "/v1/models"),
    ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("POST", "/v1/chat/completions/render"),
    ("POST", "/inference/v1/generate"),
    ("POST", "/init_weight_transfer_engine"), ("POST", "/start_weight_update"), ("POST", "/update_weights"),
    ("POST", "/finish_weight_update"), ("POST", "/reset_prefix_cache"),
    ("POST", "/collective_rpc"), ("POST", "/v1/load_lora_adapter"),
})
INSPECTED = frozenset({"/init_weight_transfer_engine", "/collective_rpc", "/v1/load_lora_adapter"})
VERSION_HEADER = b"x-winnow-weight-version"  # trainer/server/client.py sends and checks the same header
GENERATION_ROUTES = frozenset({("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                               ("POST", "/inference/v1/generate")})
RPC_METHODS = {"reload_weights": {"weights_path"}}  # method -> the kwargs it may carry
MAX_INSPECTED_BODY = 1 << 20  # the inspected requests carry a few hundred bytes of JSON
logger = logging.getLogger("vllm.winnow_route_guard")  # under "vllm": printed by the handler vLLM configures


def _networks(spec: str) -> list:
    """Loopback plus every network or address that ``spec`` names (host names resolved now); ValueError naming an
    entry that is neither an address, a network nor a resolvable host."""
    nets = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        try:
            nets.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(entry, None, proto=socket.IPPROTO_TCP)
        except OSError as e:
            raise ValueError(f"{ALLOW_FROM_ENV}: cannot resolve {entry!r} ({e}); name hosts this node can resolve, "
                             "IP addresses or CIDR networks") from None
        nets += [ipaddress.ip_network(info[4][0]) for info in infos]
    return nets


def allowed(address: str, networks: list) -> bool:
    """Whether ``address`` (an IP, or a host name resolved here) lies in one of ``networks``."""
    try:
        candidates = [ipaddress.ip_address(address)]
    except ValueError:
        try:
            candidates = [ipaddress.ip_address(i[4][0]) for i in socket.getaddrinfo(address, None)]
        except OSError:
            return False
    for ip in candidates:
        ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:10.0.0.1 is 10.0.0.1
        if any(ip.version == net.version and ip in net for net in networks):
            return True
    return False


def _ip_literal(address: str) -> bool:
    """Whether ``address`` is an IP address as written (no host name: the workers resolve it again when they join)."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _under(path: object, root: str | None) -> bool:
    """Whether ``path`` lies inside ``root`` once both are resolved (True when no root is configured)."""
    if root is None:
        return True
    if not isinstance(path, str) or not path:
        return False
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def body_problem(path: str, body: dict, networks: list, weights_dir: str | None) -> str | None:
    """Why the JSON ``body`` of an inspected route is refused, None when it may pass."""
    if path == "/init_weight_transfer_engine":
        info = body.get("init_info")
        address = info.get("master_address") if isinstance(info, dict) else None
        if not isinstance(address, str) or not _ip_literal(address):  # a name could resolve elsewhere later
            return f"master_address {address!r} is not an IP address (TRL's client sends its own: get_ip())"
        if not allowed(address, networks):
            return f"master_address {address!r} is not an allowed client ({ALLOW_FROM_ENV})"
    elif path == "/collective_rpc":
        method, kwargs = body.get("method"), body.get("kwargs") or {}
        if method not in RPC_METHODS:
            return f"collective_rpc method {method!r} is not allowed (only {', '.join(RPC_METHODS)})"
        if not isinstance(kwargs, dict) or set(kwargs) - RPC_METHODS[method] or body.get("args"):
            return f"collective_rpc {method} takes only {sorted(RPC_METHODS[method])} as keyword arguments"
        if "weights_path" in kwargs and not _under(kwargs["weights_path"], weights_dir):
            return f"weights_path is outside {WEIGHTS_DIR_ENV}={weights_dir}"
    elif path == "/v1/load_lora_adapter" and not _under(body.get("lora_path"), weights_dir):
        return f"lora_path is outside {WEIGHTS_DIR_ENV}={weights_dir}"
    return None


class RouteGuard:
    """Pure ASGI middleware (vLLM adds it with ``app.add_middleware(RouteGuard)``; configured from the environment)."""

    def __init__(self, app, allow_from: str | None = None, weights_dir: str | None = None) -> None:
        self.app = app
        self.networks = _networks(os.environ.get(ALLOW_FROM_ENV, "") if allow_from is None else allow_from)
        self.weights_dir = (os.environ.get(WEIGHTS_DIR_ENV) if weights_dir is None else weights_dir) or None
        self.version = b"none"  # the weights version the server holds (VERSION_HEADER): none until a sync says

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan events pass through
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET"
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        route = (method, path.rstrip("/") or "/")
        if route in OPEN_ROUTES:
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("", 0))[0]
        if not allowed(client, self.networks):
            await self._refuse(scope, send, f"client {client} is not allowed ({ALLOW_FROM_ENV})", route)
            return
        if route not in ROUTES:
            await self._refuse(scope, send, f"{method} {path} is not an endpoint winnow's trainer uses", route)
            return
        if route[1] in INSPECTED:
            body, more = b"", True
            while more:  # read the whole (small) body, then hand vLLM the same bytes
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > MAX_INSPECTED_BODY:
                    await self._refuse(scope, send, f"body over {MAX_INSPECTED_BODY} bytes", route)
                    return
            try:
                parsed = json.loads(body or b"{}")
            except ValueError:
                parsed = None
            problem = body_problem(route[1], parsed, self.networks, self.weights_dir) if isinstance(
                parsed, dict) else "the body is not a JSON object"
            if problem:
                await self._refuse(scope, send, problem, route)
                return
            replayed = False

            async def replay():
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, self._versioned(route, scope, send))

    def _versioned(self, route: tuple[str, str], scope, send):
        """``send``, recording the version a 200 ``/reset_prefix_cache`` completes, or stamping a generation
        answer with the version held; other routes unchanged."""
        if route == ("POST", "/reset_prefix_cache"):
            claimed = dict(scope.get("headers") or []).get(VERSION_HEADER, b"")
            if not claimed.isdigit():
                return send

            async def record(message):
                if message["type"] == "http.response.start" and message.get("status") == 200:
                    self.version = claimed
                await send(message)

            return record
        if route in GENERATION_ROUTES:
            held = self.version  # the weights that generate this request: no sync runs beside a generation

            async def stamp(message):
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), (VERSION_HEADER, held)]}
                await send(message)

            return stamp
        return send

    @staticmethod
    async def _refuse(scope, send, reason: str, route: tuple[str, str]) -> None:
        logger.warning("route guard refused %s %s: %s", route[0], route[1], reason)
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        payload = json.dumps({"error": f"refused by winnow's route guard: {reason}"}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
