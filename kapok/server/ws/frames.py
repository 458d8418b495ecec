"""A client's WebSocket frames, parsed in bulk (RFC 6455, server side; pure: no I/O).

``ClientFrames.feed`` takes whatever the socket read and returns every message completed
by it, in order: text messages as ``str`` (UTF-8 checked), binary ones as ``bytes``, both
assembled from their fragments, and the control frames (ping, pong, close) as they come,
between fragments too. It enforces what a server must (§5): every client frame masked
(§5.1), no reserved bits (no extension is negotiated: the node never compresses), known
opcodes, control frames unfragmented and at most 125 bytes, continuation frames only
inside a fragmented message and nothing else there, a message no larger than the limit,
text that is UTF-8 (§8.1), close frames with a valid code and a UTF-8 reason (§7.4).
The first violation ends parsing: ``error`` holds the close code and reason to fail the
connection with, and nothing after it is read.

One call per socket read and a loop over its frames, with no object per frame beyond the
payload: KapokMQ clients send one small frame per message, so this replaces per-frame
machinery (a queue, a future and a task switch per frame) with a few operations each.
Unmasking is aiohttp's compiled routine when it is there, an integer XOR otherwise.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

__all__ = [
    "BINARY",
    "CLOSE",
    "PING",
    "PONG",
    "TEXT",
    "ClientFrames",
    "FrameError",
    "Message",
    "close_payload",
    "frame_extent",
    "server_frame",
    "server_header",
    "unmask_int",
]

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_KNOWN = frozenset((CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG))

# §7.4: codes an endpoint may send (1004-1006 and 1015 are reserved, 1016-2999 are for
# the protocol's own extensions, 3000-4999 for libraries and applications).
_SENDABLE = frozenset((1000, 1001, 1002, 1003, *range(1007, 1015)))

Message = tuple[int, "str | bytes | tuple[int, str]"]
"""(opcode, payload): TEXT → str, BINARY/PING/PONG → bytes, CLOSE → (code, reason), code 0 for none."""


class FrameError(Exception):
    """The client broke the protocol: fail the connection with ``code`` (§7.1.7)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


def frame_extent(data: bytes, pos: int) -> tuple[int, int]:
    """(header bytes, mask key included; payload bytes) of the frame at ``pos`` (§5.2).
    While its header is incomplete the payload is -1 and the header is the bytes needed."""
    left = len(data) - pos
    if left < 2:
        return 2, -1
    b1 = data[pos + 1]
    n = b1 & 0x7F
    head = 6 if b1 & 0x80 else 2
    if n < 126:
        return (head, n) if left >= head else (head, -1)
    head += 2 if n == 126 else 8
    if left < head:
        return head, -1
    return head, int.from_bytes(data[pos + 2 : pos + head - (4 if b1 & 0x80 else 0)], "big")


def unmask_int(mask: bytes, payload: bytes) -> bytes:
    """``payload`` XOR the repeated 4-byte ``mask`` (§5.3), as one integer operation."""
    n = len(payload)
    key = (mask * ((n >> 2) + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def _compiled_unmask() -> Callable[[bytes, bytes], bytes] | None:
    # aiohttp's C routine, in place on a bytearray: 0.19 µs for 110 bytes, against 0.51.
    from kapok.server.aiohttp_seam import compiled_unmask

    websocket_mask = compiled_unmask()
    if websocket_mask is None:
        return None

    def unmask(mask: bytes, payload: bytes) -> bytes:
        buf = bytearray(payload)
        websocket_mask(mask, buf)
        return bytes(buf)

    return unmask


_unmask: Callable[[bytes, bytes], bytes] = _compiled_unmask() or unmask_int


def close_payload(code: int, reason: str = "") -> bytes:
    """The payload of a close frame: the code, big-endian, then the reason (≤ 123 bytes)."""
    return code.to_bytes(2, "big") + reason.encode()[:123]


_SHORT = [[bytes((0x80 | opcode, n)) for n in range(126)] for opcode in range(16)]
_LEN16 = struct.Struct("!BBH").pack
_LEN64 = struct.Struct("!BBQ").pack


def server_header(opcode: int, length: int) -> bytes:
    """The header of a whole (FIN) server frame of ``length`` payload bytes (§5.2: a
    server never masks)."""
    if length < 126:
        return _SHORT[opcode][length]
    if length < 65536:
        return _LEN16(0x80 | opcode, 126, length)
    return _LEN64(0x80 | opcode, 127, length)


def server_frame(opcode: int, payload: bytes) -> bytes:
    """A whole server frame: header and payload."""
    return server_header(opcode, len(payload)) + payload


class ClientFrames:
    """The parser of one connection's client-to-server byte stream."""

    __slots__ = ("_fragments", "_fragments_size", "_need", "_opcode", "_parts", "_size", "error", "max_size")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size  # largest message, fragments joined (0: no limit)
        self.error: FrameError | None = None
        self._parts: list[bytes] = []  # bytes read but not parsed yet (an incomplete frame)
        self._size = 0  # their total length
        self._need = 0  # how long ``_parts`` must grow before the frame they start is complete
        self._opcode = CONTINUATION  # a fragmented message in progress: its opcode
        self._fragments: list[bytes] = []  # ... and its payloads so far
        self._fragments_size = 0

    def feed(self, data: bytes) -> list[Message]:
        """The messages ``data`` completes, in order (``[]`` once ``error`` is set)."""
        if self.error is not None:
            return []
        if self._parts:
            self._parts.append(data)
            self._size += len(data)
            if self._size < self._need:  # a large frame still arriving: join once, at its end
                return []
            data = b"".join(self._parts)
            self._parts = []
        out: list[Message] = []
        try:
            pos = self._parse(data, out)
        except FrameError as exc:
            self.error = exc
            return out
        if pos < len(data):
            rest = data[pos:]
            self._parts = [rest]
            self._size = len(rest)
        else:
            self._size = 0
        return out

    def _parse(self, data: bytes, out: list[Message]) -> int:
        """Append the complete messages of ``data`` to ``out``; returns where the first
        incomplete frame starts (``len(data)`` if none), with ``_need`` set for it."""
        end = len(data)
        pos = 0
        unmask = _unmask
        limit = self.max_size
        while True:
            left = end - pos
            if left < 2:
                self._need = 2
                return pos
            b0 = data[pos]
            b1 = data[pos + 1]
            if b0 == 0x81 and 0x80 < b1 < 0xFF and self._opcode == CONTINUATION:
                # The common frame, a whole masked text message under 64 KiB: the checks
                # below all pass for it (0.6 µs a frame instead of 1.0).
                if b1 == 0xFE:  # 16-bit length
                    if left < 4:
                        self._need = 4
                        return pos
                    n = data[pos + 2] << 8 | data[pos + 3]
                    head = pos + 8
                else:
                    n = b1 - 0x80
                    head = pos + 6
                stop = head + n
                if limit and n > limit:
                    raise FrameError(1009, f"message larger than {limit} bytes")
                if stop > end:
                    self._need = stop - pos
                    return pos
                try:
                    out.append((TEXT, unmask(data[head - 4 : head], data[head:stop]).decode()))
                except UnicodeDecodeError:
                    raise FrameError(1007, "text message is not valid UTF-8") from None
                pos = stop
                continue
            if not b1 & 0x80:
                raise FrameError(1002, "client frames must be masked")
            if b0 & 0x70:
                raise FrameError(1002, "reserved bits set (no extension was negotiated)")
            opcode = b0 & 0x0F
            n = b1 & 0x7F
            if opcode >= CLOSE:
                if not b0 & 0x80:
                    raise FrameError(1002, "fragmented control frame")
                if n > 125:
                    raise FrameError(1002, "control frame payload larger than 125 bytes")
                if opcode > PONG:
                    raise FrameError(1002, f"unknown opcode {opcode}")
            elif opcode not in _KNOWN:
                raise FrameError(1002, f"unknown opcode {opcode}")
            head, n = frame_extent(data, pos)
            if n < 0:
                self._need = head
                return pos
            if n >> 63:
                raise FrameError(1002, "frame length has its most significant bit set")
            if limit and opcode < CLOSE and n + self._fragments_size > limit:
                raise FrameError(1009, f"message larger than {limit} bytes")
            stop = pos + head + n
            if stop > end:
                self._need = head + n
                return pos
            mask = data[pos + head - 4 : pos + head]
            payload = unmask(mask, data[pos + head : stop]) if n else b""
            pos = stop
            if opcode >= CLOSE:
                out.append(_control(opcode, payload))
            elif b0 & 0x80:  # FIN: a whole message, or the last fragment of one
                out.append(self._message(opcode, payload))
            else:
                self._fragment(opcode, payload)

    def _message(self, opcode: int, payload: bytes) -> Message:
        if opcode == CONTINUATION:
            if self._opcode == CONTINUATION:
                raise FrameError(1002, "continuation frame outside a fragmented message")
            opcode, self._opcode = self._opcode, CONTINUATION
            self._fragments.append(payload)
            payload = b"".join(self._fragments)
            self._fragments = []
            self._fragments_size = 0
        elif self._opcode != CONTINUATION:
            raise FrameError(1002, "a new message began inside a fragmented one")
        if opcode == TEXT:
            try:
                return TEXT, payload.decode()
            except UnicodeDecodeError:
                raise FrameError(1007, "text message is not valid UTF-8") from None
        return BINARY, payload

    def _fragment(self, opcode: int, payload: bytes) -> None:
        if opcode == CONTINUATION:
            if self._opcode == CONTINUATION:
                raise FrameError(1002, "continuation frame outside a fragmented message")
        elif self._opcode != CONTINUATION:
            raise FrameError(1002, "a new message began inside a fragmented one")
        else:
            self._opcode = opcode
        self._fragments.append(payload)
        self._fragments_size += len(payload)


def _control(opcode: int, payload: bytes) -> Message:
    if opcode != CLOSE:
        return opcode, payload
    if not payload:
        return CLOSE, (0, "")
    if len(payload) == 1:
        raise FrameError(1002, "close frame payload of one byte")
    code = int.from_bytes(payload[:2], "big")
    if code not in _SENDABLE and not 3000 <= code <= 4999:
        raise FrameError(1002, f"invalid close code {code}")
    try:
        reason = payload[2:].decode()
    except UnicodeDecodeError:
        raise FrameError(1007, "close reason is not valid UTF-8") from None
    return CLOSE, (code, reason)
