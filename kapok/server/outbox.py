"""One WebSocket's ordered send queue and the task that drains it.

Every frame for a connection goes through its outbox, so a slow client only
ever fills its own queue, never the broker's or another client's. What can
queue up is bounded twice: deliveries by the consumer's credit (the broker
never has more than ``prefetch`` unacked messages out to it) and by the
queue's room in bytes (``on_room``: the broker hands a consumer no more
than its connection's queue can take), and replies by backpressure (the
connection's reader stops reading new requests while more than
``max_bytes`` are queued, see ``wait_writable``).

A frame may wait for a future first (a producer ack waits until its message
is durable) and may run a callback once written (auto-ack consumers are
acked only after the write: at-most-once, never lost before the write). When
the future fails with an ``UnavailableError`` (sync replication without its
slave), the item's ``refuse`` builds the error frames sent in its place; any
other failure (the disk) closes the connection.

Why frames are framed here and not by aiohttp's ``send_frame``: a socket
write is a system call, and the KapokMQ protocol sends one frame per message
(an ``ok`` per publish, a push per delivery). So the drain task takes every
frame that is ready (its future done) and hands them to the transport in one
write (``writelines``: one ``writev``): the bytes on the wire are the same
frames, but one syscall carries hundreds of them. Flow control stays aiohttp's: after each write the task
awaits the response's ``drain()``, which blocks only while the transport is
paused above its high-water mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections import deque
from collections.abc import Callable

from aiohttp import WSCloseCode, web
from aiohttp.abc import AbstractStreamWriter

from kapok.errors import KapokError, StorageError, UnavailableError

__all__ = ["Outbox", "text_frame_header", "text_frames"]

log = logging.getLogger("kapok.server")

# What to send instead of frames whose future failed with an UnavailableError (wire bytes).
Refusal = Callable[[KapokError], bytes]
# A queue item: one or more frames, already framed, what they wait for, what runs once
# written, and what to send instead if the wait fails.
_Item = tuple[bytes, "asyncio.Future[None] | None", Callable[[], None] | None, Refusal | None]

# RFC 6455 §5.2, server to client (never masked): FIN + opcode 1 (text), then the length.
_FIN_TEXT = 0x81
_SHORT_HEADERS = [bytes((_FIN_TEXT, n)) for n in range(126)]
_LEN16 = struct.Struct("!BBH").pack
_LEN64 = struct.Struct("!BBQ").pack
# One write carries at most about this many bytes, so a long queue is sent in
# slices, with flow control between them.
_WRITE_MAX = 256 * 1024


def text_frame_header(length: int) -> bytes:
    if length < 126:
        return _SHORT_HEADERS[length]
    if length < 65536:
        return _LEN16(_FIN_TEXT, 126, length)
    return _LEN64(_FIN_TEXT, 127, length)


def text_frames(payloads: list[bytes]) -> bytes:
    """The wire bytes of one text frame per payload, back to back."""
    parts: list[bytes] = []
    add = parts.append
    for payload in payloads:
        add(text_frame_header(len(payload)))
        add(payload)
    return b"".join(parts)


class Outbox:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        transport: asyncio.Transport,
        writer: AbstractStreamWriter,
        max_bytes: int,
    ) -> None:
        self._ws = ws
        self._transport = transport
        self._writer = writer  # the response's stream writer: its drain() is aiohttp's flow control
        self._max_bytes = max_bytes
        self._queue: deque[_Item] = deque()
        self._bytes = 0
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.closed = False
        # Called after each write with the bytes the queue can take now: the connection
        # gives that room to its consumers (Broker.set_room), so deliveries stop while
        # the queue is full instead of growing it by a whole prefetch window.
        self.on_room: Callable[[int], None] | None = None

    @property
    def free_bytes(self) -> int:
        return max(0, self._max_bytes - self._bytes)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def send(
        self,
        frame: bytes,
        *,
        after: asyncio.Future[None] | None = None,
        on_sent: Callable[[], None] | None = None,
        refuse: Callable[[KapokError], bytes] | None = None,
    ) -> None:
        """Queue one text frame with ``frame`` as its payload; ``refuse`` gives the payload
        sent instead when ``after`` fails with an ``UnavailableError``."""
        wire_refusal = None if refuse is None else (lambda exc: text_frames([refuse(exc)]))
        self._enqueue(text_frame_header(len(frame)) + frame, after, on_sent, wire_refusal)

    def send_many(
        self,
        frames: list[bytes],
        *,
        after: asyncio.Future[None] | None = None,
        refuse: Callable[[KapokError], bytes] | None = None,
    ) -> None:
        """Queue one text frame per payload (one queue item for all of them); ``refuse``
        gives the payload sent instead of each when ``after`` fails with an ``UnavailableError``."""
        if frames:
            n = len(frames)
            wire_refusal = None if refuse is None else (lambda exc: text_frames([refuse(exc)] * n))
            self._enqueue(text_frames(frames), after, None, wire_refusal)

    def _enqueue(
        self,
        data: bytes,
        after: asyncio.Future[None] | None,
        on_sent: Callable[[], None] | None,
        refusal: Refusal | None,
    ) -> None:
        if self.closed:
            return
        self._queue.append((data, after, on_sent, refusal))
        self._bytes += len(data)
        if not self._wakeup.is_set():
            self._wakeup.set()

    @property
    def full(self) -> bool:
        """More than ``max_bytes`` are queued: readers should ``wait_writable()`` before reading on."""
        return self._bytes > self._max_bytes

    async def wait_writable(self) -> None:
        """Return once less than ``max_bytes`` are queued (readers call this before reading)."""
        while self._bytes > self._max_bytes and not self.closed:
            self._drained.clear()
            await self._drained.wait()

    async def _run(self) -> None:
        queue = self._queue
        try:
            while not self.closed:
                while queue:
                    head = queue[0][1]
                    if head is not None and not head.done():
                        with contextlib.suppress(Exception):  # _write_ready reports a failure
                            await head
                    if not await self._write_ready():
                        return
                self._wakeup.clear()
                await self._wakeup.wait()
        except (ConnectionError, RuntimeError):
            pass  # the peer went away; the reader side cleans up
        finally:
            self.closed = True
            self._drained.set()

    async def _write_ready(self) -> bool:
        """Write the items at the head of the queue whose futures are done, in one write.

        Returns False when the connection must end (storage failed, or it is closing).
        """
        queue = self._queue
        parts: list[bytes] = []
        callbacks: list[Callable[[], None]] = []
        size = dequeued = 0
        failed: BaseException | None = None
        while queue and size < _WRITE_MAX:
            data, after, on_sent, refusal = queue[0]
            queued = len(data)
            if after is not None:
                if not after.done():
                    break
                failed = StorageError("cancelled") if after.cancelled() else after.exception()
                if isinstance(failed, UnavailableError) and refusal is not None:
                    data, on_sent, failed = refusal(failed), None, None  # an error frame, not a hang-up
                if failed is not None:
                    break
            queue.popleft()
            dequeued += queued
            parts.append(data)
            size += len(data)
            if on_sent is not None:
                callbacks.append(on_sent)
        if parts:
            if self._ws.closed or self._transport.is_closing():
                return False
            # writelines, not write(b"".join(parts)): the items go out as one writev, with
            # no copy into a new buffer (joined, a 256 KiB write cost 300 µs of CPU on this
            # machine, page faults of the fresh buffer included; 17 items of 15 KiB, 60 µs).
            self._transport.writelines(parts)
            self._bytes -= dequeued
            if self._bytes <= self._max_bytes // 2:
                self._drained.set()
            for on_sent in callbacks:
                on_sent()
            await self._writer.drain()
            if self.on_room is not None and self._bytes < self._max_bytes:
                self.on_room(self._max_bytes - self._bytes)
        if failed is not None:
            # Storage failed: this frame's message is not durable, so never confirm it; hang up.
            message = failed.message if isinstance(failed, KapokError) else str(failed)
            log.error("closing a connection: %s", message)
            await self._ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"storage failure")
            return False
        return True

    async def aclose(self) -> None:
        """Stop writing; frames still queued are dropped (the connection is going away)."""
        self.closed = True
        self._drained.set()
        self.on_room = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._queue.clear()  # give the memory back now, not when the last reference goes
        self._bytes = 0
