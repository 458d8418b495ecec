"""Limits of the HTTP port, against a real in-process node over real sockets: KapokMQ
handshakes that never show the key are closed and counted by their reason, and a request
body of unknown length (``Transfer-Encoding: chunked``) is cut off at the limit: a 413 at
once, the connection closed, the rest never read."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from tests.integration.conftest import Start

from kapok.protocol.kapokmq import ASK_KEY
from kapok.server.guard.connections import GUARD
from kapok.testing.inprocess import RunningApp
from kapok.testing.slow import scaled

AUTH = {"Authorization": "Bearer test"}
MB = 1 << 20
T = scaled(10.0)  # seconds any single step may take
ENDED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)


def closed_total(node: RunningApp, reason: str) -> float:
    """``kapok_connections_closed_total{reason=...}`` as the node's collector reports it."""
    for family in node.app[GUARD].collect():
        for sample in family.samples:
            if sample.name == "kapok_connections_closed_total" and sample.labels == {"reason": reason}:
                return sample.value
    raise AssertionError(f"no kapok_connections_closed_total{{reason={reason!r}}}")


async def test_kapokmq_handshakes_that_never_answer_are_counted_as_handshake_timeouts(start: Start) -> None:
    node = await start("a", "server.auth_timeout_s=0.5")
    before = closed_total(node, "handshake_timeout")
    paths = [f"/Producers/Conn/t/p{i}" for i in range(3)] + [f"/Consumers/Conn/t/c{i}" for i in range(3)]
    async with aiohttp.ClientSession() as session:
        sockets = [await session.ws_connect(node.ws_url + path) for path in paths]
        for ws in sockets:
            assert (await ws.receive(timeout=T)).data == ASK_KEY  # ... and no answer, ever
        for ws in sockets:
            msg = await ws.receive(timeout=T)
            assert msg.type in ENDED, msg
            await ws.close()
        assert ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION
        # The key still works afterwards.
        async with session.ws_connect(node.ws_url + "/Producers/Conn/t/real") as ws:
            assert (await ws.receive(timeout=T)).data == ASK_KEY
            await ws.send_str("test")
            assert (await ws.receive(timeout=T)).data == "Secret key matching succeeded"
    assert closed_total(node, "handshake_timeout") - before == len(paths)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


async def stream_chunked(port: int, head: str, total: int) -> tuple[int, bytes, bool]:
    """POST ``total`` bytes in 64 KB chunks from a raw socket, reading the answer all along:
    (how many bytes went out before the node stopped reading, what it answered, whether
    it closed the connection). A plain socket, not a transport: a send that fails on the
    node's close must not take the answer that came before the close with it."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    got = bytearray()

    async def read() -> None:
        with contextlib.suppress(ConnectionError):
            while data := await loop.sock_recv(sock, 65536):
                got.extend(data)

    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, head.encode() + b"Transfer-Encoding: chunked\r\n\r\n")
        reader = asyncio.create_task(read())
        chunk = b"%x\r\n%s\r\n" % (64 * 1024, b"a" * 64 * 1024)
        sent = 0
        deadline = loop.time() + scaled(30)
        with contextlib.suppress(ConnectionError):
            while sent < total and not reader.done() and loop.time() < deadline:
                await asyncio.wait_for(loop.sock_sendall(sock, chunk), T)
                sent += len(chunk)
            await loop.sock_sendall(sock, b"0\r\n\r\n")
        with contextlib.suppress(TimeoutError):  # the node should close; the old one did not
            await asyncio.wait_for(asyncio.shield(reader), T)
        closed = reader.done()
        reader.cancel()
        return sent, bytes(got), closed
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/topics/t/messages", "Authorization: Bearer test\r\nContent-Type: application/json\r\n"),
        ("/Producer/Send", "secretKey: test\r\nContent-Type: application/x-www-form-urlencoded\r\n"),
    ],
)
async def test_a_chunked_body_over_the_limit_is_cut_off_at_the_limit(
    start: Start, path: str, headers: str
) -> None:
    node = await start("a", "mq.max_message_bytes=1000", "server.max_batch=1")
    limit = node.app._client_max_size  # about 8.4 MB: the smallest the node allows
    rss_before = rss_mb()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}"
    sent, got, closed = await stream_chunked(node.config.server.port, head, 50 * MB)
    grown = rss_mb() - rss_before
    print(
        f"\nchunked 50 MB to {path}: {sent / MB:.1f} MB sent (limit {limit / MB:.1f} MB), RSS +{grown:.0f} MB"
    )
    # The node stopped reading a little past the limit (what the sockets' buffers hold), not
    # at the end of the body: it answered and closed instead of reading the rest.
    assert sent < limit + 16 * MB, f"{sent / MB:.1f} MB of the body went out: the node kept reading"
    assert closed, "the node kept the connection open"
    status, _, rest = got.partition(b"\r\n")
    assert status == b"HTTP/1.1 413 Request Entity Too Large", got[:300]
    head_lines, _, answered = rest.partition(b"\r\n\r\n")
    assert b"Connection: close" in head_lines and b"Content-Type: application/json" in head_lines
    answer = orjson.loads(answered)
    assert answer["error"] == "message_too_large" and str(limit) in answer["message"], answer
    assert grown < 40, f"RSS grew by {grown:.0f} MB"
    # The node serves on, and a chunked body within the limit is read whole.
    payload = "x" * 900

    async def body() -> AsyncIterator[bytes]:
        data = orjson.dumps({"data": payload})
        for i in range(0, len(data), 100):
            yield data[i : i + 100]

    async with aiohttp.ClientSession() as session:
        # A generator body goes out chunked (no Content-Length).
        async with session.post(f"{node.url}/v1/topics/small/messages", data=body(), headers=AUTH) as resp:
            assert resp.status == 200, await resp.text()
        async with session.get(f"{node.url}/v1/topics/small/messages?max=1", headers=AUTH) as resp:
            assert resp.status == 200
            (msg,) = (await resp.json())["messages"]
    assert msg["data"] == payload
