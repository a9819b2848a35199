"""Bounded HTTP under every Hub call, installed with huggingface_hub's own client factory.

huggingface_hub 2.4 sends every request through one shared `httpx2.Client`, created by the
factory given to `set_client_factory`. Its default client has `timeout=None`, and its paginated
and bucket calls go through `http_backoff`, which retries 408/429/5xx and network errors up to
five times, sleeping up to a rate limit's reset, inside our activity. Two things make that
safe here, both in one transport wrapped around the real one (`BoundedTransport`):

- **Every request is bounded.** Each of its connect/read/write/pool timeouts is the factory's
  (`HubHttpLimits`), never None (the library passes `timeout=None` explicitly on paginated
  calls, which would override a client default), and never longer than what is left of the
  call's budget (`CallBudget`: the activity's own timeout, minus a margin). Those timeouts are
  httpcore's, one per socket wait; so that a server that trickles its headers or its body a
  byte at a time is cut at the deadline too, every socket wait under the real transport is
  itself cut to what is left (`DeadlineBackend`). No request starts after the deadline or
  after its activity was cancelled.
- **The library never retries.** A 408/429/5xx answer and a transport error reach the library
  as our own `HubNotAnswering` exceptions, which `http_backoff` does not catch: the activity
  fails at once and Temporal's retry policy, the one retry loop, tries again (a 429's reset
  becomes the next attempt's delay, `activities/backends/hf/errors.py`). One exception: a read
  timeout
  in a Server-Sent-Events body (job logs) passes through as the library expects it, since the
  library reads "no event for 5 s" as the end of the log replay. That end is no proof the
  whole log was read: the score read does not trust it (`activities/jobs/activities.py`
  `read_score` reads a log without a score line again before it counts).

The budget travels in a context variable set by `activities/backends/hf/calls.py` in the thread that
makes the call, so it reaches the transport through the library without any of its APIs.
"""

from __future__ import annotations

import contextvars
import ipaddress
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpcore2
import httpx2
from httpcore2._types import SOCKET_OPTION
from httpx2._utils import get_environment_proxies
from huggingface_hub import set_client_factory
from huggingface_hub.utils import parse_ratelimit_headers
from huggingface_hub.utils._http import hf_request_event_hook

from posttrain_env.limits import (
    HUB_ACTIVITY_MARGIN_S,
    HUB_CALL_THREADS,
    HUB_CALL_TIMEOUT_S,
    HUB_CONNECT_TIMEOUT_S,
    HUB_MAX_RETRY_AFTER_S,
    HUB_POOL_TIMEOUT_S,
    HUB_READ_TIMEOUT_S,
    HUB_WRITE_TIMEOUT_S,
)

# The statuses huggingface_hub's `http_backoff` retries itself (its
# `_DEFAULT_RETRY_ON_STATUS_CODES`): answered to it as an exception so that it cannot.
NOT_RETRIED_HERE = frozenset({408, 429, 500, 502, 503, 504})
_ERROR_BODY_BYTES = 4096  # of an answer turned into HubBusy: enough for the Hub's message


@dataclass(frozen=True)
class HubHttpLimits:
    """The bounds of Hub calls (defaults: `posttrain_env/limits.py`); tests shorten them."""

    connect_s: float = HUB_CONNECT_TIMEOUT_S
    read_s: float = HUB_READ_TIMEOUT_S
    write_s: float = HUB_WRITE_TIMEOUT_S
    pool_s: float = HUB_POOL_TIMEOUT_S
    call_s: float = HUB_CALL_TIMEOUT_S
    activity_margin_s: float = HUB_ACTIVITY_MARGIN_S
    threads: int = HUB_CALL_THREADS

    def timeout(self) -> httpx2.Timeout:
        return httpx2.Timeout(
            connect=self.connect_s, read=self.read_s, write=self.write_s, pool=self.pool_s
        )


# -- what the library sees instead of a retryable answer ------------------------------------------


class HubNotAnswering(Exception):
    """The Hub gave no usable answer; a later attempt may get one. Not an httpx2 error, so the
    library's own retry loops let it through."""


class HubBusy(HubNotAnswering):
    """The Hub answered 408, 429 or 5xx."""

    def __init__(
        self, status: int, retry_after_s: float | None, what: str, server_said: str
    ) -> None:
        super().__init__(f"{status} for {what}")
        self.status = status
        self.retry_after_s = retry_after_s
        self.what = what
        self.server_said = server_said


class HubUnreachable(HubNotAnswering):
    """The request failed in transport (connect, read or write timeout, a dropped connection)."""


class HubDeadlineExceeded(HubNotAnswering):
    """The call's budget ran out: no request is started after this, and none outlives it."""


class HubCallAbandoned(HubNotAnswering):
    """The activity that made the call was cancelled: the call stops at its next request."""


# -- the budget of one call ---------------------------------------------------------------------


@dataclass
class CallBudget:
    """Until when (time.monotonic) the requests of one Hub call may run."""

    deadline: float
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Set when a socket wait cut to the deadline timed out (a clock may read a hair early).
    ran_out: bool = False

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def spent(self) -> bool:
        return self.ran_out or self.remaining() <= 0

    def check(self, what: str) -> float:
        """Seconds left; raises when there are none or the call was abandoned."""
        if self.cancelled.is_set():
            raise HubCallAbandoned(f"{what}: the activity was cancelled")
        left = self.remaining()
        if left <= 0:
            raise HubDeadlineExceeded(f"{what}: the call's time ran out")
        return left


CURRENT_BUDGET: contextvars.ContextVar[CallBudget | None] = contextvars.ContextVar(
    "posttrain_hub_call_budget", default=None
)


# -- the transport --------------------------------------------------------------------------------


class BoundedTransport(httpx2.BaseTransport):
    """Wraps the real transport: timeouts never None nor past the budget, bodies read under the
    budget, and retryable answers turned into `HubNotAnswering` (see the module docstring)."""

    def __init__(self, inner: httpx2.BaseTransport, limits: HubHttpLimits) -> None:
        self._inner = inner
        self._limits = limits

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        what = f"{request.method} {request.url.path}"
        budget = CURRENT_BUDGET.get()
        left = budget.check(what) if budget is not None else None
        request.extensions["timeout"] = self._timeouts(request, left)
        try:
            response = self._inner.handle_request(request)
        except httpx2.TransportError as err:
            raise _unreachable(err, what, budget) from err
        sse = response.headers.get("content-type", "").startswith("text/event-stream")
        assert isinstance(response.stream, httpx2.SyncByteStream)  # a sync transport's
        response.stream = BudgetedStream(response.stream, budget, what, sse=sse)
        if response.status_code in NOT_RETRIED_HERE:
            raise _busy(response, what)
        return response

    def close(self) -> None:
        self._inner.close()

    def _timeouts(self, request: httpx2.Request, left: float | None) -> dict[str, float]:
        asked = request.extensions.get("timeout") or {}
        ours = {
            "connect": self._limits.connect_s,
            "read": self._limits.read_s,
            "write": self._limits.write_s,
            "pool": self._limits.pool_s,
        }
        bounded = {}
        for name, default in ours.items():
            value = asked.get(name)
            # The library may ask for less (a log stream's 5 s), never for more than ours.
            value = default if value is None else min(float(value), default)
            bounded[name] = value if left is None else min(value, left)
        return bounded


class BudgetedStream(httpx2.SyncByteStream):
    """A response body read under the call's budget."""

    def __init__(
        self, inner: httpx2.SyncByteStream, budget: CallBudget | None, what: str, *, sse: bool
    ) -> None:
        self._inner = inner
        self._budget = budget
        self._what = what
        self._sse = sse

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._inner:
                if self._budget is not None:
                    self._budget.check(self._what)
                yield chunk
        except httpx2.ReadTimeout as err:
            past = self._budget is not None and self._budget.spent()
            if self._sse and not past:
                raise  # the library's "end of the log replay"
            raise _unreachable(err, self._what, self._budget) from err
        except httpx2.TransportError as err:
            raise _unreachable(err, self._what, self._budget) from err

    def close(self) -> None:
        self._inner.close()


def _unreachable(err: Exception, what: str, budget: CallBudget | None) -> HubNotAnswering:
    if budget is not None and budget.cancelled.is_set():
        return HubCallAbandoned(f"{what}: the activity was cancelled")
    if budget is not None and budget.spent():
        return HubDeadlineExceeded(f"{what}: the call's time ran out ({type(err).__name__})")
    return HubUnreachable(f"{what}: {type(err).__name__} {err}".strip())


def _busy(response: httpx2.Response, what: str) -> HubBusy:
    said = ""
    try:
        said = response.read()[:_ERROR_BODY_BYTES].decode("utf-8", "replace").strip()
        error = json.loads(said).get("error") if said.startswith("{") else None
        said = error if isinstance(error, str) else said  # the Hub's {"error": "..."}
    except (HubNotAnswering, ValueError):
        pass
    finally:
        response.close()
    said = response.headers.get("X-Error-Message") or said
    return HubBusy(response.status_code, retry_after_s(response), what, said)


def retry_after_s(response: httpx2.Response) -> float | None:
    """How long the Hub asks us to wait: the reset of an exhausted rate limit (`RateLimit`
    header, read with the library's own parser) or `Retry-After` in seconds; +1 s as the
    library adds, capped at HUB_MAX_RETRY_AFTER_S."""
    wait: float | None = None
    limit = parse_ratelimit_headers(response.headers)
    if response.status_code == 429 and limit is not None and limit.remaining == 0:
        wait = float(limit.reset_in_seconds)
    else:
        value = response.headers.get("Retry-After", "").strip()
        wait = float(value) if value.isdigit() else None
    return None if wait is None else min(wait + 1.0, HUB_MAX_RETRY_AFTER_S)


# -- the network under the transport: socket waits cut at the deadline ------------------------


class DeadlineBackend(httpcore2.NetworkBackend):
    """httpcore's own sockets, each wait of which ends by the call's deadline.

    httpcore applies a read timeout to each `recv`, not to a request: a server that sends a
    byte every few seconds (headers trickled, or a TLS handshake) keeps a request alive for as
    long as it likes, each wait inside the timeout. Here every connect, read and write waits
    at most what is left of the budget (`CURRENT_BUDGET`, set in the thread that makes the
    request: a pooled connection serves each request in its caller's thread); a TLS
    handshake is bounded as a whole by its timeout (`ssl` makes it one deadline). The name
    lookup before a connect, which the system resolver would bound only by its own timeouts
    (seconds per server and attempt), runs in a resolver thread of its own and is awaited for
    at most the connect's wait (`resolve`). hf_xet's uploads use a client of their own:
    `activities/backends/hf/calls.py` stops awaiting a call at its deadline."""

    def __init__(self, inner: httpcore2.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> httpcore2.NetworkStream:
        wait = _wait(timeout, httpcore2.ConnectTimeout)
        with _cut(wait):
            addresses = resolve(host, port, wait.seconds)
        error: Exception | None = None
        for address in addresses:  # as socket.create_connection: each address in turn
            wait = _wait(timeout, httpcore2.ConnectTimeout)
            try:
                with _cut(wait):
                    stream = self._inner.connect_tcp(
                        address, port, wait.seconds, local_address, socket_options
                    )
            except httpcore2.ConnectError as err:
                error = err
                continue
            return DeadlineStream(stream)
        raise error or httpcore2.ConnectError(f"no address for {host}")

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> httpcore2.NetworkStream:
        wait = _wait(timeout, httpcore2.ConnectTimeout)
        with _cut(wait):
            stream = self._inner.connect_unix_socket(path, wait.seconds, socket_options)
        return DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class DeadlineStream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        wait = _wait(timeout, httpcore2.ReadTimeout)
        with _cut(wait):
            return self._inner.read(max_bytes, wait.seconds)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        wait = _wait(timeout, httpcore2.WriteTimeout)
        with _cut(wait):
            self._inner.write(buffer, wait.seconds)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.NetworkStream:
        # `ssl` bounds a whole handshake by the socket's timeout (not each of its reads).
        wait = _wait(timeout, httpcore2.ConnectTimeout)
        with _cut(wait):
            return DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, wait.seconds))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


# Name lookups run here, never in the Hub call's own thread: a lookup the resolver holds past
# the deadline keeps one of these threads, not the call. Few: lookups are quick or all stuck.
_RESOLVER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hf-dns")


def resolve(host: str, port: int, seconds: float | None) -> list[str]:
    """The addresses of `host` (an address is its own), looked up for at most `seconds`:
    `httpcore2.ConnectTimeout` after that, `httpcore2.ConnectError` when the name is unknown."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return [host]
    lookup = _RESOLVER.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        found = lookup.result(timeout=seconds)
    except FuturesTimeout:
        lookup.cancel()  # if it has not started yet
        raise httpcore2.ConnectTimeout(f"looking up {host} took too long") from None
    except OSError as err:  # socket.gaierror: unknown name, no network
        raise httpcore2.ConnectError(f"looking up {host}: {err}") from err
    return list(dict.fromkeys(str(info[4][0]) for info in found))


@dataclass
class _Wait:
    seconds: float | None  # what the socket may wait
    budget: CallBudget | None  # the call's, if any
    cut: bool = False  # the deadline, not the timeout asked for, decides it


def _wait(timeout: float | None, error: type[Exception]) -> _Wait:
    """The wait a socket operation may make: `timeout`, cut to the call's budget. Raises
    `error` when no time is left or the call was abandoned."""
    budget = CURRENT_BUDGET.get()
    if budget is None:
        return _Wait(timeout, None)
    if budget.cancelled.is_set():
        raise error("the activity was cancelled")
    left = budget.remaining()
    if left <= 0:
        budget.ran_out = True
        raise error("the call's time ran out")
    if timeout is not None and timeout < left:
        return _Wait(timeout, budget)
    return _Wait(left, budget, cut=True)


@contextmanager
def _cut(wait: _Wait) -> Iterator[None]:
    """A timeout of a wait the deadline decided is the deadline's (`CallBudget.ran_out`)."""
    try:
        yield
    except httpcore2.TimeoutException:
        if wait.cut and wait.budget is not None:
            wait.budget.ran_out = True
        raise


def deadline_transport(proxy: str | None = None) -> httpx2.HTTPTransport:
    """httpx2's own transport (through `proxy`, if given) over `DeadlineBackend`."""
    transport = httpx2.HTTPTransport(proxy=proxy)
    # httpx2 takes no network backend; its connection pool keeps the one it passes to each
    # new connection here (checked by tests/hf: a trickled answer ends at the deadline).
    pool = transport._pool
    pool._network_backend = DeadlineBackend(pool._network_backend)
    return transport


# -- the client factory ----------------------------------------------------------------------------


def hub_client_factory(
    limits: HubHttpLimits, transport: httpx2.BaseTransport | None = None
) -> Callable[[], httpx2.Client]:
    """A factory for `set_client_factory`: the library's default client (its request hook,
    redirects) over `BoundedTransport` and with bounded timeouts. `transport` is the network
    (default: httpx2's own); tests pass a fake Hub there."""

    def factory() -> httpx2.Client:
        inner = transport if transport is not None else deadline_transport()
        return httpx2.Client(
            transport=BoundedTransport(inner, limits),
            mounts=proxy_mounts(limits) if transport is None else None,
            event_hooks={"request": [hf_request_event_hook]},
            follow_redirects=True,
            timeout=limits.timeout(),
        )

    return factory


def proxy_mounts(limits: HubHttpLimits) -> dict[str, httpx2.BaseTransport | None]:
    """The environment's proxies (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`) as
    bounded transports, read as httpx2 reads them for the library's default client: a client
    given a transport of its own ignores them, which would cut a worker behind a proxy off
    the Hub."""
    return {
        pattern: None if url is None else BoundedTransport(deadline_transport(url), limits)
        for pattern, url in get_environment_proxies().items()
    }


def install_hub_client(
    limits: HubHttpLimits | None = None, transport: httpx2.BaseTransport | None = None
) -> None:
    """Make every huggingface_hub request of this process bounded (see the module docstring).
    Process-wide, as the library's client is: the worker calls it once, before any Hub call."""
    set_client_factory(hub_client_factory(limits or HubHttpLimits(), transport))
