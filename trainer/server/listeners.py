"""The ports a server-mode run listens on, where they bind, and who could reach them (docs/security.md).

Three listeners exist besides the vLLM server itself (launch/vllm_server.py, behind its route guard):

* TRL's NCCL weight-sync group (``weight_sync: nccl``): the trainer's main process is rank 0 of a vLLM
  ``StatelessProcessGroup``, whose TCPStore binds ``(get_ip(), vllm_group_port)`` for the whole run
  (vllm/distributed/utils.py ``StatelessProcessGroup.create``) and whose ranks ``pickle.loads`` what others put in it.
  vLLM's ``get_ip()`` is ``VLLM_HOST_IP`` when set, else the address of the default route: routable, even when the
  server is on 127.0.0.1. :func:`pin_nccl_group_to_loopback` keeps it on loopback when the server is local.
* torch's rendezvous store of a multi-process launch (``MASTER_PORT``, 29500 by default): a TCPStore that listens on
  every interface whatever address it is given (torch 2.13: ``TCPStore("127.0.0.1", port, is_master=True)`` listens
  on ``*:port``, with either backend). torch offers no bind address for it, so only the network can protect it.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlparse

HOST_IP_ENV = "VLLM_HOST_IP"


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` names the loopback interface (``localhost``, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def server_host(server_url: str) -> str | None:
    """The host part of the vLLM server's base URL."""
    return urlparse(server_url).hostname


def pin_nccl_group_to_loopback(server_url: str) -> bool:
    """With the server on loopback and ``VLLM_HOST_IP`` unset, set it to 127.0.0.1 so TRL's NCCL group binds loopback
    (and tells the server to meet it there) instead of the default route's address. Returns whether it was set."""
    if os.environ.get(HOST_IP_ENV) or not is_loopback(server_host(server_url)):
        return False
    os.environ[HOST_IP_ENV] = "127.0.0.1"
    return True


def listener_lines(server_url: str, weight_sync: str, group_port: int, world: int,
                   main_port: int = 29500) -> list[tuple[str, str]]:
    """(status, text) per listener of this launch, for the preflight: ``ok`` on loopback, ``WARN`` where another host
    on the network could connect, naming what they could do and the fix."""
    lines = []
    host = server_host(server_url) or "?"
    if is_loopback(host):
        lines.append(("ok", f"vLLM server {host}: loopback only (launch/vllm_server.py --host {host})"))
    else:
        lines.append(("ok", f"vLLM server {host}: launch/vllm_server.py binds that address only and its route guard "
                      "admits the --allow-from hosts, TRL's endpoints only"))
    if weight_sync == "nccl":
        bound = os.environ.get(HOST_IP_ENV) or ("127.0.0.1" if is_loopback(host) else None)
        if bound and is_loopback(bound):
            lines.append(("ok", f"NCCL weight-sync group {bound}:{group_port}: loopback only"))
        else:
            where = f"{bound}:{group_port}" if bound else f"vLLM's get_ip() (the default route's address):{group_port}"
            lines.append(("WARN", f"NCCL weight-sync group listens on {where} for the whole run; a host that reaches "
                          "it can join the store the trainer unpickles from -> run on a private network or firewall "
                          f"the port to the server node; set {HOST_IP_ENV} to this node's internal address"))
    if world > 1:
        lines.append(("WARN", f"rendezvous store port {main_port} (MASTER_PORT / --main_process_port) listens on "
                      "every interface (torch's TCPStore has no bind address); a host that reaches it can disrupt or "
                      "hijack process-group setup -> firewall the port to the training nodes on a shared network"))
    return lines
