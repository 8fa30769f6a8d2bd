"""Client-side fault handling for vLLM server mode (TRL's ``VLLMClient``).

Why: TRL 1.16's client never sets a request timeout. ``VLLMClient.check_server`` calls ``requests.get(/health)``
without one (a server that accepts the connection but never answers hangs it forever) and only checks its deadline
on exceptions (a server answering 503 loops it forever); ``_get``/``_post`` go through a session with urllib3
``Retry(total=5, backoff_factor=2, status_forcelist=[500, 502, 503])`` but no timeout, so a generation request to a
hung server never returns; failures surface as a bare ``Exception("Request failed: ...")``.

This module bounds both phases:

* ``wait_for_server(base_url, total_timeout)``: before the run, poll ``/health`` until it answers 200, logging each
  retry; raises :class:`GenerationServerError` no later than about ``total_timeout + request_timeout`` seconds.
* ``harden_client(client, request_timeout)``: during the run, every request of ``client.session`` carries a
  ``(connect, read)`` timeout and every failure becomes a :class:`GenerationServerError` naming the server, the
  endpoint, what happened and what to do. A POST whose answer did not arrive within the read timeout is not re-sent
  (:class:`NoResendAfterReadTimeout`): TRL 1.16 sends a whole generation batch as one ``POST /v1/completions``
  (trl==1.16.0:trl/generation/vllm_generation.py:630), and its Retry (``read=5``, ``allowed_methods`` with POST,
  trl==1.16.0:trl/generation/vllm_client.py:224-232) would ask the server for the same batch up to five more times,
  each waiting out the full timeout while the other ranks wait in ``broadcast_object_list``.

Worst-case budget of one request (``request_budget``), TRL's default Retry (6 attempts, backoff sleeps
0+4+8+16+32 = 60 s) with the default connect timeout ``min(10 s, request_timeout)`` -- an upper bound; a server that
accepts a POST and never answers now costs one read timeout (plus the connect attempts before it):

* ``request_timeout=600``: 60 + 6 x (10 + 600) = 3720 s (about 62 min)
* ``request_timeout=60``:  60 + 6 x (10 + 60)  =  480 s (8 min)

Limits (not covered by the budget): the read timeout bounds each socket wait, not the whole response, so a server
that trickles bytes slower than that can still take longer; a ``Retry-After`` header on a 503 is honoured by urllib3
and adds its delay; DNS resolution is not under the connect timeout; the NCCL weight broadcast that runs next to
``/update_weights`` is not HTTP and is not bounded here.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ReadTimeoutError
from urllib3.util.retry import RequestHistory, Retry

from trainer.config.redaction import redact_url

logger = logging.getLogger("trainer.server.client")

# An unreachable/black-holed host should fail fast even when the read timeout is long (a generation can take
# minutes; a TCP handshake cannot).
DEFAULT_CONNECT_TIMEOUT = 10.0

FIX_HINT = (
    "Make sure the vLLM server is running and reachable: start it with `python launch/vllm_server.py --config "
    "<recipe>` (see the README, \"vLLM server mode\"), check vllm_server_base_url / vllm_server_host + "
    "vllm_server_port, and "
    "raise vllm_server_timeout (startup wait) / vllm_request_timeout (per request) if it is only slow."
)
REJECTED_HINT = (
    "The server is up but refused the request: check that the model it serves, the sampling parameters "
    "(max_tokens vs --max-model-len, logprobs vs --max-logprobs) and the server flags match the trainer config."
)


READ_TIMEOUT_HINT = (
    "If the server is only slow (one generation batch is one request), raise vllm_request_timeout above the batch's "
    "generation time and ddp_timeout above vllm_request_timeout (`launch/train.py --config <recipe> --dry-run` "
    "estimates it), or serve on more GPUs; if it hangs, check the server's log."
)


class GenerationServerError(ConnectionError):
    """The vLLM generation server is unreachable, hung, or failing. The message always names the server
    (host:port), the endpoint, what happened (elapsed seconds, retries, last error/status) and what to do.

    A builtin ``ConnectionError`` (an ``OSError``), not ``requests.ConnectionError``: code that catches requests'
    exceptions will not swallow it."""

    def __init__(self, url: str, what: str, hint: str = FIX_HINT):
        parsed = urlparse(redact_url(url))  # no user:password@ of a URL in the message (trainer/config/redaction.py)
        self.server = parsed.netloc or redact_url(url)
        self.endpoint = parsed.path or "/"
        super().__init__(redact_url(f"vLLM server {self.server} (endpoint {self.endpoint}): {what}. {hint}"))


VERSION_HEADER = "X-Winnow-Weight-Version"  # the route guard's (trainer/server/guard/vllm_route_guard.py)
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/inference/v1/generate")
VERSION_HINT = (
    "Restart the run from its last checkpoint, with nothing else syncing this server (one trainer per server): a "
    "resume syncs the trainer's weights before it generates again."
)


class WeightVersion:
    """The weights the server should hold, counted by the trainer: 0 = the model it was started with, one more per
    sync. Every sync -- TRL's NCCL one, winnow's disk and LoRA ones -- ends with ``POST /reset_prefix_cache``, which
    carries the version it completes (:meth:`reset_headers`); winnow's route guard records it and stamps each
    generation answer with the version it holds, and :meth:`check` refuses an answer from any other weights (a server
    restarted in the window where TRL's Retry re-sends a POST answers from its base weights; another trainer may
    have synced it). A server without the guard stamps nothing: then nothing can be checked, said once."""

    def __init__(self) -> None:
        self.synced = 0
        self._unstamped_said = False

    def reset_headers(self) -> dict[str, str]:
        """The header of a sync's closing ``/reset_prefix_cache``: the version it completes."""
        return {VERSION_HEADER: str(self.synced + 1)}

    def sync_completed(self) -> None:
        """Count a sync whose closing ``/reset_prefix_cache`` the server answered 200."""
        self.synced += 1

    def check(self, url: str, response: Any, expected: int) -> None:
        """Raise :class:`GenerationServerError` when a generation answer was made by other weights than version
        ``expected`` (the count when the request was sent)."""
        held = response.headers.get(VERSION_HEADER)
        if held is None:
            if not self._unstamped_said:
                self._unstamped_said = True
                logger.warning("vLLM server %s does not say which weights answered (not started by "
                               "launch/vllm_server.py, whose route guard does): its answers are not checked against "
                               "the trainer's weight version", redact_url(url))
            return
        if (0 if held == "none" else int(held) if held.isdigit() else -1) != expected:
            raise GenerationServerError(url, (
                f"answered from weights version {held}, but the trainer synced version {expected} before the request "
                "(version none: the weights the server started with, as after a restart); the rollouts would train "
                "as if the trainer's weights had made them, so they are refused"), VERSION_HINT)


def weight_version_of(client: Any) -> WeightVersion:
    """The :class:`WeightVersion` of ``client``'s hardened session (:func:`harden_client`); a fresh one, counting
    nothing shared, when the session is not hardened."""
    adapter = client.session.get_adapter(client.base_url)
    return adapter.versions if isinstance(adapter, HardenedAdapter) else WeightVersion()


class NoResendAfterReadTimeout(Retry):
    """urllib3's ``Retry`` with one exception: a POST whose answer timed out is raised at once, not re-sent.

    Why: the server received that POST and is still working on it (a generation batch can take many minutes);
    re-sending asks for the same work again and costs another full timeout each time. Connection errors (nothing
    reached the server), GETs and the 5xx statuses in ``status_forcelist`` are retried as before. ``Retry.new``
    builds copies with ``type(self)``, so the rule holds across urllib3's retry increments."""

    @classmethod
    def like(cls, retry: Retry) -> "NoResendAfterReadTimeout":
        """The same policy as ``retry`` (its counters, backoff and lists), with this rule added."""
        if isinstance(retry, cls):
            return retry
        copy = retry.new()  # Retry's own list of its settings, so no field is missed across urllib3 versions
        copy.__class__ = cls  # same fields, only increment() differs
        return copy

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None):
        """Raise a POST's read timeout as is; anything else as urllib3 decides."""
        if isinstance(error, ReadTimeoutError) and (method or "").upper() == "POST":
            raise error.with_traceback(_stacktrace)
        return super().increment(method=method, url=url, response=response, error=error, _pool=_pool,
                                 _stacktrace=_stacktrace)


def describe_request(method: str, url: str, body: Any = None) -> str:
    """``POST /v1/completions (128 prompts x n=8, max_tokens 8192)``: the endpoint and, for a generation (a JSON
    ``body``, as sent), its size."""
    what = f"{method} {urlparse(url).path or '/'}"
    try:
        payload = json.loads(body) if body else None
    except (TypeError, ValueError):
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("prompt"), list):
        what += (f" ({len(payload['prompt'])} prompts x n={payload.get('n', 1)}, "
                 f"max_tokens {payload.get('max_tokens')})")
    return what


def trl_default_retry(**overrides) -> Retry:
    """The urllib3 ``Retry`` that TRL 1.16 mounts on ``VLLMClient.session`` (vllm_client.py, ``__init__``), with
    optional overrides (tests shrink ``total``/``backoff_factor``; production keeps TRL's values)."""
    kwargs = dict(total=5, connect=5, read=5, status=3, status_forcelist=[500, 502, 503], backoff_factor=2,
                  allowed_methods=["POST", "GET"])
    return Retry(**{**kwargs, **overrides})


def max_attempts(retry: Retry | int | None) -> float:
    """Most HTTP attempts one call can make under ``retry`` (``math.inf`` when urllib3 would retry forever)."""
    if retry is None or retry is False:
        return 1
    if isinstance(retry, int):  # requests' HTTPAdapter(max_retries=int)
        return retry + 1
    if retry.total is not None and retry.total is not True:
        return max(int(retry.total), 0) + 1
    counters = [retry.connect, retry.read, retry.status, retry.other]
    if any(c is None for c in counters):
        return math.inf
    return sum(int(c) for c in counters) + 1  # each counter is spent independently


def backoff_sleeps(retry: Retry | int | None) -> float:
    """Sum of urllib3's backoff sleeps between the attempts of one call, asked from ``retry`` itself (the formula
    differs across urllib3 versions), upper-bounding any jitter."""
    attempts = max_attempts(retry)
    if not isinstance(retry, Retry) or attempts == 1:
        return 0.0
    if math.isinf(attempts):
        return math.inf
    jitter = float(getattr(retry, "backoff_jitter", 0.0) or 0.0)
    total = 0.0
    for errors in range(1, int(attempts)):  # urllib3 sleeps after the errors-th consecutive error
        probe = retry.new(history=tuple(RequestHistory("POST", "/", None, None, None) for _ in range(errors)))
        if jitter:
            probe.backoff_jitter = 0.0
        total += probe.get_backoff_time() + jitter
    return total


def request_budget(request_timeout: float, retry: Retry | int | None = None,
                   connect_timeout: float | None = None) -> float:
    """Worst-case seconds one hardened request can take: backoff sleeps + attempts x (connect + read timeout).
    ``retry`` defaults to TRL's (see the module docstring for 600 s -> 3720 s and 60 s -> 480 s)."""
    retry = trl_default_retry() if retry is None else retry
    connect = min(DEFAULT_CONNECT_TIMEOUT, request_timeout) if connect_timeout is None else connect_timeout
    return backoff_sleeps(retry) + max_attempts(retry) * (connect + request_timeout)


def wait_for_server(base_url: str, total_timeout: float, retry_interval: float = 2.0,
                    request_timeout: float = 10.0, process: Any = None) -> float:
    """Poll ``GET {base_url}/health`` until it answers 200; return the seconds waited.

    Each probe carries a timeout of ``min(request_timeout, time left)``, so a server that accepts connections but
    never answers cannot hang this (TRL's ``check_server`` has no timeout). Connection errors, timeouts and non-200
    statuses (vLLM answers 503 while loading) are all retried every ``retry_interval`` seconds, each retry logged at
    INFO on ``trainer.server.client``. Raises :class:`GenerationServerError` when the next retry would start past
    ``total_timeout``; worst case about ``total_timeout + request_timeout`` seconds. ``process`` (a ``Popen`` that
    started the server, for launchers): stop waiting as soon as it has exited."""
    url = f"{base_url.rstrip('/')}/health"
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        if process is not None and process.poll() is not None:
            raise GenerationServerError(url, (
                f"the server process exited with code {process.returncode} after {time.monotonic() - start:.1f}s, "
                "before it answered"))
        left = total_timeout - (time.monotonic() - start)
        per_request = max(min(request_timeout, left), 0.05)  # never 0: requests treats 0 as non-blocking
        try:
            # Plain requests.get: no urllib3 retries inside, the loop below owns the retry policy and its deadline.
            response = requests.get(url, timeout=(per_request, per_request))
            reason = f"HTTP {response.status_code}"
            if response.status_code == 200:
                waited = time.monotonic() - start
                logger.info("vLLM server %s is up after %.1fs (%d attempt(s))", redact_url(base_url), waited,
                            attempt)
                return waited
        except requests.RequestException as exc:
            reason = f"{type(exc).__name__}: {exc}"
        elapsed = time.monotonic() - start
        if elapsed + retry_interval >= total_timeout:
            raise GenerationServerError(url, (
                f"not up after {elapsed:.1f}s (budget total_timeout={total_timeout}s, {attempt} attempt(s), "
                f"per-request timeout {request_timeout}s); last error: {reason}"))
        logger.info("vLLM server %s not up yet (attempt %d, %.1fs elapsed of %.0fs): %s; retrying in %.1fs",
                    redact_url(base_url), attempt, elapsed, total_timeout, redact_url(reason), retry_interval)
        time.sleep(retry_interval)


@dataclass
class _Hardening:
    """Settings read by :class:`HardenedAdapter` at call time, so a second harden_client call updates them."""
    connect_timeout: float
    read_timeout: float
    retry: Retry | int | None

    def budget(self) -> float:
        return request_budget(self.read_timeout, self.retry, self.connect_timeout)

    def describe(self) -> str:
        r = self.retry
        policy = (f"urllib3 Retry(total={r.total}, backoff_factor={r.backoff_factor}, status_forcelist="
                  f"{sorted(r.status_forcelist or [])})" if isinstance(r, Retry) else f"max_retries={r}")
        return (f"retry budget: up to {max_attempts(r)} attempt(s) under {policy}, timeout connect "
                f"{self.connect_timeout}s / read {self.read_timeout}s per attempt, worst case {self.budget():.0f}s")


# Paths whose 404 TRL 1.16 turns into an explanation of its own (trl==1.16.0:trl/generation/vllm_client.py:311,358:
# "restart it with VLLM_SERVER_DEV_MODE=1", "--enable-scale-out"): passed through for TRL to explain.
TRL_EXPLAINED_404 = ("/server_info", "/v1/chat/completions/render")


class HardenedAdapter(HTTPAdapter):
    """requests' transport adapter with a default timeout and errors that name the server.

    Mounted on TRL's ``VLLMClient.session`` with ``Session.mount`` (requests' public API for a transport), in place
    of the plain adapter TRL mounts, so every request of the client goes through :meth:`send`: ``_get``, ``_post``
    and TRL's direct session calls alike. No method of TRL's client is replaced."""

    def __init__(self, settings: _Hardening, pool_maxsize: int):
        super().__init__(pool_maxsize=pool_maxsize, max_retries=settings.retry)
        self.settings = settings
        self.versions = WeightVersion()

    def configure(self, settings: _Hardening) -> None:
        """Take new settings (timeouts and retry policy) for the next requests."""
        self.settings = settings
        self.max_retries = settings.retry

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        """Send with ``(connect, read)`` timeouts unless the caller gave one; a requests failure (after urllib3's
        retries) or a non-200 answer raises :class:`GenerationServerError` naming the request."""
        settings = self.settings
        if timeout is None:
            timeout = (settings.connect_timeout, settings.read_timeout)
        method, url = request.method or "GET", request.url or ""
        path, expected = urlparse(url).path, self.versions.synced
        if path.endswith("/reset_prefix_cache"):
            request.headers.update(self.versions.reset_headers())
        start = time.monotonic()
        try:
            response = super().send(request, stream=stream, timeout=timeout, verify=verify, cert=cert,
                                    proxies=proxies)
        except requests.ReadTimeout as exc:
            if method.upper() != "POST":
                raise self._spent(method, url, start, exc) from exc
            # Not re-sent (NoResendAfterReadTimeout): one timeout, one error, naming the knob to raise.
            read = timeout[1] if isinstance(timeout, tuple) else timeout
            raise GenerationServerError(url, (
                f"{describe_request(method, url, request.body)} got no answer: waited "
                f"{time.monotonic() - start:.1f}s (read timeout {read}s; vllm_request_timeout="
                f"{settings.read_timeout:g}s); not re-sent, the server may still be working on it"),
                READ_TIMEOUT_HINT) from exc
        except requests.RequestException as exc:
            raise self._spent(method, url, start, exc) from exc
        status = response.status_code
        if status != 200 and not (status == 404 and urlparse(url).path.endswith(TRL_EXPLAINED_404)):
            # A 4xx is the server refusing this request (not retried by urllib3): point at the request.
            hint = REJECTED_HINT if 400 <= status < 500 else FIX_HINT
            raise GenerationServerError(url, (
                f"{method} answered HTTP {status} after {time.monotonic() - start:.1f}s ({settings.describe()}); "
                f"body: {response.text[:300]!r}"), hint)
        if path.endswith("/reset_prefix_cache"):
            self.versions.sync_completed()
        elif path.endswith(GENERATION_PATHS):
            self.versions.check(url, response, expected)
        return response

    def _spent(self, method: str, url: str, start: float, exc: Exception) -> GenerationServerError:
        # Reached after urllib3 spent its retries (or on an error it does not retry).
        return GenerationServerError(url, (
            f"{method} failed after {time.monotonic() - start:.1f}s ({self.settings.describe()}); last error: "
            f"{type(exc).__name__}: {exc}"))


def hardening_of(client: Any) -> _Hardening | None:
    """The settings :func:`harden_client` put on ``client``'s session, or None when it is not hardened."""
    adapter = client.session.get_adapter(client.base_url)
    return adapter.settings if isinstance(adapter, HardenedAdapter) else None


def harden_client(client: Any, request_timeout: float, retries: Retry | None = None,
                  connect_timeout: float | None = None) -> None:
    """Bound and explain every HTTP request of an already-constructed TRL ``VLLMClient``.

    Mounts a :class:`HardenedAdapter` for ``http://`` and ``https://`` on ``client.session``:

    * every request gets ``timeout=(connect_timeout, request_timeout)`` unless the caller passes one;
      ``connect_timeout`` defaults to ``min(10, request_timeout)``. This covers ``_get``/``_post`` and TRL's direct
      ``session`` calls (``get_server_info``, ``image_features``, ``reset_prefix_cache``).
    * a requests exception (after urllib3's retries) or a non-200 status raises :class:`GenerationServerError`
      naming the server and the request, where TRL raises a bare ``Exception``; a 404 on the paths TRL explains
      itself (:data:`TRL_EXPLAINED_404`) is passed through to TRL's message.
    * ``retries``: replaces the Retry (tests use a small backoff); ``None`` keeps the one TRL mounted (6 attempts,
      60 s of backoff), so one request is bounded by ``request_budget`` (600 s -> 3720 s, 60 s -> 480 s).
      Either way the policy becomes :class:`NoResendAfterReadTimeout`: a POST that timed out is not re-sent, it
      raises one :class:`GenerationServerError` naming the request, the seconds waited and ``vllm_request_timeout``.
      ``request_timeout`` must still exceed the slowest legitimate generation (the preflight estimates it).

    Idempotent: a second call updates the settings of the adapter already mounted.
    """
    session = client.session
    current = session.get_adapter(client.base_url)
    chosen = retries if retries is not None else current.max_retries
    retry = NoResendAfterReadTimeout.like(chosen) if isinstance(chosen, Retry) else chosen
    connect = min(DEFAULT_CONNECT_TIMEOUT, request_timeout) if connect_timeout is None else connect_timeout
    settings = _Hardening(connect, request_timeout, retry)
    if isinstance(current, HardenedAdapter):
        current.configure(settings)
        return
    # TRL's adapter keeps a pool as large as its generation concurrency (connections reused across batches).
    pool_maxsize = current.poolmanager.connection_pool_kw.get("maxsize", 10)
    adapter = HardenedAdapter(settings, pool_maxsize=pool_maxsize)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
