"""winnow's subclass of TRL's vLLM generation backend: weight syncs timed and logged, and in server mode with
``weight_sync: disk | lora`` a sync that needs no NCCL.

:func:`generation_backend_class` builds it. Every mode times ``sync_weights`` (``timing_s/weight_sync``) through the
:class:`SyncObserver` it is given. With ``disk``/``lora`` it also replaces ``_init_vllm`` (bounded wait for the server,
hardened client, no NCCL communicator, the sync's checks run on every rank) and ``sync_weights`` (the configured
server/weight_sync.py sync instead of the NCCL broadcast). TRL calls both from the places it always does, so
generation, the multi-turn rollout and the sync points are TRL's own.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, ContextManager

import torch
from accelerate.utils import broadcast_object_list
from trl.generation.vllm_generation import VLLMGeneration

from trainer import trl_contact
from trainer.config.errors import ConfigError
from trainer.server.client import GenerationServerError, harden_client, wait_for_server
from trainer.server.weight_sync import SYNCS, ServerClient, http_only_client, lora_problems


@dataclass
class SyncObserver:
    """What the trainer hears of each weight sync: ``timed()`` wraps it (a context manager, the phase timer's
    ``weight_sync``), ``on_metrics`` receives a disk/lora sync's timings and size."""

    timed: Callable[[], ContextManager[Any]] = nullcontext
    on_metrics: Callable[[dict[str, float]], None] | None = None


def generation_backend_class(args: Any, kind: str | None, observer: SyncObserver) -> type:
    """A ``VLLMGeneration`` subclass bound to ``args`` whose syncs ``observer`` hears; with ``kind`` ``disk`` or
    ``lora`` it syncs through :data:`trainer.server.weight_sync.SYNCS` ``[kind]``, with None through TRL's own."""

    class TimedGeneration(VLLMGeneration):
        """TRL's ``VLLMGeneration``, its weight sync timed (TRL's has no timing hook)."""

        def sync_weights(self) -> None:
            with observer.timed():
                super().sync_weights()

    if kind is None:
        return TimedGeneration

    class ServerGeneration(TimedGeneration):
        """``VLLMGeneration`` whose server-mode weight sync is :data:`trainer.server.weight_sync.SYNCS` ``[kind]``."""

        def _init_vllm(self) -> None:
            if self.mode != "server":
                return super()._init_vllm()

            self.base_url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
            self.vllm_client, info, failure = None, None, None
            if self.accelerator.is_main_process:
                try:
                    wait_for_server(self.base_url, total_timeout=self.server_timeout)
                    with http_only_client():
                        self.vllm_client = ServerClient(base_url=self.base_url, group_port=self.group_port,
                                                        connection_timeout=self.server_timeout)
                    harden_client(self.vllm_client, args.vllm_request_timeout)
                    info = self.vllm_client.get_server_info()
                except Exception as exc:  # re-raised by raise_on_every_rank, after the other ranks learned of it
                    failure = exc
            info = raise_on_every_rank(self.accelerator, failure, self.base_url,
                                       "the main process could not reach the server", info)
            if kind == "lora":
                problems = lora_problems(self.model, info)
                if problems:
                    raise ConfigError("weight_sync", "; ".join(problems), "see the README, \"vLLM server mode\"")
            self.weight_sync = SYNCS[kind](self, self.base_url, args, info)

        def sync_weights(self) -> None:
            if self.mode != "server":
                return super().sync_weights()
            failure, metrics = None, {}
            with observer.timed():
                try:
                    metrics = self.weight_sync.sync()
                except Exception as exc:  # shared: the other ranks would otherwise wait in the next collective
                    failure = exc
                raise_on_every_rank(self.accelerator, failure, self.base_url,
                                    "the main process's weight sync failed")
            if metrics and observer.on_metrics is not None:
                observer.on_metrics(metrics)

    return ServerGeneration


def raise_on_every_rank(accelerator: Any, failure: BaseException | None, base_url: str, what: str,
                        payload: Any = None, group: Any = None) -> Any:
    """Only the main process talks to the server: share its failure (or ``payload``) with every rank. The main
    process re-raises its own exception; the others raise a GenerationServerError "``what`` (<the failure>)"
    instead of waiting in the next collective. Returns the main process's ``payload`` on every rank. ``group``: a
    process group to share it over (a CPU group with its own timeout, :func:`wait_group`) instead of the default."""
    shared = [None if failure is None else f"{type(failure).__name__}: {failure}", payload]
    if accelerator.num_processes > 1 and group is not None:
        torch.distributed.broadcast_object_list(shared, src=0, group=group)
    elif accelerator.num_processes > 1:
        broadcast_object_list(shared, from_process=0)
    if failure is not None:
        raise failure
    if shared[0] is not None:
        raise GenerationServerError(base_url, f"{what} ({shared[0]})")
    return shared[1]


def wait_group(accelerator: Any, timeout_s: float) -> Any:
    """A gloo (CPU) process group of every rank, its collectives bounded by ``timeout_s`` (collective to create;
    None with one process). The other ranks wait there while the main process waits for the server, instead of in an
    NCCL collective, whose watchdog would end the job at ``ddp_timeout`` with no word of the server."""
    if accelerator.num_processes == 1:
        return None
    return torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


@contextmanager
def generation_class(args: Any, kind: str | None, observer: SyncObserver):
    """Make ``GRPOTrainer.__init__`` build :func:`generation_backend_class` instead of TRL's ``VLLMGeneration``.

    Why a swap of the module attribute: TRL constructs the generation backend inside ``GRPOTrainer.__init__`` by the
    name it imported, with no factory argument, and the NCCL communicator it opens there cannot exist on a CPU. The
    swap lasts for the constructor only."""
    with trl_contact.generation_class(generation_backend_class(args, kind, observer)):
        yield
