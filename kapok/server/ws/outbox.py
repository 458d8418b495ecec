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
the future fails with a ``KapokError`` (sync replication without its slave, a
failed write-ahead log), the item's ``refuse`` builds the error frames sent in
its place: an error never closes a producer's connection. A delivery has no
``refuse``: when its messages' write failed, the connection is closed (the
broker requeues what the consumer held).

Why frames are queued and joined here: a socket
write is a system call, and the KapokMQ protocol sends one frame per message
(an ``ok`` per publish, a push per delivery). So every frame that is ready
(its future done) goes to the transport with the others ready at that moment,
in one write (``writelines``: one ``writev``): the bytes on the wire are the
same frames, but one syscall carries hundreds of them.

When: at once, on the caller's turn, when the frame is at the head of the
queue and ready (a push of durable messages, a reply that waits for nothing),
or in the callback of the head's future (a producer's ``ok`` goes out in the
turn its WAL write completes, with no task switch). Flow control is the
transport's: while the socket has writing paused (the transport above its
high-water mark) the connection's task takes over and awaits ``drain()``
between writes; the task also hangs up after a storage failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from aiohttp import WSCloseCode

from kapok.errors import KapokError, StorageError
from kapok.server.ws.frames import TEXT, server_header
from kapok.server.ws.socket import ServerSocket
from kapok.tasks import cancel_and_wait

__all__ = ["Outbox", "text_frames"]

log = logging.getLogger("kapok.server")

# What to send instead of frames whose future failed with a KapokError (wire bytes).
Refusal = Callable[[KapokError], bytes]
# A queue item: one or more frames, already framed, what they wait for, what runs once
# written, and what to send instead if the wait fails.
_Item = tuple[bytes, "asyncio.Future[None] | None", Callable[[], None] | None, Refusal | None]

# One write carries at most about this many bytes, so a long queue is sent in
# slices, with flow control between them.
_WRITE_MAX = 256 * 1024
_CLOSING = ConnectionResetError("the connection is closing")  # _write_now: stop, quietly


def text_frames(payloads: list[bytes]) -> bytes:
    """The wire bytes of one text frame per payload, back to back."""
    parts: list[bytes] = []
    add = parts.append
    for payload in payloads:
        add(server_header(TEXT, len(payload)))
        add(payload)
    return b"".join(parts)


class Outbox:
    def __init__(self, sock: ServerSocket, max_bytes: int) -> None:
        self._sock = sock  # its writing_paused and drain() are the flow control
        self._transport = sock.transport
        self._max_bytes = max_bytes
        self._queue: deque[_Item] = deque()
        self._bytes = 0
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._writing = False  # a write (the task's, or a synchronous one) is under way
        self._failure: BaseException | None = None  # for the task: hang up
        self.closed = False
        # Called after writes with the bytes the queue can take now: the connection gives
        # that room to its consumers (Broker.set_room), so deliveries stop while the queue
        # is full instead of growing it by a whole prefetch window. Like the write
        # callbacks, never from inside ``send``, and only while writing is not paused.
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
        sent instead when ``after`` fails with a ``KapokError``."""
        wire_refusal = None if refuse is None else (lambda exc: text_frames([refuse(exc)]))
        self._enqueue(server_header(TEXT, len(frame)) + frame, after, on_sent, wire_refusal)

    def send_many(
        self,
        frames: list[bytes],
        *,
        after: asyncio.Future[None] | None = None,
        refuse: Callable[[KapokError], bytes] | None = None,
    ) -> None:
        """Queue one text frame per payload (one queue item for all of them); ``refuse``
        gives the payload sent instead of each when ``after`` fails with a ``KapokError``."""
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
        queue = self._queue
        queue.append((data, after, on_sent, refusal))
        self._bytes += len(data)
        if len(queue) == 1 and not self._writing:
            self._head_changed()

    def write_ready(self) -> None:
        """Write what is ready now: frames whose future completed on this very turn (a
        producer's acks once ``BrokerService.write_now`` made their messages durable)
        go out here instead of on the turn the future's callbacks run."""
        queue = self._queue
        if queue and not self._writing:
            after = queue[0][1]
            if after is None or after.done():
                self._kick(inline=False)

    @property
    def full(self) -> bool:
        """More than ``max_bytes`` are queued: readers should ``wait_writable()`` before reading on."""
        return self._bytes > self._max_bytes

    async def wait_writable(self) -> None:
        """Return once less than ``max_bytes`` are queued (readers call this before reading)."""
        while self._bytes > self._max_bytes and not self.closed:
            self._drained.clear()
            await self._drained.wait()

    # ------------------------------------------------------------ writing

    def _head_changed(self) -> None:
        """The queue has a new head: write it now if it is ready, else once it is."""
        after = self._queue[0][1]
        if after is None or after.done():
            self._kick(inline=False)
        else:
            after.add_done_callback(self._on_ready)

    def _on_ready(self, _: object) -> None:
        self._kick(inline=True)

    def _kick(self, *, inline: bool) -> None:
        """Write what is ready, now: a frame whose future is done (or that waits for none)
        goes out without a task switch (a round trip's ``ok`` is written in the turn its
        WAL write completes). ``inline``: this is a turn of the outbox's own (a future's
        callback), so the write callbacks run here too; from ``send`` (whose caller may be
        the broker handing out pushes) they run on the next turn instead. The task takes
        over while aiohttp's flow control holds writes back, and hangs up after a storage
        failure."""
        if self.closed or self._writing:
            return
        if self._sock.writing_paused:
            self._wakeup.set()
            return
        self._writing = True
        try:
            outcome = self._write_now(inline=inline)
        except (ConnectionError, RuntimeError):  # the peer went away; the reader side cleans up
            outcome = _CLOSING
        finally:
            self._writing = False
        if outcome is _CLOSING:
            self._stop()
        elif outcome is not None:
            self._failure = outcome
            self._wakeup.set()
        elif self._paused():
            self._wakeup.set()  # the task drains, then writes the rest and gives room
        elif self._queue:
            self._head_changed()  # the new head waits for its future

    def _paused(self) -> bool:
        return self._sock.writing_paused

    def _stop(self) -> None:
        self.closed = True
        self._drained.set()

    async def _run(self) -> None:
        """The slow path: writes while flow control holds them back, and the hang-up."""
        queue = self._queue
        try:
            while not self.closed:
                await self._wakeup.wait()
                self._wakeup.clear()
                self._writing = True
                try:
                    while True:
                        outcome, self._failure = self._failure, None
                        if outcome is None:
                            await self._sock.drain()
                            if not queue:
                                self._give_room()  # what the drain made room for
                                if not queue:
                                    break
                            head = queue[0][1]
                            if head is not None and not head.done():
                                with contextlib.suppress(Exception):  # _write_now reports a failure
                                    await head
                            outcome = self._write_now(inline=True)
                        if outcome is _CLOSING or self.closed:
                            return
                        if outcome is not None:
                            await self._hang_up(outcome)
                            return
                finally:
                    self._writing = False
        except (ConnectionError, RuntimeError):
            pass  # the peer went away; the reader side cleans up
        finally:
            self._stop()

    def _write_now(self, *, inline: bool) -> BaseException | None:
        """Write the items at the head of the queue whose futures are done, in writes of
        at most ``_WRITE_MAX`` bytes, while flow control lets them through, and run their
        callbacks (``inline``: here, between writes; else on the next turn). Returns the
        failure of a head's future when the connection must end (storage failed), or
        ``_CLOSING`` when it is closing already.

        A callback that queues more (an auto-ack that frees credit for the next delivery)
        finds ``_writing`` set: its frames are appended and this loop writes them, with no
        recursion; on the next turn, a new ``_kick`` (one level deep, whatever the chain)."""
        queue = self._queue
        later: list[Callable[[], None]] = []
        wrote = False
        failed: BaseException | None = None
        try:
            while queue and not self._paused():
                parts: list[bytes] = []
                callbacks: list[Callable[[], None]] = []
                size = dequeued = 0
                while queue and size < _WRITE_MAX:
                    data, after, on_sent, refusal = queue[0]
                    queued = len(data)
                    if after is not None:
                        if not after.done():
                            break
                        failed = StorageError("cancelled") if after.cancelled() else after.exception()
                        if isinstance(failed, KapokError) and refusal is not None:
                            data, on_sent, failed = refusal(failed), None, None  # an error frame instead
                        if failed is not None:
                            break
                    queue.popleft()
                    dequeued += queued
                    parts.append(data)
                    size += len(data)
                    if on_sent is not None:
                        callbacks.append(on_sent)
                if parts:
                    if self._sock.closed or self._transport.is_closing():
                        return _CLOSING
                    # writelines, not write(b"".join(parts)): the items go out as one writev, with
                    # no copy into a new buffer (joined, a 256 KiB write cost 300 µs of CPU on this
                    # machine, page faults of the fresh buffer included; 17 items of 15 KiB, 60 µs).
                    self._transport.writelines(parts)
                    self._bytes -= dequeued
                    if self._bytes <= self._max_bytes // 2:
                        self._drained.set()
                    if inline:
                        for on_sent in callbacks:
                            on_sent()
                        if not self._paused():
                            self._give_room()
                    else:
                        later += callbacks
                        wrote = True
                if failed is not None or not parts:
                    break  # a failure to report, or the head waits for its future
        finally:
            if later or (wrote and self.on_room is not None):
                asyncio.get_running_loop().call_soon(self._after_write, later)
        return failed

    def _after_write(self, callbacks: list[Callable[[], None]]) -> None:
        """The callbacks of a write made inside ``send``, on the next turn."""
        for on_sent in callbacks:
            on_sent()
        if not self._writing and not self._paused():  # else the task gives room after its drain
            self._give_room()

    def _give_room(self) -> None:
        on_room = self.on_room
        if on_room is not None and self._bytes < self._max_bytes and not self.closed:
            on_room(self._max_bytes - self._bytes)

    async def _hang_up(self, failed: BaseException) -> None:
        # Storage failed: this frame's message is not durable, so never confirm it; hang up.
        message = failed.message if isinstance(failed, KapokError) else str(failed)
        log.error("closing a connection: %s", message)
        await self._sock.close(code=WSCloseCode.INTERNAL_ERROR, message=b"storage failure")

    async def aclose(self) -> None:
        """Stop writing; frames still queued are dropped (the connection is going away)."""
        self.closed = True
        self._drained.set()
        self.on_room = None
        if self._task is not None:
            await cancel_and_wait(self._task)
        self._queue.clear()  # give the memory back now, not when the last reference goes
        self._bytes = 0
