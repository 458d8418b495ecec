"""A TCP proxy that breaks the network on command: the nemesis of the replication fault tests.

The proxy listens on 127.0.0.1 (port 0) and forwards every connection it accepts to one
target; a slave whose ``replication.master`` is the proxy's ``url`` has its sync link run
through it. While connections are open, ``set_mode`` changes what the network does:

``pass``     forward everything as it comes.
``cut``      forward nothing either way. Connections stay open and bytes are held, in order,
             as TCP retransmits through a short partition; when the cut heals they flow
             again. (A peer's own timeouts, such as WebSocket heartbeats, still fire.)
``delay``    forward each chunk ``ms`` milliseconds after it was read, order kept (a slow link).
``one_way``  ``cut`` in one ``direction`` only (``to_server`` or ``to_client``).
``flap``     ``cut`` and ``pass`` by turns, every ``period_ms``, starting with ``cut``.
``refuse``   close each new connection at once with a reset (a stopped listener); the open
             ones are left as they are.
``reset``    reset every open connection now, then behave as ``pass``. ``reset()`` alone
             does the same and keeps the mode (``refuse`` then ``reset()``: nothing gets in).

The proxy reads on while it holds bytes back, so what it holds is its own memory: at most
``max_held_bytes`` over all its connections (default 64 MiB). A connection whose bytes would
go past that is reset and counted in ``overflows``, as a kernel gives up on a peer that
never acknowledges. When bytes wait only because the receiving side reads slowly, the
proxy stops reading instead (backpressure), so ``pass`` never overflows.

``FaultProxy`` lives on the caller's event loop; ``ThreadedFaultProxy``
(``kapok.testing.threadedproxy``) runs one on an event loop of its own, in a daemon thread,
for synchronous tests that drive ``kapok serve`` processes. Resets are real TCP resets
(``SO_LINGER`` 0), so peers see ``ECONNRESET``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import socket
import struct
from collections import deque

from kapok.testing.slow import scaled

__all__ = ["Direction", "FaultProxy", "Mode", "ProxyCounts"]

MODES = ("pass", "cut", "delay", "one_way", "flap", "refuse", "reset")
_CHUNK = 64 * 1024  # bytes asked for per read
_WINDOW = 256 * 1024  # bytes queued for a slow reader before the proxy stops reading
_CONNECT_TIMEOUT_S = scaled(5.0)  # to the target (KAPOK_TEST_SLOW: kapok.testing.slow)


class Direction(enum.StrEnum):
    TO_SERVER = "to_server"  # what the client sends
    TO_CLIENT = "to_client"  # what the target answers


@dataclasses.dataclass(frozen=True, slots=True)
class Mode:
    """What the proxy does now; ``set_mode`` builds and checks it."""

    name: str = "pass"
    delay_ms: float = 0.0  # delay
    direction: Direction | None = None  # one_way: the direction that is cut
    period_ms: float = 0.0  # flap

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise ValueError(f"unknown mode {self.name!r}; one of {', '.join(MODES)}")
        if self.delay_ms < 0 or (self.name == "flap") != (self.period_ms > 0):
            raise ValueError("delay needs ms >= 0; flap, and only flap, needs period_ms > 0")
        if (self.name == "one_way") != (self.direction is not None):
            raise ValueError("one_way, and only one_way, needs a direction")
        if self.delay_ms and self.name != "delay":
            raise ValueError("only delay takes ms")


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyCounts:
    """A snapshot of a proxy's counters (bytes as read from and written to the sockets)."""

    accepted: int  # connections accepted, refused ones included
    refused: int  # closed at once in ``refuse`` mode
    failed_connects: int  # the target could not be reached
    resets: int  # closed by ``reset``
    overflows: int  # reset for holding more than ``max_held_bytes``
    open: int  # connections forwarding now
    read_to_server: int
    forwarded_to_server: int
    read_to_client: int
    forwarded_to_client: int
    held_bytes: int  # read and not yet forwarded, all connections
    stalls: int  # times bytes were ready to go and waited for a cut to heal
    flips: int  # turns of ``flap``


class _Overflow(Exception):
    pass


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset rather than a FIN: what a dying middlebox or peer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Pipe:
    """One direction of one connection: a reader that queues chunks, a writer that forwards
    them when they are due and the direction's gate is open."""

    def __init__(
        self,
        proxy: FaultProxy,
        direction: Direction,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy, self.direction, self.reader, self.writer = proxy, direction, reader, writer
        self.chunks: deque[tuple[float, bytes]] = deque()  # (due on the loop's clock, data); b"" is EOF
        self.queued = 0
        self.arrived = asyncio.Event()
        self.draining = False
        self.drained = asyncio.Event()

    async def read_in(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.queued >= _WINDOW and self.draining:
                self.drained.clear()
                await self.drained.wait()
                continue
            data = await self.reader.read(_CHUNK)
            self.proxy._take(self.direction, len(data))
            self.chunks.append((loop.time() + self.proxy.mode.delay_ms / 1000, data))
            self.queued += len(data)
            self.arrived.set()
            if not data:
                return

    async def write_out(self) -> None:
        loop = asyncio.get_running_loop()
        gate = self.proxy._gates[self.direction]
        while True:
            if not self.chunks:
                self.arrived.clear()
                await self.arrived.wait()
                continue
            due, data = self.chunks[0]
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            if not gate.is_set():
                self.proxy.stalls += 1
                await gate.wait()
                continue  # the gate may have closed again before this task ran
            self.chunks.popleft()
            self.queued -= len(data)
            self.proxy._give(self.direction, len(data))
            if not data:
                if self.writer.can_write_eof():
                    self.writer.write_eof()  # a half-close travels on, after what came before it
                return
            self.writer.write(data)
            self.draining = True
            await self.writer.drain()
            self.draining = False
            self.drained.set()


class FaultProxy:
    """The proxy on the running event loop: ``await start()`` (or ``async with``), then
    ``set_mode`` at will, ``aclose()`` at the end. Counters are plain attributes."""

    def __init__(self, target_host: str, target_port: int, *, max_held_bytes: int = 64 * 1024 * 1024) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.max_held_bytes = max_held_bytes
        self.mode = Mode()
        self.accepted = self.refused = self.failed_connects = self.resets = self.overflows = 0
        self.read = dict.fromkeys(Direction, 0)
        self.forwarded = dict.fromkeys(Direction, 0)
        self.held_bytes = self.stalls = self.flips = 0
        self._gates = {direction: asyncio.Event() for direction in Direction}
        for gate in self._gates.values():
            gate.set()
        self._server: asyncio.Server | None = None
        self._port = 0
        self._links: dict[asyncio.Task[None], tuple[asyncio.StreamWriter, ...]] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._flapper: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._links)

    def is_open(self, direction: Direction | str) -> bool:
        """Whether bytes going ``direction`` are forwarded at this moment."""
        return self._gates[Direction(direction)].is_set()

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def set_mode(
        self,
        mode: str,
        *,
        ms: float = 0.0,
        direction: Direction | str | None = None,
        period_ms: float = 0.0,
    ) -> Mode:
        """Switch modes (see the module's docstring); applies to open connections at once."""
        new = Mode(mode, ms, None if direction is None else Direction(direction), period_ms)
        if self._flapper is not None:
            self._flapper.cancel()
            self._flapper = None
        if new.name == "reset":
            self.reset()
            new = Mode()
        self.mode = new
        if new.name in ("cut", "flap"):  # flap starts cut
            closed = set(Direction)
        else:
            closed = {new.direction} if new.direction is not None else set()
        for each in Direction:
            self._open(each, each not in closed)
        if new.name == "flap":
            self._flapper = asyncio.get_running_loop().create_task(self._flap(new.period_ms / 1000))
        return new

    def reset(self) -> int:
        """Reset every open connection now (the mode stays); returns how many."""
        links = list(self._links)
        for task in links:
            self._abort(task)
        self.resets += len(links)
        return len(links)

    def counts(self) -> ProxyCounts:
        return ProxyCounts(
            accepted=self.accepted,
            refused=self.refused,
            failed_connects=self.failed_connects,
            resets=self.resets,
            overflows=self.overflows,
            open=len(self._links),
            read_to_server=self.read[Direction.TO_SERVER],
            forwarded_to_server=self.forwarded[Direction.TO_SERVER],
            read_to_client=self.read[Direction.TO_CLIENT],
            forwarded_to_client=self.forwarded[Direction.TO_CLIENT],
            held_bytes=self.held_bytes,
            stalls=self.stalls,
            flips=self.flips,
        )

    async def aclose(self) -> None:
        """Stop listening and reset every connection (a second call does nothing)."""
        flapper, self._flapper = self._flapper, None
        if flapper is not None:
            flapper.cancel()
        if self._server is not None:
            self._server.close()
        for task in list(self._links):
            self._abort(task)
        await asyncio.gather(*self._handlers, *([flapper] if flapper else []), return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _open(self, direction: Direction, is_open: bool) -> None:
        if is_open:
            self._gates[direction].set()
        else:
            self._gates[direction].clear()

    async def _flap(self, period_s: float) -> None:
        is_cut = True
        while True:
            await asyncio.sleep(period_s)
            is_cut = not is_cut
            for direction in Direction:
                self._open(direction, not is_cut)
            self.flips += 1

    def _take(self, direction: Direction, n: int) -> None:
        if self.held_bytes + n > self.max_held_bytes:
            raise _Overflow
        self.read[direction] += n
        self.held_bytes += n

    def _give(self, direction: Direction, n: int) -> None:
        self.held_bytes -= n
        self.forwarded[direction] += n

    def _abort(self, task: asyncio.Task[None]) -> None:
        for writer in self._links.pop(task, ()):
            _rst(writer)
        task.cancel()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        # asyncio runs this as a task per accepted connection. The forwarding runs in a task
        # of its own, which ``reset`` cancels: Python 3.11's stream server logs a cancelled
        # connection task as an error.
        self.accepted += 1
        if self.mode.name == "refuse" or self._server is None or not self._server.is_serving():
            self.refused += 1
            _rst(client_writer)
            return
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        link = asyncio.create_task(self._forward(client_reader, client_writer))
        self._links[link] = (client_writer,)
        try:
            await asyncio.wait([link])
        finally:
            self._handlers.discard(handler)

    async def _forward(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        link = asyncio.current_task()
        assert link is not None
        pipes: list[_Pipe] = []
        tasks: list[asyncio.Task[None]] = []
        clean = False
        try:
            try:
                connect = asyncio.open_connection(self.target_host, self.target_port)
                server_reader, server_writer = await asyncio.wait_for(connect, _CONNECT_TIMEOUT_S)
            except OSError:
                self.failed_connects += 1
                return
            self._links[link] = (client_writer, server_writer)
            pipes = [
                _Pipe(self, Direction.TO_SERVER, client_reader, server_writer),
                _Pipe(self, Direction.TO_CLIENT, server_reader, client_writer),
            ]
            tasks = [asyncio.create_task(run()) for pipe in pipes for run in (pipe.read_in, pipe.write_out)]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            errors = [t.exception() for t in tasks if t.done() and not t.cancelled()]
            if any(isinstance(error, _Overflow) for error in errors):
                self.overflows += 1
            clean = not any(errors)
        finally:
            # Bookkeeping first, with no await before it: a reset may cancel this task again.
            for t in tasks:
                t.cancel()  # a cancelled pipe takes and gives no more bytes
            self.held_bytes -= sum(pipe.queued for pipe in pipes)
            for writer in self._links.pop(link, ()):
                if clean:
                    writer.close()
                else:
                    _rst(writer)
            await asyncio.gather(*tasks, return_exceptions=True)
