"""What every WebSocket route shares: the connection limit, set-up, teardown and reading."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from kapok.errors import TooManyConnectionsError
from kapok.server.aiohttp_seam import MASKING, cancel_heartbeat, hook_lost, queued_frames
from kapok.server.guard.connections import set_state
from kapok.server.guard.conntable import ConnState
from kapok.server.keys import CONNECTIONS, SERVICE
from kapok.server.ws.fast import FastResponse
from kapok.server.ws.mask import require_masked_frames
from kapok.server.ws.outbox import Outbox

__all__ = ["CLOSE_TIMEOUT_S", "frame_limit", "messages", "open_ws"]

log = logging.getLogger("kapok.server")

# How long a closing handshake waits for the peer's close frame before the socket is
# dropped anyway (aiohttp's default, 10 s, kept a refused client's slot twice as long).
CLOSE_TIMEOUT_S = 2.0


def frame_limit(max_message_bytes: int, max_batch: int) -> int:
    """Largest WebSocket frame accepted: a full batch of JSON-escaped maximal messages is
    not needed (batches are bounded in bytes too), so allow a few messages' worth."""
    return max(4 * max_message_bytes, 8 * 1024 * 1024) + max_batch * 512


@contextlib.asynccontextmanager
async def open_ws(
    request: web.Request, *, text: bool, handshake: bool = False, fast: bool = False
) -> AsyncIterator[tuple[web.WebSocketResponse, Outbox]]:
    """Upgrade, register the socket and its outbox, and always tear both down. With
    ``handshake`` the key is still to come in-band (KapokMQ): the connection stays
    untrusted, with a deadline, until ``compat_handshake`` accepts it. With ``fast`` the
    response is a ``FastResponse`` (text frames straight to the route)."""
    app = request.app
    service = app[SERVICE]
    cfg = service.config
    service.check_active()  # a passive slave or a fenced master answers 503 before the upgrade
    connections = app[CONNECTIONS]
    if len(connections) >= cfg.server.max_connections:
        raise TooManyConnectionsError(f"the node already has {len(connections)} connections")
    ws = (FastResponse if fast else web.WebSocketResponse)(
        timeout=CLOSE_TIMEOUT_S,
        heartbeat=cfg.server.heartbeat_s,
        max_msg_size=frame_limit(cfg.mq.max_message_bytes, cfg.server.max_batch),
        compress=False,  # the outbox writes plain text frames itself, never compressed ones
        decode_text=text,
    )
    writer = await ws.prepare(request)
    # A FastResponse's own reader fails unmasked frames (1002); aiohttp's needs MaskCheck,
    # without which the node must not serve (the start-up check makes this unreachable).
    if getattr(ws, "fast", None) is None and not require_masked_frames(request, ws):
        lost = hook_lost(MASKING, "no frame reader to check on this socket")
        log.error("%s: closing the socket (1011)", lost.message)
        await ws.close(code=WSCloseCode.INTERNAL_ERROR)
        raise lost
    set_state(request, ConnState.HANDSHAKE if handshake else ConnState.OPEN)
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
        # aiohttp (3.14) re-arms the heartbeat when a frame arrives while the socket closes
        # (typically the peer's own close frame), after it has cancelled it. The timer then
        # keeps the whole connection (its protocol, request, reader and buffers: about 10 KB)
        # alive for heartbeat_s after it ended: 5,000 refused handshakes a minute held ~50 MB
        # for half a minute. It is cancelled now, and once more after a frame that may still
        # be on its way re-armed it.
        cancel_heartbeat(ws)
        asyncio.get_running_loop().call_soon(cancel_heartbeat, ws)


async def messages(ws: web.WebSocketResponse) -> AsyncIterator[WSMessage]:
    """What ``async for msg in ws`` yields, with less work per frame.

    ``WebSocketResponse.receive`` runs two coroutines of checks for every message. KapokMQ
    clients send a frame per message and per ack, so it cost the node more than parsing
    the frames did. Here one ``receive`` waits for a burst, and the text frames aiohttp
    has already parsed behind it are taken straight from its queue (its ``read`` returns
    at once when the queue is not empty, and keeps the queue's flow control); anything
    else, and every wait, goes through ``receive``. This leans on two private names of
    aiohttp's (``aiohttp_seam.queued_frames``); without them it is plain ``async for``.
    """
    queued = queued_frames(ws)
    if queued is None:
        async for msg in ws:
            yield msg
        return
    read, parsed = queued
    async for msg in ws:
        yield msg
        while parsed and parsed[0][0].type is _TEXT:
            yield await read()


_TEXT = WSMsgType.TEXT
