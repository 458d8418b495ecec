"""``wsbase.messages`` reads parsed frames from aiohttp's private queue: fail loudly if that changes.

pyproject.toml pins aiohttp below its next major for this reason; should a 3.x release
rename the queue, ``messages`` would silently fall back to one ``receive`` per frame, a
third slower on KapokMQ sockets, so this test checks the names it relies on.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient

from kapok.server.ws.base import messages
from kapok.server.ws.mask import require_masked_frames
from kapok.testing import eventually
from kapok.testing.slow import scaled


async def test_messages_finds_aiohttp_parsed_frame_queue_and_reads_a_burst_in_order(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
) -> None:
    seen: list[str] = []
    queue_shapes: list[bool] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        reader = getattr(ws, "_reader", None)
        buffer = getattr(reader, "_buffer", None)
        queue_shapes.append(buffer is not None and hasattr(reader, "read"))
        async for msg in messages(ws):
            if msg.type is WSMsgType.TEXT:
                seen.append(msg.data)
                if len(seen) == 100:
                    await ws.send_str("done")
        return ws

    app = web.Application()
    app.router.add_get("/ws", handler)
    client = await aiohttp_client(app)
    async with client.ws_connect("/ws") as ws:
        for i in range(100):
            await ws.send_str(f"m{i}")
        reply = await asyncio.wait_for(ws.receive(), scaled(10))
        assert reply.data == "done"
    assert queue_shapes == [True], "aiohttp's WebSocket reader no longer has the private _buffer wsbase reads"
    assert seen == [f"m{i}" for i in range(100)]


async def test_require_masked_frames_finds_aiohttp_reader_and_frame_queue(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
) -> None:
    """``wsmask.require_masked_frames`` wraps aiohttp's reader by two private names; it says
    when it cannot, and then unmasked frames would pass unnoticed."""
    installed: list[bool] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        installed.append(require_masked_frames(request, ws))
        async for msg in ws:
            await ws.send_str(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/ws", handler)
    client = await aiohttp_client(app)
    async with client.ws_connect("/ws") as ws:
        await ws.send_str("masked, as every client sends")
        assert (await ws.receive(timeout=scaled(5))).data == "masked, as every client sends"
    assert installed == [True]


async def test_closed_websockets_are_freed_at_once(make_node: Any) -> None:
    """Every refused handshake used to keep its connection (~10 KB) alive for
    heartbeat_s, held by a heartbeat timer aiohttp re-armed while the socket closed.
    After the handshakes end, no WebSocketResponse may remain once the collector ran."""
    node = await make_node("server.auth_timeout_s=0.2")
    # Other tests' sockets may linger in this process; only the ones made here count.
    earlier = weakref.WeakSet(o for o in gc.get_objects() if isinstance(o, web.WebSocketResponse))
    async with aiohttp.ClientSession() as session:
        for i in range(20):
            async with session.ws_connect(f"{node.ws_url}/Producers/Conn/t/p{i}") as ws:
                assert (await ws.receive(timeout=scaled(5))).data == "Please enter the secret key"
                if i % 2:
                    continue  # the client leaves
                msg = await ws.receive(timeout=scaled(5))  # the node times the handshake out
                assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)

    def none_left() -> bool:
        gc.collect()
        return not any(isinstance(o, web.WebSocketResponse) and o not in earlier for o in gc.get_objects())

    await eventually(none_left, what="every closed WebSocketResponse freed", timeout_s=scaled(10))
