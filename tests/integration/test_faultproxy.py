"""The fault proxy on real sockets (127.0.0.1, port 0): each mode does what it says.

Waits poll with a deadline (``eventually``). That bytes are *held* is shown without
waiting for time to pass: the proxy has counted them as read, the far end has not got
them, and they arrive, in order, once the fault heals. The health watcher is tested here
too, against small aiohttp apps, since it needs real HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import socketserver
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kapok.testing import eventually
from kapok.testing.faultproxy import Direction, FaultProxy
from kapok.testing.history import HealthWatcher
from kapok.testing.slow import scaled
from kapok.testing.threadedproxy import ThreadedFaultProxy

pytestmark = pytest.mark.timeout(60)

T = scaled(10.0)  # upper bound of every wait


class End:
    """One end of a TCP connection: what it received and how it ended. ``echo`` sends back
    what it reads; ``paused`` reads nothing until ``resume()``."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        echo: bool = False,
        paused: bool = False,
    ) -> None:
        self.reader, self.writer, self.echo = reader, writer, echo
        self.received = bytearray()
        self.error: BaseException | None = None
        self.eof = False
        self._reading = asyncio.Event()
        if not paused:
            self._reading.set()
        self._task = asyncio.create_task(self._read())

    @property
    def ended(self) -> bool:
        return self._task.done()

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def resume(self) -> None:
        self._reading.set()

    async def _read(self) -> None:
        try:
            while True:
                await self._reading.wait()
                data = await self.reader.read(1 << 20)
                if not data:
                    self.eof = True
                    return
                self.received += data
                if self.echo:
                    self.writer.write(data)
                    await self.writer.drain()
        except OSError as exc:
            self.error = exc

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


class Net:
    """A target server, the proxy in front of it, and the test's clients."""

    def __init__(self, *, echo: bool = False, paused: bool = False) -> None:
        self.echo, self.paused = echo, paused
        self.served: list[End] = []  # the target's ends, in order of connection
        self.clients: list[End] = []
        self.proxies: list[FaultProxy] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    @property
    def port(self) -> int:
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.served.append(End(reader, writer, echo=self.echo, paused=self.paused))

    async def proxy(self, **kwargs: Any) -> FaultProxy:
        proxy = await FaultProxy("127.0.0.1", self.port, **kwargs).start()
        self.proxies.append(proxy)
        return proxy

    async def connect(self, proxy: FaultProxy) -> End:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        end = End(reader, writer)
        self.clients.append(end)
        return end

    async def connected(self, proxy: FaultProxy) -> tuple[End, End]:
        """A client through ``proxy`` and the target's end of it, once the two are joined."""
        count = len(self.served)
        client = await self.connect(proxy)
        await eventually(lambda: len(self.served) > count, timeout_s=T, what="the target's accept")
        return client, self.served[-1]

    async def aclose(self) -> None:
        for end in self.clients:
            await end.aclose()
        for proxy in self.proxies:
            await proxy.aclose()
        if self.server is not None:
            self.server.close()
        for end in self.served:
            await end.aclose()
        if self.server is not None:
            await self.server.wait_closed()


@pytest.fixture
async def net() -> AsyncIterator[Net]:
    net = Net()
    await net.start()
    yield net
    await net.aclose()


@pytest.fixture
async def echo_net() -> AsyncIterator[Net]:
    net = Net(echo=True)
    await net.start()
    yield net
    await net.aclose()


async def got(end: End, data: bytes, what: str = "the bytes") -> None:
    await eventually(lambda: bytes(end.received) == data, timeout_s=T, what=f"{what} (want {data!r})")


# --- pass ------------------------------------------------------------------------------


async def test_pass_forwards_both_ways_and_counts_bytes(net: Net) -> None:
    proxy = await net.proxy()
    client, server = await net.connected(proxy)
    client.send(b"hello")
    server.send(b"world!")
    await got(server, b"hello")
    await got(client, b"world!")
    counts = proxy.counts()
    assert (counts.accepted, counts.open) == (1, 1)
    assert (counts.read_to_server, counts.forwarded_to_server) == (5, 5)
    assert (counts.read_to_client, counts.forwarded_to_client) == (6, 6)
    assert counts.held_bytes == 0 and counts.stalls == 0
    assert proxy.url == f"http://127.0.0.1:{proxy.port}"


async def test_a_half_close_travels_after_the_bytes_before_it(net: Net) -> None:
    proxy = await net.proxy()
    client, server = await net.connected(proxy)
    client.send(b"last words")
    client.writer.write_eof()
    await eventually(lambda: server.eof, timeout_s=T, what="the EOF at the target")
    assert server.received == b"last words"
    server.send(b"reply after EOF")  # the other direction is still open
    await got(client, b"reply after EOF")


# --- cut -------------------------------------------------------------------------------


async def test_cut_holds_bytes_both_ways_keeps_connections_and_heals_in_order(net: Net) -> None:
    proxy = await net.proxy()
    client, server = await net.connected(proxy)
    client.send(b"0")
    await got(server, b"0")
    proxy.set_mode("cut")
    client.send(b"abc")
    server.send(b"xyz")
    client.send(b"def")
    await eventually(lambda: proxy.held_bytes == 9, timeout_s=T, what="the proxy holding all 9 bytes")
    assert server.received == b"0" and client.received == b""
    assert proxy.forwarded == {Direction.TO_SERVER: 1, Direction.TO_CLIENT: 0}
    assert proxy.open_connections == 1 and not client.ended and not server.ended
    assert not proxy.is_open("to_server") and not proxy.is_open(Direction.TO_CLIENT)
    proxy.set_mode("pass")
    await got(server, b"0abcdef")
    await got(client, b"xyz")
    assert proxy.held_bytes == 0
    assert proxy.stalls >= 2  # one per direction at least


async def test_a_connection_made_during_a_cut_waits_and_then_flows(echo_net: Net) -> None:
    proxy = await echo_net.proxy()
    proxy.set_mode("cut")
    client = await echo_net.connect(proxy)
    client.send(b"early")
    await eventually(lambda: proxy.held_bytes == 5, timeout_s=T, what="the held request")
    proxy.set_mode("pass")
    await got(client, b"early")


async def test_holding_more_than_the_cap_resets_the_connection_and_counts_it(net: Net) -> None:
    proxy = await net.proxy(max_held_bytes=256 * 1024)
    client, server = await net.connected(proxy)
    proxy.set_mode("cut")
    client.send(b"x" * (1024 * 1024))
    await eventually(lambda: client.ended and server.ended, timeout_s=T, what="both ends reset")
    assert proxy.overflows == 1 and proxy.open_connections == 0
    assert proxy.held_bytes == 0  # what the reset connection held is given back
    assert isinstance(client.error, ConnectionResetError)
    assert server.received == b""


async def test_a_slow_reader_gets_backpressure_not_an_overflow() -> None:
    net = Net(paused=True)  # the target reads nothing until told
    await net.start()
    try:
        cap = 1024 * 1024
        proxy = await net.proxy(max_held_bytes=cap)
        client, server = await net.connected(proxy)
        size = 48 * 1024 * 1024  # far more than the kernel's buffers on the way can take
        client.send(b"y" * size)
        # The proxy's queue fills to its window while the target does not read; reading
        # on would overflow the cap at once.
        await eventually(lambda: proxy.held_bytes >= 256 * 1024, timeout_s=T, what="a full window")
        server.resume()
        await eventually(lambda: len(server.received) == size, timeout_s=scaled(30), what="every byte")
        assert proxy.overflows == 0 and proxy.forwarded[Direction.TO_SERVER] == size
    finally:
        await net.aclose()


# --- delay -----------------------------------------------------------------------------


async def test_delay_forwards_each_chunk_later_and_keeps_the_order(echo_net: Net) -> None:
    proxy = await echo_net.proxy()
    client, _ = await echo_net.connected(proxy)
    proxy.set_mode("delay", ms=150)
    loop = asyncio.get_running_loop()
    sent_at = loop.time()
    client.send(b"ping")
    await got(client, b"ping")
    assert loop.time() - sent_at >= 2 * 0.150 - 0.01  # there and back, each way delayed
    chunks = [f"{i:03};".encode() for i in range(100)]
    for chunk in chunks:
        client.send(chunk)
        await client.writer.drain()
        await asyncio.sleep(0)  # separate reads at the proxy, as far as the kernel allows
    await got(client, b"ping" + b"".join(chunks), "every chunk, in order")


async def test_leaving_delay_keeps_the_order_of_chunks_already_delayed(echo_net: Net) -> None:
    proxy = await echo_net.proxy()
    client, server = await echo_net.connected(proxy)
    proxy.set_mode("delay", ms=300)
    client.send(b"slow;")
    await eventually(lambda: proxy.held_bytes == 5, timeout_s=T, what="the delayed chunk")
    proxy.set_mode("pass")
    client.send(b"fast;")
    await got(server, b"slow;fast;")


# --- one way ---------------------------------------------------------------------------


@pytest.mark.parametrize("direction", list(Direction))
async def test_one_way_cuts_one_direction_only(net: Net, direction: Direction) -> None:
    proxy = await net.proxy()
    client, server = await net.connected(proxy)
    proxy.set_mode("one_way", direction=direction)
    cut_from, cut_to = (client, server) if direction is Direction.TO_SERVER else (server, client)
    ok_from, ok_to = (server, client) if direction is Direction.TO_SERVER else (client, server)
    cut_from.send(b"held")
    ok_from.send(b"flows")
    await got(ok_to, b"flows")
    await eventually(lambda: proxy.read[direction] == 4, timeout_s=T, what="the held bytes read")
    assert cut_to.received == b"" and proxy.forwarded[direction] == 0
    assert not proxy.is_open(direction) and proxy.is_open(next(d for d in Direction if d != direction))
    proxy.set_mode("pass")
    await got(cut_to, b"held")


# --- flap ------------------------------------------------------------------------------


async def test_flap_alternates_cut_and_pass_and_loses_nothing(echo_net: Net) -> None:
    proxy = await echo_net.proxy()
    client, _ = await echo_net.connected(proxy)
    proxy.set_mode("flap", period_ms=40)
    assert not proxy.is_open(Direction.TO_SERVER)  # it starts cut
    sent = bytearray()
    seen_open = seen_cut = 0
    deadline = asyncio.get_running_loop().time() + T
    # Send until the stream has been held back by several cuts and has passed in between.
    while proxy.stalls < 4 or proxy.flips < 4 or not (seen_open and seen_cut):
        assert asyncio.get_running_loop().time() < deadline, proxy.counts()
        chunk = f"{len(sent):06};".encode()
        client.send(chunk)
        sent += chunk
        if proxy.is_open(Direction.TO_CLIENT):
            seen_open += 1
        else:
            seen_cut += 1
        await asyncio.sleep(0.005)
    await got(client, bytes(sent), "the whole stream, in order")
    proxy.set_mode("pass")
    flips = proxy.flips
    assert proxy.is_open(Direction.TO_SERVER) and proxy.is_open(Direction.TO_CLIENT)
    client.send(b"after")
    await got(client, bytes(sent) + b"after")
    assert proxy.flips == flips  # leaving flap stops the flapping


# --- reset and refuse ------------------------------------------------------------------


async def test_reset_closes_every_open_connection_and_new_ones_are_accepted(echo_net: Net) -> None:
    proxy = await echo_net.proxy()
    first, first_served = await echo_net.connected(proxy)
    second, second_served = await echo_net.connected(proxy)
    assert proxy.reset() == 2
    ends = (first, first_served, second, second_served)
    await eventually(lambda: all(end.ended for end in ends), timeout_s=T, what="all four ends closed")
    assert isinstance(first.error, ConnectionResetError) and isinstance(second.error, ConnectionResetError)
    assert proxy.resets == 2 and proxy.open_connections == 0
    third = await echo_net.connect(proxy)
    third.send(b"again")
    await got(third, b"again")
    assert proxy.mode.name == "pass"


async def test_reset_as_a_mode_resets_and_then_passes(echo_net: Net) -> None:
    proxy = await echo_net.proxy()
    proxy.set_mode("cut")
    client, _ = await echo_net.connected(proxy)
    assert proxy.set_mode("reset").name == "pass"
    await eventually(lambda: client.ended, timeout_s=T, what="the reset")
    assert proxy.resets == 1 and proxy.is_open(Direction.TO_SERVER)
    later = await echo_net.connect(proxy)
    later.send(b"hi")
    await got(later, b"hi")


async def test_refuse_closes_new_connections_and_leaves_open_ones(echo_net: Net) -> None:
    proxy = await echo_net.proxy()
    old, _ = await echo_net.connected(proxy)
    proxy.set_mode("refuse")
    refused = await echo_net.connect(proxy)
    await eventually(lambda: refused.ended, timeout_s=T, what="the refused connection closed")
    assert refused.received == b"" and len(echo_net.served) == 1  # the target never saw it
    assert proxy.refused == 1 and proxy.accepted == 2
    old.send(b"still here")
    await got(old, b"still here")
    proxy.set_mode("pass")
    new = await echo_net.connect(proxy)
    new.send(b"back")
    await got(new, b"back")


async def test_a_target_that_is_down_closes_the_client_and_is_counted() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with FaultProxy("127.0.0.1", port) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        client = End(reader, writer)
        try:
            await eventually(lambda: client.ended, timeout_s=T, what="the client closed")
            assert proxy.failed_connects == 1 and proxy.open_connections == 0
        finally:
            await client.aclose()


def test_modes_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        FaultProxy("127.0.0.1", 1).set_mode("drop")
    for bad in (
        {"mode": "flap"},
        {"mode": "one_way"},
        {"mode": "cut", "ms": 10},
        {"mode": "pass", "direction": "to_server"},
        {"mode": "delay", "ms": -1},
    ):
        with pytest.raises(ValueError):
            FaultProxy("127.0.0.1", 1).set_mode(**bad)
    with pytest.raises(ValueError):
        FaultProxy("127.0.0.1", 1).set_mode("one_way", direction="sideways")


# --- HTTP and WebSocket, through the threaded proxy --------------------------------------


def _app(state: dict[str, Any]) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        return web.json_response(state)

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            await sock.send_str(msg.data)
        return sock

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/ws", ws)
    return app


def _get(url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=T) as resp:
        body: bytes = resp.read()
        return body


Server = Callable[..., Awaitable[TestServer]]


async def test_a_websocket_through_a_threaded_proxy_waits_out_a_cut(aiohttp_server: Server) -> None:
    server = await aiohttp_server(_app({"active": True}), host="127.0.0.1", port=0)
    with ThreadedFaultProxy("127.0.0.1", server.port or 0) as proxy:
        assert await asyncio.to_thread(_get, proxy.url + "/health") == b'{"active": true}'
        async with aiohttp.ClientSession() as http, http.ws_connect(proxy.url + "/ws") as sock:
            await sock.send_str("before")
            assert await sock.receive_str(timeout=T) == "before"
            proxy.set_mode("cut")
            before = proxy.counts()
            await sock.send_str("during")
            await eventually(
                lambda: proxy.counts().read_to_server > before.read_to_server,
                timeout_s=T,
                what="the held frame",
            )
            assert proxy.counts().forwarded_to_server == before.forwarded_to_server
            proxy.set_mode("pass")
            assert await sock.receive_str(timeout=T) == "during"
        assert proxy.counts().accepted == 2


async def test_the_health_watcher_sees_overlaps_and_gaps(aiohttp_server: Server) -> None:
    a_state: dict[str, Any] = {"active": True, "epoch": 1, "node": "a", "role": "master"}
    b_state: dict[str, Any] = {"active": False, "epoch": 1, "node": "b", "role": "slave"}
    a = await aiohttp_server(_app(a_state), host="127.0.0.1", port=0)
    b = await aiohttp_server(_app(b_state), host="127.0.0.1", port=0)
    a_url = f"http://127.0.0.1:{a.port}"
    with ThreadedFaultProxy("127.0.0.1", b.port or 0) as b_proxy:
        b_url = b_proxy.url
        watcher = HealthWatcher([[a_url, b_url]]).start()
        try:
            await eventually(lambda: watcher.report().polls >= 3, timeout_s=T, what="three polls")
            assert watcher.report().overlap_count == 0 and watcher.report().longest_gap_s == (0.0,)
            b_state.update(active=True, epoch=2)
            await eventually(lambda: watcher.report().overlap_count > 0, timeout_s=T, what="an overlap")
            overlap = watcher.report().overlaps[0]
            assert overlap.active == (a_url, b_url) and overlap.epochs == (1, 2) and overlap.pair == 0
            # No active node: a is passive and b cannot be reached.
            a_state["active"] = False
            b_proxy.set_mode("cut")
            cut_at = time.monotonic()
            polls = watcher.report().polls
            await eventually(
                lambda: watcher.report().polls >= polls + 4, timeout_s=T, what="polls in the cut"
            )
            answered = watcher.report().answered[b_url]
            b_proxy.set_mode("reset")  # the polls held in the cut are reset, new ones pass
            healed_at = time.monotonic()
            await eventually(
                lambda: watcher.report().answered[b_url] > answered, timeout_s=T, what="b answering again"
            )
        finally:
            # Joined off the event loop: the watcher's last round may be asking a, served by it.
            await asyncio.to_thread(watcher.stop)
    report = watcher.report()
    # The polls that began after the cut and before the heal all saw no active node.
    assert report.longest_gap_s[0] >= healed_at - cut_at - watcher.timeout_s
    assert report.answered[a_url] == report.polls > report.answered[b_url]
    assert report.last[b_url] == b_state


# --- the threaded proxy from plain synchronous code ----------------------------------------


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        received: bytearray = self.server.received  # type: ignore[attr-defined]
        # A proxy that cuts its connection with a reset (an abort) ends the echo too.
        with contextlib.suppress(ConnectionResetError):
            while data := self.request.recv(65536):
                received += data
                self.request.sendall(data)


@pytest.fixture
def echo_server() -> Iterator[socketserver.ThreadingTCPServer]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    server.received = bytearray()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(T)


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + T
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "closed early"
        data += chunk
    return data


def _closed_at_once(port: int) -> bool:
    """Whether a new connection is reset (at connect or at the first read) or sees EOF."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=T) as sock:
            return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_the_threaded_proxy_from_synchronous_code(echo_server: socketserver.ThreadingTCPServer) -> None:
    received: bytearray = echo_server.received  # type: ignore[attr-defined]
    with ThreadedFaultProxy("127.0.0.1", echo_server.server_address[1]) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=T) as sock:
            sock.sendall(b"one;")
            assert _recv_exactly(sock, 4) == b"one;"
            assert proxy.set_mode("cut").name == "cut"
            sock.sendall(b"two;")
            _wait(lambda: proxy.counts().held_bytes == 4, "the proxy holding the bytes")
            assert received == b"one;"
            proxy.set_mode("pass")
            assert _recv_exactly(sock, 4) == b"two;"
            assert proxy.reset() == 1
            with pytest.raises(ConnectionResetError):
                while sock.recv(1):
                    pass  # pragma: no cover (a reset, not data, is what comes)
        proxy.set_mode("refuse")
        assert _closed_at_once(proxy.port)
        _wait(lambda: proxy.counts().refused == 1, "the refusal counted")
        port = proxy.port
    proxy.close()  # a second close does nothing
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=T).close()
