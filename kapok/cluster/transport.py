"""How gossip reaches the network: datagrams and short TCP streams, behind one small seam.

``GossipNode`` makes every decision about what it sends and what it does with what
arrives; a ``Transport`` only moves bytes (memberlist's ``Transport`` interface, for the
same reason): the node is given one where it is assembled, so a test or a fault injector
(``kapok.testing.faults``) can wrap the real one — drop datagrams, cut streams — without
reaching into the node.

The real one (``UdpTcpTransport``) binds a UDP datagram endpoint and a TCP listener on
one port number (as memberlist does): with port 0 the datagram socket picks a free port
and the listener takes the same number, retried a few times if that TCP port is taken.
What the streams carry (one length-prefixed blob) and every counter stay in the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Protocol

__all__ = [
    "DatagramHandler",
    "ErrorHandler",
    "StreamHandler",
    "Transport",
    "UdpTcpTransport",
    "format_addr",
    "split_addr",
]

_BIND_ATTEMPTS = 20  # port 0: tries to find a number free for both UDP and TCP
_BACKLOG = 64

DatagramHandler = Callable[[bytes, str], None]
"""``(data, from_addr)`` for every datagram that arrives; ``from_addr`` is ``host:port``."""
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
"""Serves one incoming TCP connection; the handler closes the writer."""
ErrorHandler = Callable[[OSError], None]
"""A datagram socket error reported by the OS (ICMP port unreachable and the like)."""


def split_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> ``(host, port)``; ValueError when malformed."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def format_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Transport(Protocol):
    """Datagrams and streams for one gossip node. ``start`` hands over the node's handlers
    and returns the bound port; after ``aclose`` nothing arrives and nothing is sent."""

    async def start(
        self,
        host: str,
        port: int,
        *,
        on_datagram: DatagramHandler,
        on_stream: StreamHandler,
        on_error: ErrorHandler,
    ) -> int: ...

    def sendto(self, data: bytes, target: tuple[str, int]) -> None:
        """Send one datagram (best effort); OSError when the socket refuses at once."""

    async def open_stream(self, target: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Dial ``target``'s listener; OSError when it cannot be reached."""

    async def aclose(self) -> None: ...


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: DatagramHandler, on_error: ErrorHandler) -> None:
        self.on_datagram = on_datagram
        self.on_error = on_error

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.on_datagram(data, format_addr(str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable and the like: the peer is gone, which probing finds out.
        self.on_error(exc if isinstance(exc, OSError) else OSError(str(exc)))


class UdpTcpTransport:
    """The real network: a UDP endpoint and a TCP listener sharing one port number."""

    def __init__(self) -> None:
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        # The incoming streams being served, so that ``aclose`` ends them itself: a handler
        # left to the event loop's teardown is cancelled there, and on Python 3.11 asyncio
        # logs every such cancel (of a ``start_server`` handler) as an error with a traceback.
        self._serving: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(
        self,
        host: str,
        port: int,
        *,
        on_datagram: DatagramHandler,
        on_stream: StreamHandler,
        on_error: ErrorHandler,
    ) -> int:
        loop = asyncio.get_running_loop()
        for attempt in range(_BIND_ATTEMPTS):
            udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(on_datagram, on_error), local_addr=(host, port)
            )
            bound = int(udp.get_extra_info("sockname")[1])
            try:
                self._tcp = await asyncio.start_server(
                    functools.partial(self._serve, on_stream), host, bound, backlog=_BACKLOG
                )
            except OSError:
                udp.close()
                if port != 0 or attempt == _BIND_ATTEMPTS - 1:
                    raise
                continue
            self._udp = udp
            return bound
        raise AssertionError("unreachable: the last attempt raises")  # pragma: no cover

    def sendto(self, data: bytes, target: tuple[str, int]) -> None:
        if self._udp is not None:
            self._udp.sendto(data, target)

    async def open_stream(self, target: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(*target)

    async def _serve(
        self, on_stream: StreamHandler, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None  # a start_server handler runs as a task
        self._serving[task] = writer
        try:
            await on_stream(reader, writer)
        finally:
            del self._serving[task]

    async def aclose(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp.wait_closed(), 1.0)
            self._tcp = None
        # Connections accepted before the close start their handlers on this turn of the
        # loop; then every stream still open is cut, and its handler ends on the lost
        # connection (an incomplete read), not on a cancel.
        await asyncio.sleep(0)
        for writer in self._serving.values():
            writer.transport.abort()
        if self._serving:
            await asyncio.wait(list(self._serving), timeout=1.0)
