"""KapokMQ sockets read by the node's own ``ServerSocket`` (frames straight to the route),
over raw TCP.

The frames are written byte for byte here, so every RFC 6455 rule is exercised on the
wire: masking, fragmentation with control frames between fragments, ping/pong, the
closing handshake and each close code a violation gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kapok.server.aiohttp_seam import TakeoverResponse
from kapok.server.keys import CONNECTIONS
from kapok.server.routes import compat
from kapok.server.ws.base import frame_limit
from kapok.server.ws.frames import BINARY, CLOSE, PING, PONG, TEXT, close_payload
from kapok.server.ws.socket import Sends, ServerSocket
from kapok.testing import eventually
from kapok.testing.slow import scaled
from kapok.testing.wsraw import client_frame as frame
from kapok.testing.wsraw import upgrade_request

SECRET = "test"
ASK_KEY = b"Please enter the secret key"
KEY_OK = b"Secret key matching succeeded"
T = scaled(5.0)  # upper bound of every single wait
GOOD = b'{"MessageData": "m", "DelayTime": 0}'


class Raw:
    """A WebSocket client written by hand: what it sends and reads are exact frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def frame(self) -> tuple[int, bytes]:
        first, size = await asyncio.wait_for(self.reader.readexactly(2), T)
        assert not size & 0x80, "server frames are never masked"
        if size == 126:
            size = int.from_bytes(await self.reader.readexactly(2), "big")
        elif size == 127:
            size = int.from_bytes(await self.reader.readexactly(8), "big")
        return first & 0x0F, await asyncio.wait_for(self.reader.readexactly(size), T)

    async def closed_with(self, code: int) -> None:
        """The next frame is a close with ``code``, then the server ends the connection."""
        opcode, payload = await self.frame()
        assert opcode == CLOSE, (opcode, payload)
        assert int.from_bytes(payload[:2], "big") == code, payload
        assert await asyncio.wait_for(self.reader.read(), T) == b""  # EOF


@contextlib.asynccontextmanager
async def raw(node: Any, path: str, *, key: bool = True) -> AsyncIterator[Raw]:
    host, port = node.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(upgrade_request(path))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), T)
        assert head.startswith(b"HTTP/1.1 101")
        client = Raw(reader, writer)
        if key:
            assert await client.frame() == (TEXT, ASK_KEY)
            client.send(frame(TEXT, SECRET.encode()))
            assert await client.frame() == (TEXT, KEY_OK)
        yield client
    finally:
        writer.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def stored(session: aiohttp.ClientSession, node: Any) -> int:
    async with session.post(f"{node.url}/Console/CountMessage", headers={"secretKey": SECRET}) as resp:
        return int((await resp.json(content_type=None))["data"]["all"])


async def test_kapokmq_sockets_are_the_node_s_own(node: Any) -> None:
    async with raw(node, "/Producers/Conn/jobs/p1") as client:
        client.send(frame(TEXT, GOOD))
        assert await client.frame() == (TEXT, b"ok")
        (sock,) = node.app[CONNECTIONS]
        assert isinstance(sock, ServerSocket) and sock.transport.get_protocol() is sock


async def test_burst_with_fragments_pings_and_binary_is_answered_in_order(
    node: Any, session: aiohttp.ClientSession
) -> None:
    cut = b'{"MessageData": "fr\xc3\xa9', b'd", "DelayTime": 0}'  # é cut between fragments
    burst = (
        frame(TEXT, GOOD) * 30
        + frame(TEXT, cut[0], fin=False)
        + frame(PING, b"between fragments")
        + frame(0, cut[1])
        + frame(BINARY, GOOD)  # an error reply, in its place
        + frame(TEXT, b"{not json")
        + frame(TEXT, GOOD) * 30
    )
    async with raw(node, "/Producers/Conn/jobs/p1") as client:
        client.send(burst)
        got = [await client.frame() for _ in range(30 + 1 + 1 + 1 + 1 + 30)]
        client.send(frame(CLOSE, close_payload(1000, "done")))
        opcode, payload = await client.frame()
        assert (opcode, payload[:2]) == (CLOSE, (1000).to_bytes(2, "big"))  # the closing handshake
    assert got.count((PONG, b"between fragments")) == 1
    replies = [data for opcode, data in got if opcode == TEXT]
    assert replies[:31] == [b"ok"] * 31
    assert b"must be text" in replies[31]
    assert json.loads(replies[32])["code"] == -1
    assert replies[33:] == [b"ok"] * 30
    assert await stored(session, node) == 61


async def test_acks_through_the_fast_reader(node: Any, session: aiohttp.ClientSession) -> None:
    async with raw(node, "/Producers/Conn/jobs/p1") as prod:
        prod.send(frame(TEXT, GOOD) * 5)
        assert [await prod.frame() for _ in range(5)] == [(TEXT, b"ok")] * 5
    async with raw(node, "/Consumers/Conn/jobs/c1") as cons:
        pushes = [json.loads((await cons.frame())[1]) for _ in range(5)]
        codes = [p["MessageCode"].encode() for p in pushes]
        # Two acks in one frame each, one cut into fragments, a ping between them.
        cons.send(b"".join(frame(TEXT, c) for c in codes[:4]))
        cons.send(frame(TEXT, codes[4][:10], fin=False) + frame(PING, b"") + frame(0, codes[4][10:]))
        assert await cons.frame() == (PONG, b"")

    async def all_consumed() -> bool:
        async with session.post(f"{node.url}/Console/CountMessage", headers={"secretKey": SECRET}) as resp:
            return int((await resp.json(content_type=None))["data"]["consumed"]) == 5

    await eventually(all_consumed, what="the five acks settled")


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(TEXT, GOOD, mask=None), 1002),
        (frame(TEXT, b'{"MessageData": "\xff"}'), 1007),
        (frame(PING, b"x", fin=False), 1002),
        (frame(CLOSE, close_payload(1005)), 1002),
        (frame(0, b"orphan"), 1002),
    ],
    ids=["unmasked", "invalid-utf8", "fragmented-ping", "reserved-close-code", "orphan-continuation"],
)
async def test_violations_close_with_their_code_after_earlier_frames_are_handled(
    node: Any, session: aiohttp.ClientSession, data: bytes, code: int
) -> None:
    async with raw(node, "/Producers/Conn/jobs/p1") as client:
        client.send(frame(TEXT, GOOD) * 3 + data + frame(TEXT, GOOD))
        frames = []
        while True:
            opcode, payload = await client.frame()
            if opcode == CLOSE:
                break
            frames.append((opcode, payload))
        # The frames before the violation were published; their oks go out only if their
        # WAL write came before the close (no data frame may follow a close frame).
        assert frames == [(TEXT, b"ok")] * len(frames) and len(frames) <= 3
        assert int.from_bytes(payload[:2], "big") == code
    assert await stored(session, node) == 3  # never the frame after the violation


async def test_message_over_the_limit_closes_with_1009(make_node: Any) -> None:
    node = await make_node("mq.max_message_bytes=1024", "server.max_batch=1")
    limit = frame_limit(1024, 1)
    async with raw(node, "/Producers/Conn/jobs/p1") as client:
        # Only the start of the frame: its header says it is too big, and nothing is left
        # unread when the node closes (else the close would be a reset).
        client.send(frame(BINARY, b"x" * (limit + 1))[:100])
        await client.closed_with(1009)


async def test_frames_sent_with_the_upgrade_are_read_too(node: Any) -> None:
    """A client that sends before the upgrade's answer: the bytes aiohttp read past the
    request go to the node's socket first, and the route works the same."""
    host, port = node.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(upgrade_request("/Producers/Conn/jobs/p1") + frame(TEXT, SECRET.encode()))
        client = Raw(reader, writer)
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), T)
        assert await client.frame() == (TEXT, ASK_KEY)
        assert await client.frame() == (TEXT, KEY_OK)
        client.send(frame(TEXT, GOOD) + frame(PING, b"p") + frame(TEXT, GOOD))
        got = [await client.frame() for _ in range(3)]
        assert sorted(got) == [(TEXT, b"ok"), (TEXT, b"ok"), (PONG, b"p")]
    finally:
        writer.close()


async def test_handler_error_fails_only_that_connection(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the code a frame reaches closes that socket with 1011; the node goes on."""

    def broken(self: Any, frames: list[str | bytes]) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(compat._Publisher, "feed", broken)
    async with raw(node, "/Producers/Conn/jobs/p1") as client:
        client.send(frame(TEXT, GOOD))
        await client.closed_with(1011)
    monkeypatch.undo()
    async with raw(node, "/Producers/Conn/jobs/p2") as client:
        client.send(frame(TEXT, GOOD))
        assert await client.frame() == (TEXT, b"ok")


def test_the_upgrade_is_aiohttp_s_response() -> None:
    assert issubclass(TakeoverResponse, web.WebSocketResponse)


async def test_reading_pauses_while_replies_wait_and_resumes(
    make_node: Any, session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a tiny send queue every batch of oks fills it until its WAL write: the socket
    is not read meanwhile (``pause_reading``), and reading resumes; nothing is lost or
    reordered."""
    holds: list[int] = []
    original = ServerSocket._hold

    def spy(self: ServerSocket, sends: Sends) -> None:
        holds.append(1)
        original(self, sends)

    monkeypatch.setattr(ServerSocket, "_hold", spy)
    node = await make_node("server.send_queue_max_bytes=16")
    n = 3000
    async with raw(node, "/Producers/Conn/jobs/p1") as client:
        client.send(b"".join(frame(TEXT, b'{"MessageData": "%d", "DelayTime": 0}' % i) for i in range(n)))
        assert [await client.frame() for _ in range(n)] == [(TEXT, b"ok")] * n
    assert holds
    assert await stored(session, node) == n
