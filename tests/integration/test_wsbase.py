"""The node's own WebSocket after the upgrade (``kapok.server.ws.socket``): the transport is
really taken from aiohttp, the heartbeat drops a silent client and spares one that answers,
and a closed socket is freed at once."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import aiohttp
from aiohttp import WSMsgType

from kapok.server.keys import CONNECTIONS
from kapok.server.ws.frames import CLOSE, PING, PONG
from kapok.server.ws.socket import ServerSocket
from kapok.testing import eventually
from kapok.testing.slow import scaled
from kapok.testing.wsraw import client_frame, upgrade_request

T = scaled(5.0)


async def _open_raw(
    node: Any, path: str, auth: dict[str, str]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = node.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = upgrade_request(path)
    extra = "".join(f"{k}: {v}\r\n" for k, v in auth.items()).encode()
    writer.write(head[:-2] + extra + b"\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), T)).startswith(b"HTTP/1.1 101")
    return reader, writer


async def _frame(reader: asyncio.StreamReader, timeout: float) -> tuple[int, bytes]:
    first, size = await asyncio.wait_for(reader.readexactly(2), timeout)
    return first & 0x0F, await asyncio.wait_for(reader.readexactly(size & 0x7F), timeout)


async def test_the_connection_is_read_by_the_node_s_socket(node: Any, auth: dict[str, str]) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"{node.ws_url}/v1/ws", headers=auth) as ws,
    ):
        await ws.send_str('{"op": "ping", "id": 1}')
        assert (await ws.receive(timeout=T)).json() == {"op": "pong", "id": 1}
        (sock,) = node.app[CONNECTIONS]
        assert isinstance(sock, ServerSocket)
        assert sock.transport.get_protocol() is sock  # aiohttp's protocol no longer reads it


async def test_heartbeat_drops_a_silent_client_and_spares_one_that_answers(
    make_node: Any, auth: dict[str, str]
) -> None:
    # Long enough that the talker's pong (this loop serves node and clients) is never late.
    heartbeat = scaled(1.0)
    node = await make_node(f"server.heartbeat_s={heartbeat}")
    silent_reader, silent = await _open_raw(node, "/v1/ws", auth)
    talker_reader, talker = await _open_raw(node, "/v1/ws", auth)
    try:
        # The talker answers every ping; the silent client reads them and never answers.
        for _ in range(3):
            opcode, payload = await _frame(talker_reader, T + heartbeat)
            assert opcode == PING
            talker.write(client_frame(PONG, payload))
        assert await _frame(silent_reader, T + heartbeat) == (PING, b"")
        # A heartbeat and a half later without a byte: dropped, with no close frame.
        assert await asyncio.wait_for(silent_reader.read(), T + heartbeat) == b""
        await eventually(lambda: len(node.app[CONNECTIONS]) == 1, what="only the talker left")
        talker.write(client_frame(CLOSE, (1000).to_bytes(2, "big")))
        opcode, _ = await _frame(talker_reader, T)
        while opcode == PING:
            opcode, _ = await _frame(talker_reader, T)
        assert opcode == CLOSE
    finally:
        silent.close()
        talker.close()


async def test_closed_sockets_are_freed_at_once(make_node: Any) -> None:
    """Every refused handshake used to keep its connection (~10 KB) alive for heartbeat_s,
    held by a heartbeat timer that outlived its socket. After the handshakes end, no
    socket made here may remain once the collector ran."""
    node = await make_node("server.auth_timeout_s=0.2")
    earlier = weakref.WeakSet(o for o in gc.get_objects() if isinstance(o, ServerSocket))
    async with aiohttp.ClientSession() as session:
        for i in range(20):
            async with session.ws_connect(f"{node.ws_url}/Producers/Conn/t/p{i}") as ws:
                assert (await ws.receive(timeout=T)).data == "Please enter the secret key"
                if i % 2:
                    continue  # the client leaves
                msg = await ws.receive(timeout=T)  # the node times the handshake out
                assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)

    def none_left() -> bool:
        gc.collect()
        return not any(isinstance(o, ServerSocket) and o not in earlier for o in gc.get_objects())

    await eventually(none_left, what="every closed ServerSocket freed", timeout_s=scaled(10))
