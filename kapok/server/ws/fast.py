"""Text frames handed to the route as they are read, for one-frame-per-message sockets.

KapokMQ clients send a frame per message and per ack. Through aiohttp each frame became a
message object in a queue, a future, a task switch into the route's read loop, and a
``call_soon`` to batch the frames of a turn: three event-loop turns and several objects
between a frame's arrival and its ``ok``. ``FastResponse`` is aiohttp's WebSocket response
with its frame reader replaced by ``FastTexts`` (``kapok.server.ws.frames`` parses each
socket read in one pass): once the route calls ``go_direct``, the text messages of each
read go to the route's handler at once, as one list, in the protocol's own
``data_received``. Everything else (binary messages, ping, pong, close, a protocol error)
still goes into aiohttp's queue exactly as aiohttp's reader would put it there, so
``ws.receive()`` keeps doing what it does for them: answering pings, the closing
handshake, failing the connection with the right close code.

Order is kept: a message that is not text, and every text after it, go to the queue until
the route has read the queue empty and calls ``go_direct`` again (a producer's replies
must come in the order of its frames). Flow control is the route's: ``go_direct`` takes a
``full`` test, and while it is true the socket is not read (``pause_reading``) until
``writable`` returns.

The reader is swapped in through ``aiohttp_seam.ParserSwapResponse``, which holds the
aiohttp 3.x internals this needs. Without them the response works as aiohttp's own
(``fast`` stays None), the node says so at start (``aiohttp_seam.check_hooks``) and
tests/integration/test_wsfast.py fails.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sized
from typing import Any

from aiohttp import WebSocketError, WSMessage, WSMsgType

from kapok.server.aiohttp_seam import ParserSwapResponse
from kapok.server.ws.frames import BINARY, CLOSE, PING, PONG, TEXT, ClientFrames, Message

__all__ = ["FastResponse", "FastTexts"]

Handler = Callable[[list[str]], None]

log = logging.getLogger("kapok.server")

_TYPES = {BINARY: WSMsgType.BINARY, PING: WSMsgType.PING, PONG: WSMsgType.PONG}


def _queued(message: Message) -> tuple[WSMessage, int]:
    """A message as aiohttp's reader puts it in the queue, with the size it counts."""
    opcode, payload = message
    if opcode == TEXT:
        assert isinstance(payload, str)
        return WSMessage(WSMsgType.TEXT, payload, ""), len(payload)
    if opcode == CLOSE:
        assert isinstance(payload, tuple)
        return WSMessage(WSMsgType.CLOSE, payload[0], payload[1]), 0
    assert isinstance(payload, bytes)
    return WSMessage(_TYPES[opcode], payload, ""), len(payload)


class FastTexts:
    """The frame reader of one connection (what aiohttp's protocol calls ``feed_data`` on)."""

    __slots__ = (
        "_frames", "_full", "_handler", "_held", "_protocol", "_queue", "_queued", "_release", "_writable"
    )  # fmt: skip

    def __init__(self, protocol: Any, queue: Any, queued: Sized, max_size: int) -> None:
        self._protocol = protocol  # aiohttp's RequestHandler: pause_reading, resume_reading
        self._queue = queue  # aiohttp's WebSocketDataQueue: what ws.receive() reads
        self._queued = queued  # its messages not read yet
        self._frames = ClientFrames(max_size)
        self._handler: Handler | None = None
        self._full: Callable[[], bool] = bool
        self._writable: Callable[[], Awaitable[None]] | None = None
        self._held = False
        self._release: asyncio.Task[None] | None = None

    @property
    def direct(self) -> bool:
        return self._handler is not None

    def go_direct(
        self, handler: Handler, full: Callable[[], bool], writable: Callable[[], Awaitable[None]]
    ) -> bool:
        """Hand text messages to ``handler`` from now on, if aiohttp's queue is empty (else
        the route reads what is queued first and calls again); True once direct."""
        if self._queued or self._frames.error is not None:
            return False
        self._handler, self._full, self._writable = handler, full, writable
        return True

    def stop(self) -> None:
        """The route is done: text messages go to the queue again (unread), never to the handler."""
        self._handler = None
        if self._release is not None:
            self._release.cancel()

    # ------------------------------------------------------------ aiohttp's parser interface

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        try:
            self._feed(data)
        except Exception:  # a bug in a handler: fail this connection (1011), keep the node
            log.exception("unexpected error handling a WebSocket's frames")
            self._handler = None
            if not self._queue.is_eof():
                self._queue.set_exception(WebSocketError(1011, "internal error; see the node's log"))
        return False, b""

    def _feed(self, data: bytes) -> None:
        messages = self._frames.feed(data)
        handler = self._handler
        if handler is not None:
            texts: list[str] = []
            for message in messages:
                if self._handler is not None and message[0] == TEXT:
                    texts.append(message[1])  # type: ignore[arg-type]
                    continue
                if texts:
                    handler(texts)
                    texts = []
                self._handler = None  # the rest waits for the route (see the docstring)
                self._put(message)
            if texts:
                handler(texts)
            if self._full():
                self._hold()
        else:
            for message in messages:
                self._put(message)
        error = self._frames.error
        if error is not None and not self._queue.is_eof():
            self._queue.set_exception(WebSocketError(error.code, error.reason))

    def feed_eof(self) -> None:
        self._queue.feed_eof()

    def _put(self, message: Message) -> None:
        msg, size = _queued(message)
        self._queue.feed_data(msg, size)

    # ------------------------------------------------------------ flow control

    def _hold(self) -> None:
        """Stop reading the socket until the route's ``writable`` returns."""
        self._protocol.pause_reading()
        if not self._held and self._writable is not None:
            self._held = True
            self._release = asyncio.get_running_loop().create_task(self._resume(self._writable))

    async def _resume(self, writable: Callable[[], Awaitable[None]]) -> None:
        try:
            await writable()
        finally:
            self._held = False
            self._release = None
        with contextlib.suppress(Exception):  # the connection may be gone meanwhile
            self._protocol.resume_reading()


class FastResponse(ParserSwapResponse):
    """aiohttp's WebSocket response, its frames read by ``FastTexts`` (``fast``) when
    aiohttp's internals are as expected and no frame came before the upgrade finished."""

    fast: FastTexts | None = None

    def replacement_parser(
        self, protocol: Any, queue: Any, parsed: collections.deque[Any], max_size: int
    ) -> Any:
        self.fast = FastTexts(protocol, queue, parsed, max_size)
        return self.fast
