"""The on-disk form of change records (pure: bytes in, records out).

Every record is one frame::

    u32 length of the payload (little-endian)
    u32 CRC-32 of the payload
    payload: u8 record type, then the body

A ``Published`` body is ``u32 n`` + ``n`` bytes of JSON metadata + the raw
message data (payloads stay binary, never base64); every other body is a
JSON array of the record's fields in declaration order. The WAL and the
snapshots use the same frames; a snapshot ends with an ``END`` frame so that
a cut-off snapshot can never pass for a complete one.

Decoding stops at the first frame that is incomplete (a torn write) or
whose CRC or body is wrong (corruption), and reports the offset of the end
of the last good frame: recovery keeps everything before it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Final

import orjson

from kapok.core import changes as ch
from kapok.errors import StorageError

__all__ = ["END", "HEADER", "Decoded", "FrameReader", "decode_frames", "encode", "encode_all", "encode_end"]

HEADER: Final = struct.Struct("<II")
_U32: Final = struct.Struct("<I")
MAX_PAYLOAD: Final = 256 * 1024 * 1024

_TYPES: Final[dict[type[Any], int]] = {
    ch.Published: 1,
    ch.GroupCreated: 2,
    ch.Delivered: 3,
    ch.Requeued: 4,
    ch.Settled: 5,
    ch.MessageDeleted: 6,
    ch.Deduped: 7,
    ch.Checkpoint: 8,
}
_CLASSES: Final = {code: cls for cls, code in _TYPES.items()}
_FIELDS: Final = {cls: tuple(f.name for f in fields(cls)) for cls in _TYPES}
END_TYPE: Final = 255


class _End:
    """The marker that closes a snapshot."""

    def __repr__(self) -> str:
        return "END"


END: Final = _End()


def _frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def encode(record: ch.Change) -> bytes:
    kind = _TYPES[type(record)]
    if isinstance(record, ch.Published):
        meta = orjson.dumps(
            [
                record.seq, record.code, record.topic, record.key, record.priority, record.create_time,
                record.deliver_at, record.expire_at, record.producer_id, record.dedup_id, record.headers,
                record.groups,
            ]
        )  # fmt: skip
        return _frame(bytes((kind,)) + _U32.pack(len(meta)) + meta + record.data)
    body = orjson.dumps([getattr(record, name) for name in _FIELDS[type(record)]])
    return _frame(bytes((kind,)) + body)


def encode_all(records: Iterable[ch.Change]) -> bytes:
    return b"".join([encode(r) for r in records])


def encode_end() -> bytes:
    return _frame(bytes((END_TYPE,)))


def _decode_payload(payload: bytes) -> ch.Change | _End:
    kind = payload[0]
    if kind == END_TYPE:
        return END
    cls = _CLASSES.get(kind)
    if cls is None:
        raise StorageError(f"unknown record type {kind}")
    if cls is ch.Published:
        (n,) = _U32.unpack_from(payload, 1)
        meta = orjson.loads(payload[5 : 5 + n])
        seq, code, topic, key, priority, create, deliver, expire, producer, dedup, headers, groups = meta
        return ch.Published(
            seq, code, topic, payload[5 + n :], key, priority, create, deliver, expire, producer, dedup,
            headers, tuple(groups),
        )  # fmt: skip
    values = orjson.loads(payload[1:])
    record: ch.Change = cls(*values)
    return record


class FrameReader:
    """Iterates the records of a buffer (bytes or an mmap) one by one, without copying it.

    After the iteration, ``good_end`` is the offset just past the last good frame,
    ``problem`` says why reading stopped early (``None``: the buffer ended on a frame
    boundary, or at an END frame), and ``ended`` whether an END frame was read.
    """

    def __init__(self, buf: bytes | memoryview | Any, start: int = 0, *, decode: bool = True) -> None:
        self._view = memoryview(buf)
        self._decode = decode
        self.good_end = start
        self.problem: str | None = None
        self.ended = False
        self.count = 0

    def __iter__(self) -> Iterator[ch.Change]:
        view = self._view
        pos = self.good_end
        size = len(view)
        header = HEADER.size
        while pos < size:
            if size - pos < header:
                self.problem = f"torn frame header at offset {pos}"
                return
            length, crc = HEADER.unpack_from(view, pos)
            if length == 0 or length > MAX_PAYLOAD:
                self.problem = f"impossible frame length {length} at offset {pos}"
                return
            end = pos + header + length
            if end > size:
                self.problem = f"torn frame at offset {pos} ({size - pos - header} of {length} bytes)"
                return
            payload = view[pos + header : end]
            if zlib.crc32(payload) != crc:
                self.problem = f"CRC mismatch at offset {pos}"
                return
            if payload[0] == END_TYPE:
                self.good_end = end
                self.ended = True
                return
            if self._decode:
                try:
                    record = _decode_payload(bytes(payload))
                except (StorageError, ValueError, TypeError, struct.error, orjson.JSONDecodeError) as exc:
                    self.problem = f"undecodable record at offset {pos}: {exc}"
                    return
            pos = self.good_end = end
            self.count += 1
            if self._decode and not isinstance(record, _End):
                yield record

    def check(self) -> FrameReader:
        """Walk the frames checking lengths and CRCs only (no decoding); returns self."""
        self._decode = False
        for _ in self:
            pass
        return self


@dataclass(frozen=True, slots=True)
class Decoded:
    """What ``decode_frames`` found: the records, where the good part ends, and why it ended."""

    records: list[ch.Change]
    good_end: int  # offset just past the last good frame
    problem: str | None  # None: the buffer ended exactly on a frame boundary (or an END frame)
    ended: bool = False  # an END frame was read (decoding stops there)


def decode_frames(buf: bytes | memoryview, start: int = 0) -> Decoded:
    """All records of ``buf`` at once (tests, small files); recovery streams with ``FrameReader``."""
    reader = FrameReader(buf, start)
    records = list(reader)
    return Decoded(records, reader.good_end, reader.problem, reader.ended)
