"""A WebSocket connection the node reads and writes itself, once aiohttp has answered the upgrade.

aiohttp checks the upgrade request and writes the 101 (``aiohttp_seam.TakeoverResponse``);
from then on the connection's transport talks to a ``ServerSocket``, a plain
``asyncio.Protocol``: each socket read is parsed in one pass by the pure reader
(``frames.ClientFrames``, every rule of RFC 6455 a server must enforce) and frames are
written straight to the transport. aiohttp's per-frame machinery (a message object, a
queue, a future and a task switch per frame, a guard around every receive) is gone from
the path of a message: KapokMQ clients send one small frame per message and per ack.

Reading has two modes. Until the route calls ``deliver``, data messages wait for
``receive`` (aiohttp's shape: the KapokMQ key exchange, the replication link). After it,
the text and binary payloads of each socket read go to the route's handler at once, as one
list, in order; while the route's send queue is full, the socket is not read until it has
room again.

The socket itself answers pings, fails the connection on a violation (a close frame with
the reader's code, then the transport closes: 1002, 1007, 1009, as aiohttp did), answers
a client's close frame with 1000 and closes, and, with a heartbeat, pings a client silent
for ``heartbeat_s`` and drops it (close code 1006, no frame) when half that again passes
without a byte. A close the node starts (``close``) waits for the client's close frame at
most ``close_timeout_s``; a closing transport that does not finish in that time (a client
that stopped reading) is aborted.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Protocol

from aiohttp import WSMessage, WSMsgType, web

from kapok.server.busypoll import BusyPoll
from kapok.server.ws.frames import (
    BINARY,
    CLOSE,
    PING,
    PONG,
    TEXT,
    ClientFrames,
    Message,
    close_payload,
    server_frame,
)

__all__ = ["Handler", "Sends", "ServerSocket"]

log = logging.getLogger("kapok.server")

Handler = Callable[[list[str | bytes]], None]
"""Takes the data messages of one socket read, in order: text as ``str``, binary as ``bytes``."""


class Sends(Protocol):
    """A route's send queue (``kapok.server.ws.outbox.Outbox``), as reading sees it."""

    @property
    def full(self) -> bool: ...

    async def wait_writable(self) -> None: ...


ABNORMAL = 1006  # §7.4.1: the connection ended without a close frame (never sent)
_CLOSED = WSMessage(WSMsgType.CLOSED, None, None)


class ServerSocket(asyncio.Protocol):
    """One client's WebSocket after the upgrade (see the module's docstring)."""

    def __init__(
        self,
        response: web.StreamResponse,
        transport: asyncio.Transport,
        *,
        max_size: int,
        heartbeat_s: float | None,
        close_timeout_s: float,
        poll: BusyPoll | None = None,
    ) -> None:
        self.response = response  # what the route returns to aiohttp
        self.transport = transport
        # The protocol the transport had (aiohttp's, behind the connection guard): told of
        # the connection's end, so both keep their books.
        self._previous = transport.get_protocol()
        self._loop = asyncio.get_running_loop()
        self._frames = ClientFrames(max_size)
        self._inbox: collections.deque[Message] = collections.deque()  # read, not received yet
        self._waiter: asyncio.Future[None] | None = None  # a receive() waiting for the inbox
        self._handler: Handler | None = None
        self._sends: Sends | None = None  # the route's send queue: reading waits while it is full
        self._release: asyncio.Task[None] | None = None  # resumes reading once writable
        self._writing_paused = False
        self._drainers: list[asyncio.Future[None]] = []
        self._close_sent = False
        self._end: WSMessage | None = None  # why reading ended: a close frame, an error, the loss
        self._done = self._loop.create_future()  # the connection is over (or closing for good)
        self._lost = False
        self._timer: asyncio.TimerHandle | None = None  # the heartbeat, then the close time-out
        self._close_timeout_s = close_timeout_s
        self._heartbeat_s = heartbeat_s
        self._heard = self._loop.time()
        self._pinged = False
        self._poll = poll  # told of every read (``kapok.server.busypoll``)
        self.close_code: int | None = None
        transport.set_protocol(self)
        if heartbeat_s:
            self._timer = self._loop.call_at(self._heard + heartbeat_s, self._beat)

    # ------------------------------------------------------------ asyncio.Protocol

    def data_received(self, data: bytes) -> None:
        self._heard = self._loop.time()
        if self._poll is not None:
            self._poll.heard()
        if self._end is not None:
            return  # after a close frame or a violation nothing more is read
        frames = self._frames
        try:
            self._dispatch(frames.feed(data))
        except Exception:  # a bug in a handler: fail this connection (1011), keep the node
            log.exception("unexpected error handling a WebSocket's frames")
            self._fail(1011, "internal error; see the node's log")
            return
        error = frames.error
        if error is not None:
            self._fail(error.code, error.reason)

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self.close_code is None:
            self.close_code = ABNORMAL
        self._cancel_timer()
        if self._release is not None:
            self._release.cancel()
        for drainer in self._drainers:
            if not drainer.done():
                drainer.set_exception(ConnectionResetError("the connection is closed"))
        self._drainers.clear()
        self._ended(_CLOSED)
        if not self._done.done():
            self._done.set_result(None)
        self._previous.connection_lost(exc)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for drainer in self._drainers:
            if not drainer.done():
                drainer.set_result(None)
        self._drainers.clear()

    # ------------------------------------------------------------ reading

    def _dispatch(self, messages: list[Message]) -> None:
        # Once the node has sent its close frame no reply can follow: data is dropped.
        handler = None if self._close_sent else self._handler
        payloads: list[str | bytes] = []
        for message in messages:
            opcode, payload = message
            if opcode < CLOSE:  # text or binary
                if handler is not None:
                    payloads.append(payload)  # type: ignore[arg-type]
                elif not self._close_sent:
                    self._inbox.append(message)
                    self._wake()
            elif opcode == PING:
                self._write(server_frame(PONG, payload))  # type: ignore[arg-type]
            elif opcode == CLOSE:
                if payloads and handler is not None:
                    handler(payloads)
                    payloads = []
                assert isinstance(payload, tuple)
                self._peer_closed(*payload)
                return
            # a pong: the bytes were heard, which is all the heartbeat asks
        if payloads and handler is not None:
            handler(payloads)
            self._hold_if_full()

    def deliver(self, handler: Handler, sends: Sends) -> None:
        """From now on give every data message to ``handler``, those read already first;
        stop reading while ``sends`` is full, until it is writable again."""
        self._handler, self._sends = handler, sends
        if self._inbox:
            waiting = [payload for _, payload in self._inbox]
            self._inbox.clear()
            handler(waiting)  # type: ignore[arg-type]
            self._hold_if_full()

    def stop(self) -> None:
        """The route is done with the connection: no more messages for its handler."""
        self._handler = None
        if self._release is not None:
            self._release.cancel()

    async def receive(self, timeout: float | None = None) -> WSMessage:
        """The next data message, as aiohttp's ``receive`` gives it; once reading has ended,
        the close frame, the error, or CLOSED. ``TimeoutError`` past ``timeout``."""
        while not self._inbox:
            if self._end is not None:
                end, self._end = self._end, _CLOSED
                return end
            self._waiter = self._loop.create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._waiter
            finally:
                self._waiter = None
        opcode, payload = self._inbox.popleft()
        return WSMessage(WSMsgType.TEXT if opcode == TEXT else WSMsgType.BINARY, payload, None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _ended(self, end: WSMessage) -> None:
        if self._end is None:
            self._end = end
        self._handler = None
        self._wake()

    def _hold_if_full(self) -> None:
        sends = self._sends
        if sends is not None and sends.full:
            self._hold(sends)

    def _hold(self, sends: Sends) -> None:
        """Stop reading the socket until the route's send queue is writable again."""
        if self._release is not None or self._lost:
            return
        self.transport.pause_reading()
        self._release = self._loop.create_task(self._resume(sends))

    async def _resume(self, sends: Sends) -> None:
        try:
            await sends.wait_writable()
        finally:
            self._release = None
        if not self._lost and not self.transport.is_closing():
            self.transport.resume_reading()

    # ------------------------------------------------------------ writing

    @property
    def closed(self) -> bool:
        """The node sent its close frame, or the connection is gone: nothing more is written."""
        return self._close_sent or self._lost

    @property
    def writing_paused(self) -> bool:
        return self._writing_paused

    async def drain(self) -> None:
        """Return once the transport takes writes again (``ConnectionResetError`` if it is gone)."""
        if self._lost:
            raise ConnectionResetError("the connection is closed")
        if self._writing_paused:
            drainer = self._loop.create_future()
            self._drainers.append(drainer)
            await drainer

    def _write(self, frame: bytes) -> None:
        if not self._close_sent and not self._lost:
            self.transport.write(frame)

    async def send_str(self, data: str) -> None:
        await self.send_frame(TEXT, data.encode())

    async def send_bytes(self, data: bytes) -> None:
        await self.send_frame(BINARY, data)

    async def send_frame(self, opcode: int, payload: bytes) -> None:
        if self.closed:
            raise ConnectionResetError("the WebSocket is closing")
        self.transport.write(server_frame(opcode, payload))
        await self.drain()

    # ------------------------------------------------------------ closing

    def _send_close(self, code: int, reason: bytes) -> None:
        if not self._close_sent and not self._lost:
            self.transport.write(server_frame(CLOSE, close_payload(code) + reason[:123]))
        self._close_sent = True
        if self.close_code is None:
            self.close_code = code

    def _shut(self) -> None:
        """Close the transport, and abort it if it has not finished in ``close_timeout_s``."""
        self._cancel_timer()
        if not self._lost:
            self.transport.close()
            self._timer = self._loop.call_later(self._close_timeout_s, self._abort)
        if not self._done.done():
            self._done.set_result(None)

    def _abort(self) -> None:
        self._timer = None
        if not self._lost:
            self.transport.abort()

    def _peer_closed(self, code: int, reason: str) -> None:
        """The client's close frame: answer it (1000), unless it answers ours, and close."""
        self._send_close(1000, b"")
        self._ended(WSMessage(WSMsgType.CLOSE, code, reason))
        self._shut()

    def _fail(self, code: int, reason: str) -> None:
        """The client broke the protocol (or a handler failed): close frame, then close."""
        self._send_close(code, reason.encode())
        self._ended(WSMessage(WSMsgType.ERROR, ConnectionError(f"{code}: {reason}"), None))
        self._shut()

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool:
        """Send a close frame and wait (at most ``close_timeout_s``) for the client's; the
        connection is closed either way. False if the node had closed it already."""
        if self._close_sent or self._lost:
            return False
        self._send_close(code, message)
        self._cancel_timer()
        self._timer = self._loop.call_later(self._close_timeout_s, self._shut)
        await asyncio.shield(self._done)
        return True

    async def wait_closed(self) -> None:
        """Return once the connection is over: closed by either side, failed, or lost."""
        await asyncio.shield(self._done)

    # ------------------------------------------------------------ heartbeat

    def _beat(self) -> None:
        self._timer = None
        heartbeat = self._heartbeat_s
        if self._close_sent or self._lost or not heartbeat:
            return
        now = self._loop.time()
        if now - self._heard < heartbeat:  # heard from lately: look again when it would be due
            self._pinged = False
            self._timer = self._loop.call_at(self._heard + heartbeat, self._beat)
        elif not self._pinged:
            self._pinged = True
            self._write(server_frame(PING, b""))
            self._timer = self._loop.call_at(now + heartbeat / 2, self._beat)
        else:  # silent through a heartbeat and half of one after a ping: the client is gone
            self.close_code = ABNORMAL
            self._ended(WSMessage(WSMsgType.ERROR, TimeoutError("no pong from the client"), None))
            self._close_sent = True  # no close frame: the client does not answer anyway
            self._shut()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __repr__(self) -> str:
        state = "lost" if self._lost else "closing" if self._close_sent else "open"
        return f"<ServerSocket {state} {self.transport.get_extra_info('peername')!r}>"
