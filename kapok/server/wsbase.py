"""What every WebSocket route shares: the connection limit, set-up and teardown."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import WSCloseCode, web

from kapok.errors import TooManyConnectionsError
from kapok.server.keys import CONNECTIONS, SERVICE
from kapok.server.outbox import Outbox

__all__ = ["frame_limit", "open_ws"]


def frame_limit(max_message_bytes: int, max_batch: int) -> int:
    """Largest WebSocket frame accepted: a full batch of JSON-escaped maximal messages is
    not needed (batches are bounded in bytes too), so allow a few messages' worth."""
    return max(4 * max_message_bytes, 8 * 1024 * 1024) + max_batch * 512


@contextlib.asynccontextmanager
async def open_ws(request: web.Request, *, text: bool) -> AsyncIterator[tuple[web.WebSocketResponse, Outbox]]:
    """Upgrade, register the socket and its outbox, and always tear both down."""
    app = request.app
    cfg = app[SERVICE].config
    connections = app[CONNECTIONS]
    if len(connections) >= cfg.server.max_connections:
        raise TooManyConnectionsError(f"the node already has {len(connections)} connections")
    ws = web.WebSocketResponse(
        heartbeat=cfg.server.heartbeat_s,
        max_msg_size=frame_limit(cfg.mq.max_message_bytes, cfg.server.max_batch),
        compress=False,  # the outbox writes plain text frames itself, never compressed ones
        decode_text=text,
    )
    writer = await ws.prepare(request)
    transport = request.transport
    if transport is None:  # the peer left during the upgrade
        raise ConnectionResetError("the connection closed during the WebSocket upgrade")
    outbox = Outbox(ws, transport, writer, cfg.server.send_queue_max_bytes)
    outbox.start()
    connections.add(ws)
    try:
        yield ws, outbox
    finally:
        connections.discard(ws)
        await outbox.aclose()
        if not ws.closed:
            await ws.close(code=WSCloseCode.GOING_AWAY)
