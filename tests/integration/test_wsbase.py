"""``wsbase.messages`` reads parsed frames from aiohttp's private queue: fail loudly if that changes.

pyproject.toml pins aiohttp below its next major for this reason; should a 3.x release
rename the queue, ``messages`` would silently fall back to one ``receive`` per frame, a
third slower on KapokMQ sockets, so this test checks the names it relies on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient

from kapok.server.wsbase import messages


async def test_messages_finds_aiohttp_parsed_frame_queue_and_reads_a_burst_in_order(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient]],
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
        reply = await asyncio.wait_for(ws.receive(), 10)
        assert reply.data == "done"
    assert queue_shapes == [True], "aiohttp's WebSocket reader no longer has the private _buffer wsbase reads"
    assert seen == [f"m{i}" for i in range(100)]
