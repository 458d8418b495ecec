"""What every WebSocket route shares: the upgrade, the connection limit, set-up and teardown."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import WSCloseCode, web

from kapok.errors import TooManyConnectionsError
from kapok.server.aiohttp_seam import TakeoverResponse
from kapok.server.guard.connections import set_state
from kapok.server.guard.conntable import ConnState
from kapok.server.keys import BUSY_POLL, CONNECTIONS, SERVICE
from kapok.server.ws.outbox import Outbox
from kapok.server.ws.socket import ServerSocket

__all__ = ["CLOSE_TIMEOUT_S", "accept", "frame_limit", "open_ws"]

# How long a closing handshake waits for the peer's close frame before the socket is
# dropped anyway (aiohttp's default, 10 s, kept a refused client's slot twice as long).
CLOSE_TIMEOUT_S = 2.0


def frame_limit(max_message_bytes: int, max_batch: int) -> int:
    """Largest WebSocket frame accepted: a full batch of JSON-escaped maximal messages is
    not needed (batches are bounded in bytes too), so allow a few messages' worth."""
    return max(4 * max_message_bytes, 8 * 1024 * 1024) + max_batch * 512


async def accept(request: web.Request, *, max_size: int, heartbeat_s: float | None) -> ServerSocket:
    """Answer the upgrade (aiohttp checks the request and writes the 101), then read and
    write the connection with the node's own ``ServerSocket``."""
    response = TakeoverResponse(compress=False)
    await response.prepare(request)
    transport, tail = response.take_over(request)
    sock = ServerSocket(
        response, transport, max_size=max_size, heartbeat_s=heartbeat_s, close_timeout_s=CLOSE_TIMEOUT_S,
        poll=request.app.get(BUSY_POLL),
    )  # fmt: skip
    if tail:  # frames the client sent without waiting for the 101
        sock.data_received(tail)
    return sock


@contextlib.asynccontextmanager
async def open_ws(
    request: web.Request, *, handshake: bool = False
) -> AsyncIterator[tuple[ServerSocket, Outbox]]:
    """Upgrade, register the socket and its outbox, and always tear both down. With
    ``handshake`` the key is still to come in-band (KapokMQ): the connection stays
    untrusted, with a deadline, until ``compat_handshake`` accepts it."""
    app = request.app
    service = app[SERVICE]
    cfg = service.config
    service.check_active()  # a passive slave or a fenced master answers 503 before the upgrade
    connections = app[CONNECTIONS]
    if len(connections) >= cfg.server.max_connections:
        raise TooManyConnectionsError(f"the node already has {len(connections)} connections")
    max_size = frame_limit(cfg.mq.max_message_bytes, cfg.server.max_batch)
    sock = await accept(request, max_size=max_size, heartbeat_s=cfg.server.heartbeat_s)
    set_state(request, ConnState.HANDSHAKE if handshake else ConnState.OPEN)
    outbox = Outbox(sock, cfg.server.send_queue_max_bytes)
    outbox.start()
    connections.add(sock)
    try:
        yield sock, outbox
    finally:
        sock.stop()
        connections.discard(sock)
        await outbox.aclose()
        if not sock.closed:
            await sock.close(code=WSCloseCode.GOING_AWAY)
