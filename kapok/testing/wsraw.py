"""WebSocket frames and an upgrade request written by hand, for tests that need exact bytes
on the wire (masking, fragmentation, control frames, violations of RFC 6455)."""

from __future__ import annotations

from kapok.server.ws.frames import unmask_int

__all__ = ["client_frame", "upgrade_request"]


def client_frame(
    opcode: int, payload: bytes, *, fin: bool = True, mask: bytes | None = b"\x5a\xa5\x0f\xf0", rsv: int = 0
) -> bytes:
    """One frame as a client writes it: masked with ``mask`` (None: unmasked, a violation)."""
    n = len(payload)
    first = (0x80 if fin else 0) | rsv << 4 | opcode
    masked = 0x80 if mask is not None else 0
    if n < 126:
        head = bytes((first, masked | n))
    elif n < 65536:
        head = bytes((first, masked | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((first, masked | 127)) + n.to_bytes(8, "big")
    if mask is None:
        return head + payload
    return head + mask + unmask_int(mask, payload)  # masking is its own inverse


def upgrade_request(path: str) -> bytes:
    """A client's opening handshake for ``path`` (a fixed key: the tests do not check the accept)."""
    return (
        f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n".encode()
        + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
