"""When the outbox writes: ready frames at once, on the caller's turn; a frame that waits
for a future in the turn it completes; the queue's order always; the task only while
the socket's flow control holds writes back, and for the hang-up after a storage failure.
A fake transport and socket stand in for the real ones (no sockets)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, cast

from kapok.errors import StorageError, UnavailableError
from kapok.server.ws.outbox import Outbox, text_frames
from kapok.server.ws.socket import ServerSocket


class _Protocol:
    def __init__(self) -> None:
        self.writing_paused = False
        self.resumed = asyncio.Event()

    def pause(self) -> None:
        self.writing_paused = True
        self.resumed.clear()

    def resume(self) -> None:
        self.writing_paused = False
        self.resumed.set()


class _Transport:
    def __init__(self, protocol: _Protocol, high_water: int = 1 << 30) -> None:
        self.protocol = protocol
        self.high_water = high_water
        self.out = bytearray()
        self.writes = 0
        self.closing = False

    def writelines(self, parts: list[bytes]) -> None:
        self.writes += 1
        for part in parts:
            self.out += part
        if len(self.out) >= self.high_water and not self.protocol.writing_paused:
            self.protocol.pause()

    def is_closing(self) -> bool:
        return self.closing


class _WebSocket:
    """What the outbox uses of a ``ServerSocket``."""

    def __init__(self, protocol: _Protocol, transport: _Transport) -> None:
        self.protocol = protocol
        self.transport = transport
        self.closed = False
        self.close_code: int | None = None

    @property
    def writing_paused(self) -> bool:
        return self.protocol.writing_paused

    async def drain(self) -> None:
        if self.protocol.writing_paused:
            await self.protocol.resumed.wait()

    async def close(self, *, code: int, message: bytes = b"") -> bool:
        self.closed = True
        self.close_code = code
        return True


def _outbox(high_water: int = 1 << 30, max_bytes: int = 1 << 20) -> tuple[Outbox, _Transport, _WebSocket]:
    protocol = _Protocol()
    transport = _Transport(protocol, high_water)
    ws = _WebSocket(protocol, transport)
    outbox = Outbox(cast("ServerSocket", ws), max_bytes)
    outbox.start()
    return outbox, transport, ws


def _frames(*payloads: bytes) -> bytes:
    return text_frames(list(payloads))


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_ready_frame_is_written_by_send_itself() -> None:
    outbox, transport, _ = _outbox()
    outbox.send(b"one")
    outbox.send_many([b"two", b"three"])
    assert transport.out == _frames(b"one", b"two", b"three")  # no await: on the caller's turn
    await outbox.aclose()


async def test_frames_wait_for_their_futures_in_queue_order() -> None:
    outbox, transport, _ = _outbox()
    loop = asyncio.get_running_loop()
    first: asyncio.Future[None] = loop.create_future()
    second: asyncio.Future[None] = loop.create_future()
    outbox.send(b"a", after=first)
    outbox.send(b"b")
    outbox.send(b"c", after=second)
    outbox.send(b"d")
    assert transport.out == b""
    second.set_result(None)
    await _turns()
    assert transport.out == b""  # "c" is ready, but "a" is not
    first.set_result(None)
    await asyncio.sleep(0)  # the future's callback: the frames go out in that turn
    assert transport.out == _frames(b"a", b"b", b"c", b"d")
    assert transport.writes == 1
    await outbox.aclose()


async def test_while_writing_is_paused_the_task_writes_after_the_drain() -> None:
    outbox, transport, _ = _outbox(high_water=10)
    outbox.send(b"x" * 20)  # the transport pauses after this one
    outbox.send(b"held")
    outbox.send(b"back")
    assert transport.out == _frames(b"x" * 20)
    await _turns()
    assert transport.out == _frames(b"x" * 20)
    transport.high_water = 1 << 30
    transport.protocol.resume()
    await _turns()
    assert transport.out == _frames(b"x" * 20, b"held", b"back")
    outbox.send(b"again")  # flow control let go: the fast path again
    assert transport.out.endswith(_frames(b"again"))
    await outbox.aclose()


async def test_a_storage_failure_writes_what_came_before_and_hangs_up() -> None:
    outbox, transport, ws = _outbox()
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outbox.send(b"before")
    outbox.send(b"never", after=failed)
    outbox.send(b"after")
    failed.set_exception(StorageError("disk full"))
    for _ in range(20):
        if outbox.closed:
            break
        await asyncio.sleep(0)
    assert outbox.closed
    assert ws.close_code == 1011
    assert transport.out == _frames(b"before")
    outbox.send(b"later")
    assert transport.out == _frames(b"before")
    await outbox.aclose()


async def test_unavailable_sends_the_refusal_in_place_of_the_frames() -> None:
    outbox, transport, ws = _outbox()
    refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outbox.send_many([b"ok", b"ok"], after=refused, refuse=lambda exc: b"no: " + exc.message.encode())
    outbox.send(b"next")
    refused.set_exception(UnavailableError("no slave"))
    await _turns()
    assert transport.out == _frames(b"no: no slave", b"no: no slave", b"next")
    assert not outbox.closed and ws.close_code is None
    await outbox.aclose()


async def test_a_closing_transport_ends_the_outbox_quietly() -> None:
    outbox, transport, _ = _outbox()
    transport.closing = True
    outbox.send(b"lost")
    assert outbox.closed
    assert transport.out == b""
    await outbox.wait_writable()  # returns: nothing will drain a closed outbox
    await outbox.aclose()


def _depth() -> int:
    frame: Any = sys._getframe()
    n = 0
    while frame is not None:
        n += 1
        frame = frame.f_back
    return n


async def test_callbacks_that_send_more_never_recurse() -> None:
    """An auto-ack frees credit and the next delivery is sent from the write callback:
    a chain of thousands of them keeps the stack flat and the frames in order."""
    outbox, transport, _ = _outbox()
    chain = 3000
    depths: list[int] = []

    def sent(i: int) -> None:
        depths.append(_depth())
        if i < chain:
            outbox.send(str(i + 1).encode(), on_sent=lambda: sent(i + 1))

    async def chain_of(first: Callable[[], None]) -> None:
        depths.clear()
        transport.out.clear()
        first()
        for _ in range(chain + 10):
            if len(depths) > chain:
                break
            await asyncio.sleep(0)
        assert transport.out == _frames(*(str(i).encode() for i in range(chain + 1)))
        assert max(depths) - min(depths) < 20

    def after_a_future() -> None:  # the callbacks run inline, in the future's turn
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        outbox.send(b"0", after=ready, on_sent=lambda: sent(0))
        ready.set_result(None)

    await chain_of(after_a_future)
    await chain_of(lambda: outbox.send(b"0", on_sent=lambda: sent(0)))  # callbacks: next turn
    await outbox.aclose()


async def test_write_callbacks_never_run_inside_send() -> None:
    """``send`` may be called by the broker while it hands out pushes: an auto-ack's
    callback calling back into the broker there would re-enter it."""
    outbox, transport, _ = _outbox()
    ran: list[str] = []
    outbox.send(b"m", on_sent=lambda: ran.append("acked"))
    assert transport.out == _frames(b"m") and ran == []
    await asyncio.sleep(0)
    assert ran == ["acked"]
    await outbox.aclose()


async def test_room_is_given_after_writes_and_after_a_drain_never_inside_send() -> None:
    """``on_room`` (the send-room bound on deliveries) hears what the queue can take once
    frames are written, and, while writing is paused, only once the transport drained."""
    outbox, transport, _ = _outbox(high_water=100, max_bytes=1000)
    rooms: list[int] = []
    outbox.on_room = rooms.append
    outbox.send(b"a")
    assert rooms == []  # not inside send: the broker may be what called it
    await asyncio.sleep(0)
    assert rooms == [1000]
    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outbox.send(b"b", after=ready)
    ready.set_result(None)
    await asyncio.sleep(0)  # the future's own turn: room given there
    assert rooms == [1000, 1000]
    outbox.send(b"x" * 200)  # the transport pauses
    outbox.send(b"y" * 300)
    await _turns()
    assert rooms == [1000, 1000]
    transport.high_water = 1 << 30
    transport.protocol.resume()
    await _turns()
    assert transport.out.endswith(_frames(b"y" * 300))
    assert rooms[-1] == 1000 and len(rooms) > 2
    await outbox.aclose()
    assert outbox.on_room is None
