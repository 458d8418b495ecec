"""One WebSocket's ordered send queue and the task that drains it.

Every frame for a connection goes through its outbox, so a slow client only
ever fills its own queue, never the broker's or another client's. What can
queue up is bounded twice: deliveries by the consumer's credit (the broker
never has more than ``prefetch`` unacked messages out to it), and replies by
backpressure (the connection's reader stops reading new requests while more
than ``max_bytes`` are queued, see ``wait_writable``).

A frame may wait for an awaitable first (a producer ack waits until its
message is durable) and may run a callback once written (auto-ack consumers
are acked only after the write: at-most-once, never lost before the write).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, WSMsgType, web

from kapok.errors import KapokError

__all__ = ["Outbox"]

log = logging.getLogger("kapok.server")

_Item = tuple[bytes, Awaitable[None] | None, Callable[[], None] | None]


class Outbox:
    def __init__(self, ws: web.WebSocketResponse, max_bytes: int) -> None:
        self._ws = ws
        self._max_bytes = max_bytes
        self._queue: deque[_Item] = deque()
        self._bytes = 0
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def send(
        self,
        frame: bytes,
        *,
        after: Awaitable[None] | None = None,
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        if self.closed:
            return
        self._queue.append((frame, after, on_sent))
        self._bytes += len(frame)
        self._wakeup.set()

    async def wait_writable(self) -> None:
        """Return once less than ``max_bytes`` are queued (readers call this before reading)."""
        while self._bytes > self._max_bytes and not self.closed:
            self._drained.clear()
            await self._drained.wait()

    async def _run(self) -> None:
        ws = self._ws
        queue = self._queue
        try:
            while not self.closed:
                while queue:
                    frame, after, on_sent = queue.popleft()
                    if after is not None:
                        try:
                            await after
                        except KapokError as exc:  # storage failed: never confirm, hang up
                            log.error("closing a connection: %s", exc.message)
                            await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"storage failure")
                            return
                    await ws.send_frame(frame, WSMsgType.TEXT)
                    self._bytes -= len(frame)
                    if self._bytes <= self._max_bytes // 2:
                        self._drained.set()
                    if on_sent is not None:
                        on_sent()
                self._wakeup.clear()
                await self._wakeup.wait()
        except (ConnectionError, RuntimeError):
            pass  # the peer went away; the reader side cleans up
        finally:
            self.closed = True
            self._drained.set()

    async def aclose(self) -> None:
        """Stop writing; frames still queued are dropped (the connection is going away)."""
        self.closed = True
        self._drained.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
