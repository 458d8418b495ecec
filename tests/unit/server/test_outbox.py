"""The node frames what it sends itself (the outbox, to write many frames in one syscall;
the socket, its control frames): the bytes must be exactly the frames aiohttp's own
writer would have sent."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import WSMsgType
from aiohttp.http import WebSocketWriter

from kapok.server.ws.frames import BINARY, PING, PONG, TEXT, server_frame
from kapok.server.ws.outbox import text_frames

LENGTHS = [0, 1, 2, 125, 126, 127, 1000, 65535, 65536, 70000]


class _Transport:
    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: Any) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return False


class _Protocol:
    _paused = False


async def aiohttp_frame(payload: bytes, kind: WSMsgType = WSMsgType.TEXT) -> bytes:
    transport = _Transport()
    writer = WebSocketWriter(_Protocol(), transport)  # type: ignore[arg-type]
    await writer.send_frame(payload, kind)
    return bytes(transport.out)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize(("opcode", "kind"), [(TEXT, WSMsgType.TEXT), (BINARY, WSMsgType.BINARY)])
async def test_a_frame_is_byte_for_byte_aiohttps(length: int, opcode: int, kind: WSMsgType) -> None:
    payload = b"x" * length
    assert server_frame(opcode, payload) == await aiohttp_frame(payload, kind)


@pytest.mark.parametrize(("opcode", "kind"), [(PING, WSMsgType.PING), (PONG, WSMsgType.PONG)])
async def test_control_frames_are_aiohttps(opcode: int, kind: WSMsgType) -> None:
    for payload in (b"", b"p", b"x" * 125):
        assert server_frame(opcode, payload) == await aiohttp_frame(payload, kind)


async def test_many_frames_are_aiohttps_frames_back_to_back() -> None:
    payloads = [b"ok", b"", b"y" * 300, b"z" * 70000, b"ok"]
    assert text_frames(payloads) == b"".join([await aiohttp_frame(p) for p in payloads])
