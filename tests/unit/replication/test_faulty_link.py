"""``FaultySyncLink``: while cut, sends and reads wait (the link stays open) and flow on
after the heal; a read delay holds each frame back."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import WSCloseCode, WSMessage, WSMsgType

from kapok.testing.faults import FaultySyncLink
from kapok.testing.slow import scaled


class _FakeWebSocket:
    """The WebSocket a link wraps: what is sent is kept, what is read comes from a queue."""

    def __init__(self) -> None:
        self.sent: list[str | bytes] = []
        self.inbox: asyncio.Queue[WSMessage] = asyncio.Queue()
        self.closed = False

    async def send_str(self, data: str, compress: int | None = None) -> None:
        self.sent.append(data)

    async def send_bytes(self, data: bytes, compress: int | None = None) -> None:
        self.sent.append(data)

    async def receive(self, timeout: float | None = None) -> WSMessage:
        return await asyncio.wait_for(self.inbox.get(), timeout)

    async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"") -> bool:
        self.closed = True
        return True


async def test_a_cut_link_holds_sends_and_reads_until_healed() -> None:
    ws = _FakeWebSocket()
    cut = True
    link = FaultySyncLink(ws, cut=lambda: cut)
    sending = asyncio.create_task(link.send_binary(b"record"))
    ws.inbox.put_nowait(WSMessage(WSMsgType.BINARY, b"ack", None))
    reading = asyncio.create_task(link.receive())
    await asyncio.sleep(scaled(0.1))  # a few heal polls: nothing may pass while cut
    assert not sending.done() and not reading.done() and ws.sent == []
    with pytest.raises(TimeoutError):
        await link.receive(timeout=0.05)  # a read with a deadline times out, as on a dead link
    assert not link.closed

    cut = False
    await asyncio.wait_for(sending, scaled(5))
    assert await asyncio.wait_for(reading, scaled(5)) == b"ack"
    assert ws.sent == [b"record"]


async def test_a_read_delay_holds_each_frame_back() -> None:
    ws = _FakeWebSocket()
    link = FaultySyncLink(ws, delay_s=lambda: 0.05)
    ws.inbox.put_nowait(WSMessage(WSMsgType.TEXT, '{"op":"ping"}', None))
    loop = asyncio.get_running_loop()
    started = loop.time()
    frame = await link.receive(timeout=scaled(5))
    assert isinstance(frame, dict) and frame["op"] == "ping"
    assert loop.time() - started >= 0.05
    await link.send_control("pong")
    assert ws.sent and isinstance(ws.sent[0], str) and '"pong"' in ws.sent[0]
