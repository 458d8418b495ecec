"""RFC 6455 §5.1: a server must fail the connection when a client frame is not masked.

aiohttp's frame reader unmasks what is masked and takes the rest as it is. ``MaskCheck``
walks the frame headers of the byte stream (pure: no I/O; the header layout is
``wsframes.frame_extent``) so that the WebSocket driver can close a connection on its
first unmasked frame with 1002 (protocol error). It reads only headers, skipping payloads
by their length, so it costs little per frame. Sockets read by ``wsfast`` need none of
this: ``wsframes.ClientFrames`` parses every frame and enforces §5.1 itself.

``require_masked_frames`` puts it in front of aiohttp's reader of one connection, through
``aiohttp_seam.wrap_frame_parser`` (two private names of aiohttp 3.x). It is a correctness
hook: a node whose aiohttp does not let it in refuses to start (``aiohttp_seam.check_hooks``),
and ``wsbase.open_ws`` fails a socket it could not be put in front of.
"""

from __future__ import annotations

from typing import Any

from aiohttp import WSCloseCode, web
from aiohttp.http_websocket import WebSocketError

from kapok.server.aiohttp_seam import wrap_frame_parser
from kapok.server.ws.frames import frame_extent

__all__ = ["MaskCheck", "require_masked_frames"]


class MaskCheck:
    """Feed it what the client sends after the upgrade; ``feed`` is False once a frame
    without the mask bit has been seen (and stays False)."""

    __slots__ = ("_head", "_skip", "ok")

    def __init__(self) -> None:
        self._skip = 0  # payload bytes of the current frame still to come
        self._head = b""  # a frame header cut by the end of the last chunk
        self.ok = True

    def feed(self, data: bytes) -> bool:
        if not self.ok:
            return False
        if self._head:
            data = self._head + data
            self._head = b""
        pos, end = 0, len(data)
        skip = self._skip
        while True:
            if skip:
                take = min(skip, end - pos)
                skip -= take
                pos += take
                if skip:
                    break
            if pos >= end:
                break
            if end - pos < 2:
                self._head = data[pos:]
                break
            if not data[pos + 1] & 0x80:
                self.ok = False
                return False
            head, length = frame_extent(data, pos)
            if length < 0:
                self._head = data[pos:]
                break
            pos += head
            skip = length
        self._skip = skip
        return True


class _MaskedOnly:
    """aiohttp's frame reader behind a ``MaskCheck``: an unmasked frame fails the socket."""

    __slots__ = ("_check", "_parser", "_queue")

    def __init__(self, parser: Any, queue: Any) -> None:
        self._parser = parser
        self._queue = queue
        self._check = MaskCheck()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if self._check.feed(data):
            result: tuple[bool, bytes] = self._parser.feed_data(data)
            return result
        if self._check.ok is False and self._queue is not None:
            error = WebSocketError(WSCloseCode.PROTOCOL_ERROR, "client frames must be masked (RFC 6455 5.1)")
            self._queue.set_exception(error)
            self._queue = None  # once
        return False, b""

    def feed_eof(self) -> None:
        self._parser.feed_eof()


def require_masked_frames(request: web.Request, ws: web.WebSocketResponse) -> bool:
    """Fail ``ws`` (1002) on the client's first unmasked frame; False if this aiohttp
    does not let us look."""
    return wrap_frame_parser(request, ws, _MaskedOnly)
