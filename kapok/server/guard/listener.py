"""The node's listening socket: ``GuardedSite`` accepts every connection through the
``ConnectionGuard``, and serves it over TLS when ``server.tls_cert`` is set.

Each accepted connection's aiohttp protocol is wrapped by ``_Tracked``, which reports the
accept and the close to the guard; a connection the guard does not admit was answered and
closed at accept, and aiohttp never hears of it. The TLS handshake is bounded like the
request headers are (``server.header_timeout_s``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from kapok.config import Config
from kapok.errors import ConfigError
from kapok.server.aiohttp_seam import ListeningSite
from kapok.server.guard.connections import ConnectionGuard

__all__ = ["GuardedSite", "tls_context"]


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
