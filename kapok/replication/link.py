"""One end of the sync WebSocket: JSON control frames as text, records and snapshot
chunks as binary, and when the other end was last heard from.

Both drivers talk through this class only, and both ends create theirs through the
node's ``link_factory`` (``ReplicationNode``: ``SyncLink`` itself unless the node is
assembled with another): the one place where a subclass (``kapok.testing.faults``) can
cut or slow the link in the partition tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

from aiohttp import WSCloseCode, WSMessage, WSMsgType

from kapok.clock import loop_time
from kapok.errors import ReplicationError
from kapok.protocol.sync import decode_control, encode_control
from kapok.replication.session import Frame, refused

__all__ = ["LinkFactory", "SyncLink", "WebSocket"]


class WebSocket(Protocol):
    """What the node's server socket and aiohttp's client WebSocket both offer."""

    @property
    def closed(self) -> bool: ...

    async def send_str(self, data: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def receive(self, timeout: float | None = None) -> WSMessage: ...

    async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"") -> bool: ...


class SyncLink:
    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.last_heard = loop_time()

    @property
    def closed(self) -> bool:
        return self.ws.closed

    async def send(self, frame: Frame) -> None:
        """A frame from a session (``kapok.replication.session``): control or binary."""
        if isinstance(frame, bytes):
            await self.send_binary(frame)
        else:
            await self.send_control(**frame)

    async def send_control(self, op: str, **fields: Any) -> None:
        await self.ws.send_str(encode_control(op, **fields).decode())

    async def send_binary(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def receive(self, timeout: float | None = None) -> Frame | None:
        """The next frame; None once the link is closed. ``TimeoutError`` past ``timeout``;
        ``ReplicationError`` for a frame that breaks the protocol."""
        msg = await self.ws.receive(timeout)
        if msg.type is WSMsgType.TEXT:
            self.last_heard = loop_time()
            return decode_control(msg.data)
        if msg.type is WSMsgType.BINARY:
            self.last_heard = loop_time()
            data: bytes = msg.data
            return data
        if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return None
        raise ReplicationError(f"unexpected WebSocket message {msg.type!r}")

    async def receive_control(self, op: str, timeout: float) -> dict[str, Any]:
        """The next frame, which must be the control frame ``op``."""
        frame = await self.receive(timeout)
        if frame is None:
            raise ConnectionResetError("the sync link closed")
        if isinstance(frame, bytes) or frame["op"] != op:
            if isinstance(frame, dict) and frame["op"] == "refused":
                raise refused(frame)
            shown = "a binary frame" if isinstance(frame, bytes) else repr(frame["op"])
            raise ReplicationError(f"expected {op!r}, got {shown}")
        return frame

    async def close(self, reason: str = "") -> None:
        if not self.ws.closed:
            await self.ws.close(code=WSCloseCode.GOING_AWAY, message=reason.encode()[:120])


LinkFactory: TypeAlias = Callable[[WebSocket], SyncLink]
"""Makes the link over an open WebSocket, at both ends: ``SyncLink`` or a subclass."""
