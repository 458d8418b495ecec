"""The node's listening socket and what guards it: connection limits, time-outs, TLS.

``ConnectionGuard`` is the driver of ``ConnectionTable`` (see there for the rules):

* ``GuardedSite`` accepts connections through it. Each accepted connection's aiohttp
  protocol is wrapped by ``_Tracked``, which reports the accept and the close, so a
  connection counts from accept (a silent socket included), never just once it has
  become a WebSocket. A connection over the limit is answered a canned 503 and closed
  before anything of it is read.
* ``guard_middleware`` moves a connection between IDLE, BODY and BUSY as its requests
  come and go; ``open_ws`` and the handshake mark WebSockets; ``trust`` marks a
  connection that showed the key.
* One sweep task closes connections past their deadline, twice a second.
* ``HttpServerLog`` replaces aiohttp's server log for this site: a request aiohttp could
  not parse (a garbage request line, a header too long) is one rate-limited line and a
  counter, never a traceback.

Nothing is logged per connection: each sweep writes at most one line per reason with
how many connections it concerned, so a flood of bad connections costs a few lines a
second, and the counters (``kapok_connections_closed_total{reason}``) tell the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import resource
import ssl
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final, cast

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestHandler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kapok.config import Config
from kapok.errors import ConfigError, MessageTooLargeError
from kapok.server.aiohttp_seam import ListeningSite, can_keep_body, check_hooks, keep_body, send_100_continue
from kapok.server.guard.conntable import Admit, ConnectionTable, ConnState, Limits
from kapok.tasks import cancel_and_wait

__all__ = ["GUARD", "ConnectionGuard", "GuardedSite", "closing", "guard_middleware", "tls_context", "trust"]

log = logging.getLogger("kapok.server")

SWEEP_S = 0.5
# File descriptors kept for what is not a client: WAL segments, snapshots, the archiver's
# pipe, gossip and replication sockets, the listening socket itself.
FD_RESERVE = 64

_REASON_TEXT = {
    "header_timeout": "sent no complete request headers in time",
    "body_timeout": "sent no complete request body in time",
    "idle_timeout": "were idle too long after their last answer",
    "handshake_timeout": "did not finish the WebSocket handshake in time",
    "evicted": "were closed, unauthenticated, to make room for a new connection",
    "refused": "were refused: every connection slot is held by an authenticated client",
    "bad_request": "sent a request that is not valid HTTP",
}


def effective_max_connections(configured: int) -> int:
    """``server.max_connections``, lowered to what the process's file limit allows (the
    soft limit is first raised to the hard one)."""
    if sys.platform == "win32":
        return configured
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, int(soft) - FD_RESERVE))


def _canned_503() -> bytes:
    body = orjson.dumps(
        {"error": "too_many_connections", "message": "every connection slot of this node is in use"}
    )
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


REFUSED_RESPONSE: Final = _canned_503()


class ConnectionGuard(Collector):
    def __init__(self, config: Config) -> None:
        server = config.server
        self.limits = Limits(
            max_connections=server.max_connections,
            header_timeout_s=server.header_timeout_s,
            body_timeout_s=server.body_timeout_s,
            idle_timeout_s=server.idle_timeout_s,
            handshake_timeout_s=server.auth_timeout_s,
        )
        self.table = ConnectionTable(self.limits)
        self.closed: Counter[str] = Counter()  # by reason (metrics)
        self._pending: Counter[str] = Counter()  # by reason, since the last log line
        self._transports: dict[RequestHandler, asyncio.Transport] = {}
        self._bodies: dict[RequestHandler, web.BaseRequest] = {}  # requests in state BODY
        self._sweeper: asyncio.Task[None] | None = None
        self.http_log = HttpServerLog(self)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Called by the site once it listens: apply the file limit, start sweeping."""
        limit = effective_max_connections(self.limits.max_connections)
        if limit < self.limits.max_connections:
            log.warning(
                "server.max_connections lowered from %d to %d: the process may open only %d files",
                self.limits.max_connections, limit, limit + FD_RESERVE,
            )  # fmt: skip
            self.limits = dataclasses.replace(self.limits, max_connections=limit)
            self.table.limits = self.limits
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def aclose(self) -> None:
        if self._sweeper is not None:
            await cancel_and_wait(self._sweeper)
            self._sweeper = None

    # ------------------------------------------------------------ accept and close

    def accepted(self, handler: RequestHandler, transport: asyncio.Transport) -> bool:
        """A new connection: may it stay? (It is answered and closed when not.)"""
        loop = asyncio.get_running_loop()
        verdict, victim = self.table.admit(handler, loop.time())
        if verdict is Admit.NO:
            self._note("refused")
            transport.write(REFUSED_RESPONSE)
            transport.close()
            return False
        self._transports[handler] = transport
        if verdict is Admit.EVICT:
            self._note("evicted")
            gone = self._transports.pop(cast("RequestHandler", victim), None)
            if gone is not None:
                gone.close()
        return True

    def lost(self, handler: RequestHandler) -> None:
        self.table.closed(handler)
        self._transports.pop(handler, None)
        self._bodies.pop(handler, None)

    # ------------------------------------------------------------ request life

    def set_state(self, request: web.BaseRequest, state: ConnState) -> None:
        handler = request.protocol
        if handler not in self.table:
            return  # a server without this guard (tests), or the connection is gone
        self.table.set_state(handler, state, asyncio.get_running_loop().time())
        if state is ConnState.BODY:
            self._bodies[handler] = request
        else:
            self._bodies.pop(handler, None)

    def trust(self, request: web.BaseRequest) -> None:
        self.table.trust(request.protocol)

    def closing(self, request: web.BaseRequest, reason: str) -> None:
        """The request's handler closes its connection for ``reason``: count it here, once.
        The connection leaves its deadline (the sweep would count it a second time); what
        is left of its closing is bounded by the handler (a WebSocket's close time-out)."""
        self._note(reason)
        handler = request.protocol
        if handler in self.table:
            self.table.set_state(handler, ConnState.BUSY, asyncio.get_running_loop().time())
            self._bodies.pop(handler, None)

    # ------------------------------------------------------------ deadlines

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self._close_expired(loop.time())
                self._flush_log()
            except Exception:  # a bug here must not end the sweeping
                log.exception("connection sweep failed")

    def _close_expired(self, now: float) -> None:
        for handler, state in self.table.expired(now):
            handler = cast("RequestHandler", handler)
            request = self._bodies.pop(handler, None)
            if state is ConnState.BODY and (request is None or request.content.is_eof()):
                self.table.set_state(handler, ConnState.BUSY, now)  # the handler has it all
                continue
            self._note(self.table.reason(handler, state))
            self.table.closed(handler)
            transport = self._transports.pop(handler, None)
            if transport is not None:
                transport.close()

    def _note(self, reason: str) -> None:
        self.closed[reason] += 1
        self._pending[reason] += 1

    def _flush_log(self) -> None:
        for reason, n in self._pending.items():
            what = _REASON_TEXT.get(reason, reason)
            log.warning("%d connection(s) %s (%s)", n, what, reason)
        self._pending.clear()

    # ------------------------------------------------------------ metrics

    def collect(self) -> Iterator[Metric]:
        closed = CounterMetricFamily(
            "kapok_connections_closed", "Connections the node closed or refused, by reason", labels=["reason"]
        )
        for reason in _REASON_TEXT:
            closed.add_metric([reason], self.closed[reason])
        yield closed
        yield GaugeMetricFamily("kapok_connections_open", "Accepted TCP connections", value=len(self.table))
        yield GaugeMetricFamily(
            "kapok_connections_max", "server.max_connections in force", value=self.limits.max_connections
        )


GUARD: Final = web.AppKey("connection_guard", ConnectionGuard)


def trust(request: web.BaseRequest) -> None:
    """The request's connection has shown the right key: never evict it."""
    guard = request.app.get(GUARD) if isinstance(request, web.Request) else None
    if guard is not None:
        guard.trust(request)


def closing(request: web.Request, reason: str) -> None:
    """The handler closes the request's connection for ``reason`` (one of
    ``kapok_connections_closed_total``'s reasons, say ``handshake_timeout``)."""
    guard = request.app.get(GUARD)
    if guard is not None:
        guard.closing(request, reason)


def set_state(request: web.Request, state: ConnState) -> None:
    guard = request.app.get(GUARD)
    if guard is not None:
        guard.set_state(request, state)


@web.middleware
async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Track the connection's state; refuse a body over the limit by its Content-Length,
    and stop reading one of unknown length (chunked) once it went over."""
    guard = request.app.get(GUARD)
    too_large = body_too_large(request)
    if too_large is not None:
        return await _refuse_body(request, too_large)
    if guard is not None:
        guard.set_state(request, ConnState.BUSY if request.content.is_eof() else ConnState.BODY)
    try:
        if _unknown_length(request):
            # Read here, in the stream's own small steps: aiohttp's ``read`` would buffer up
            # to twice the limit first. Kept for the handler's ``read``/``post``/``json``.
            body = await _read_within(request)
            if body is None:
                return await _refuse_body(request, _over_the_limit(request))
            keep_body(request, body)
        response = await handler(request)
    finally:
        if guard is not None:
            guard.set_state(request, ConnState.IDLE)
    if response.status == 413 and not response.prepared and not request.content.is_eof():
        # The body went over the limit as the handler read it (aiohttp's ``post`` of a
        # multipart form stops at client_max_size); unanswered, aiohttp would then read the
        # rest, up to ten seconds of it, before the client heard of the 413. Never read.
        return await _refuse_body(request, _over_the_limit(request))
    return response


def _unknown_length(request: web.BaseRequest) -> bool:
    """A body without Content-Length (chunked) that the guard reads itself (not a multipart
    form: aiohttp's ``post`` reads those part by part, within the limit)."""
    return (
        request.content_length is None
        and request.body_exists
        and bool(request.client_max_size)
        and request.content_type != "multipart/form-data"
        and can_keep_body(request)
    )


async def _read_within(request: web.BaseRequest) -> bytes | None:
    """The whole body, or None as soon as it goes over the limit (the rest left unread)."""
    limit = request.client_max_size
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _over_the_limit(request: web.BaseRequest) -> MessageTooLargeError:
    return MessageTooLargeError(f"a request body is over this node's {request.client_max_size} bytes")


def body_too_large(request: web.BaseRequest) -> MessageTooLargeError | None:
    limit = request.client_max_size
    length = request.content_length
    if limit and length is not None and length > limit:
        return MessageTooLargeError(f"a request body of {length} bytes is over this node's {limit}")
    return None


async def _refuse_body(request: web.BaseRequest, exc: MessageTooLargeError) -> web.StreamResponse:
    """Answer 413 at once and close: the body is never read (not even to throw it away,
    which is what aiohttp would do for up to ten seconds after an answer)."""
    response = web.Response(
        body=orjson.dumps({"error": exc.code, "message": exc.message}),
        status=exc.http_status,
        content_type="application/json",
    )
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: say no before the client sends a body that is too large."""
    too_large = body_too_large(request)
    if too_large is not None:
        return await _refuse_body(request, too_large)
    if request.headers.get("Expect", "").lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"unknown Expect: {request.headers['Expect']}")
    if request.version >= (1, 1):
        await send_100_continue(request)
    return None


# ---------------------------------------------------------------- the socket


class _Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, reporting its accept and close to the guard."""

    __slots__ = ("_admitted", "_guard", "_inner")

    def __init__(self, guard: ConnectionGuard, inner: RequestHandler) -> None:
        self._guard = guard
        self._inner = inner
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast("asyncio.Transport", transport)
        if self._guard.accepted(self._inner, transport):
            self._admitted = True
            self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._admitted:
            self._guard.lost(self._inner)
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            self._inner.data_received(data)

    def eof_received(self) -> None:
        if self._admitted:
            self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class GuardedSite(ListeningSite):
    """``SockSite`` whose connections go through a ``ConnectionGuard`` (and TLS, if set)."""

    __slots__ = ("_guard", "_handshake_timeout_s")

    def __init__(self, runner: web.AppRunner, sock: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(runner, sock, **kwargs)
        self._guard = guard

    async def start(self) -> None:
        await super().start()
        self._guard.start()

    def protocol_factory(self, server: web.Server) -> Callable[[], asyncio.Protocol]:
        guard = self._guard

        def factory() -> asyncio.Protocol:
            inner = server()
            inner.logger = cast("logging.Logger", guard.http_log)
            return _Tracked(guard, inner)

        return factory

    def listen_options(self, tls: bool) -> dict[str, Any]:
        # The TLS handshake is bounded like headers are.
        return {"ssl_handshake_timeout": self._guard.limits.header_timeout_s} if tls else {}


def tls_context(config: Config) -> ssl.SSLContext | None:
    """The server's TLS context from ``server.tls_cert`` / ``server.tls_key`` (None: plain)."""
    server = config.server
    if not server.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(server.tls_cert, server.tls_key)
    except (OSError, ssl.SSLError) as exc:
        what = f"{server.tls_cert} / {server.tls_key}"
        raise ConfigError(f"server.tls_cert: cannot load {what}: {exc}") from None
    return context


async def guard_ctx(app: web.Application) -> AsyncIterator[None]:
    """The node's first start-up step: every hook into aiohttp's internals must be there
    (``aiohttp_seam.check_hooks``), so a node that could not refuse unmasked frames, say,
    stops here, before it recovers its storage or takes a master's role."""
    check_hooks()
    yield
    await app[GUARD].aclose()


# ---------------------------------------------------------------- aiohttp's server log


class HttpServerLog:
    """Stands in for aiohttp's server logger on guarded sites (``RequestHandler.logger``).

    aiohttp logs a request it cannot parse with a full traceback; an HTTP port on a
    network gets such requests all day. Those become one counted, rate-limited line;
    everything else goes to aiohttp's own logger unchanged.
    """

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._aiohttp = logging.getLogger("aiohttp.server")

    def _route(self, level: int, msg: str, args: tuple[Any, ...], exc_info: Any, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1] if exc_info else None
        if isinstance(exc, HttpProcessingError):
            self._guard._note("bad_request")
            return
        self._aiohttp.log(level, msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: str, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        self._route(logging.DEBUG, msg, args, exc_info, **kwargs)

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        self._route(logging.ERROR, msg, args, exc_info, **kwargs)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return cast("Callable[..., Any]", getattr(self._aiohttp, name))
