"""What guards the node's connections: their limit, their time-outs, and what is counted of them.

``ConnectionGuard`` is the driver of ``ConnectionTable`` (see there for the rules):

* The listening socket (``kapok.server.guard.listener``) reports each connection's accept
  and close to it, so a connection counts from accept (a silent socket included), never
  just once it has become a WebSocket. A connection over the limit is answered a canned
  503 and closed before anything of it is read.
* ``guard_middleware`` (``kapok.server.guard.bodies``) moves a connection between IDLE,
  BODY and BUSY as its requests come and go; ``open_ws`` and the handshake mark
  WebSockets; ``trust`` marks a connection that showed the key.
* One sweep task closes connections past their deadline, twice a second.
* ``HttpServerLog`` replaces aiohttp's server log for guarded sites: a request aiohttp
  could not parse (a garbage request line, a header too long) is one rate-limited line
  and a counter, never a traceback.

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
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final, cast

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kapok.config import Config
from kapok.server.aiohttp_seam import check_hooks
from kapok.server.guard.conntable import Admit, ConnectionTable, ConnState, Limits
from kapok.tasks import cancel_and_wait

__all__ = ["GUARD", "ConnectionGuard", "closing", "trust"]

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
