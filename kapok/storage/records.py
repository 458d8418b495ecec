"""The on-disk form of change records (pure: bytes in, records out).

Records travel in batches, one frame per batch::

    u32 length of the payload (little-endian)
    u32 CRC-32 of the payload
    payload: u8 kind (BATCH or END), then for a batch:
             u32 n, n bytes of JSON: one array per record, [type, field, ...],
             then the raw data of every Published record, back to back

Payloads stay binary (a Published row carries its data length, not its
data), and one JSON encoding and one CRC cover a whole batch: the WAL writes
one batch per append, so the per-record cost is a tuple, not a frame. The
WAL and the snapshots use the same frames; a snapshot ends with an ``END``
frame so that a cut-off snapshot can never pass for a complete one. A batch
is all or nothing: a torn write loses only batches whose acks were never sent.

Decoding stops at the first frame that is incomplete (a torn write) or
whose CRC or body is wrong (corruption), and reports the offset of the end
of the last good frame: recovery keeps everything before it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final, TypeVar

import orjson

from kapok.core import changes as ch
from kapok.errors import StorageError

__all__ = [
    "HEADER",
    "KINDS",
    "Decoded",
    "FrameReader",
    "batch_rows",
    "decode_frames",
    "decode_payload",
    "encode",
    "encode_all",
    "encode_batch",
    "encode_end",
    "encode_payload",
    "frame",
    "frame_header",
]

T = TypeVar("T")

HEADER: Final = struct.Struct("<II")
_U32: Final = struct.Struct("<I")
MAX_PAYLOAD: Final = 256 * 1024 * 1024

# Each record type's number: the first item of its row. Rows are this module's business,
# and the archive's (``kapok.storage.events`` reads rows, never records: it needs no data).
KINDS: Final[dict[type[Any], int]] = {
    ch.Published: 1,
    ch.GroupCreated: 2,
    ch.Delivered: 3,
    ch.Requeued: 4,
    ch.Settled: 5,
    ch.MessageDeleted: 6,
    ch.Deduped: 7,
    ch.Checkpoint: 8,
}
_CLASSES: Final = {code: cls for cls, code in KINDS.items()}
END_TYPE: Final = 255


def frame_header(payload: bytes) -> bytes:
    """The header of a payload's frame: its length and CRC-32."""
    return HEADER.pack(len(payload), zlib.crc32(payload))


def frame(payload: bytes) -> bytes:
    """The frame of a payload (from ``encode_payload``): header, then payload."""
    return frame_header(payload) + payload


# One row builder per type: explicit tuples are much cheaper than reflection.
_ROWS: Final[dict[type[Any], Callable[[Any], tuple[Any, ...]]]] = {
    ch.GroupCreated: lambda r: (
        (2, r.topic, r.group, r.at, r.start) if r.start else (2, r.topic, r.group, r.at)
    ),
    # Trailing fields are written only when set: a delivery naming its consumer has all 9
    # (claim "" and lease 0 when unclaimed), a claimed one without a consumer 8, any other
    # the 6 of records written before claims existed (the archive reads rows by length).
    ch.Delivered: lambda r: (
        (3, r.code, r.topic, r.group, r.attempts, r.at, r.claim, r.lease_s, r.consumer)
        if r.consumer
        else (3, r.code, r.topic, r.group, r.attempts, r.at, r.claim, r.lease_s)
        if r.claim
        else (3, r.code, r.topic, r.group, r.attempts, r.at)
    ),
    ch.Requeued: lambda r: (4, r.code, r.topic, r.group, r.reason, r.at, r.attempts),
    ch.Settled: lambda r: (5, r.code, r.topic, r.group, r.status, r.reason, r.at),
    ch.MessageDeleted: lambda r: (6, r.code, r.at, r.topic),
    ch.Deduped: lambda r: (7, r.topic, r.dedup_id, r.code, r.at),
    ch.Checkpoint: lambda r: (8, r.next_seq, r.at),
}
BATCH_TYPE: Final = 9


def encode_batch(records: Iterable[ch.Change]) -> bytes:
    """One frame holding ``records`` in order."""
    return frame(encode_payload(records))


def encode_payload(records: Iterable[ch.Change]) -> bytes:
    """The payload of a batch frame, without its header.

    The WAL encodes payloads on the event loop and frames them on its writer thread:
    ``zlib.crc32`` lets go of the GIL on large buffers, and the loop would then wait
    for it again behind whatever thread took it.
    """
    rows: list[tuple[Any, ...]] = []
    blobs: list[bytes] = []
    published = ch.Published
    for r in records:
        if type(r) is published:
            rows.append(
                (
                    1, r.seq, r.code, r.topic, r.key, r.priority, r.create_time, r.deliver_at,
                    r.expire_at, r.producer_id, r.dedup_id, r.headers, r.groups, len(r.data),
                )
            )  # fmt: skip
            blobs.append(r.data)
        else:
            rows.append(_ROWS[type(r)](r))
    meta = orjson.dumps(rows)
    return b"".join([bytes((BATCH_TYPE,)), _U32.pack(len(meta)), meta, *blobs])


def encode(record: ch.Change) -> bytes:
    """A frame of one record."""
    return encode_batch((record,))


def encode_all(records: Iterable[ch.Change]) -> bytes:
    """One frame per record (so that every record can be cut off on its own, e.g. in tests)."""
    return b"".join([encode(r) for r in records])


def encode_end() -> bytes:
    return frame(bytes((END_TYPE,)))


def batch_rows(payload: memoryview | bytes) -> list[Any]:
    """The rows of a batch payload as JSON decodes them, without building records.

    A row is ``[kind, field, ...]`` in the order of ``_ROWS`` (a Published row ends
    with the size of its data, which follows the rows in the payload).
    """
    if payload[0] != BATCH_TYPE:
        raise StorageError(f"unknown frame kind {payload[0]}")
    (n,) = _U32.unpack_from(payload, 1)
    rows = orjson.loads(payload[5 : 5 + n])
    if not isinstance(rows, list):
        raise StorageError("a batch must hold a list of records")
    return rows


def decode_payload(payload: memoryview | bytes) -> list[ch.Change]:
    """The records of one batch payload (what ``encode_payload`` made); ``StorageError``
    when it is not one."""
    try:
        return _decode_batch(memoryview(payload))
    except _UNDECODABLE as exc:
        raise StorageError(f"undecodable batch: {exc}") from None


def _decode_batch(payload: memoryview) -> list[ch.Change]:
    rows = batch_rows(payload)
    pos = 5 + _U32.unpack_from(payload, 1)[0]
    out: list[ch.Change] = []
    for row in rows:
        kind = row[0]
        if kind == 1:
            (
                _,
                seq,
                code,
                topic,
                key,
                prio,
                create,
                deliver,
                expire,
                producer,
                dedup,
                headers,
                groups,
                size,
            ) = row
            if not isinstance(size, int) or size < 0 or pos + size > len(payload):
                raise StorageError("a published record's data runs past its batch")
            data = bytes(payload[pos : pos + size])
            pos += size
            out.append(
                ch.Published(
                    seq, code, topic, data, key, prio, create, deliver, expire, producer, dedup, headers,
                    tuple(groups),
                )
            )  # fmt: skip
        else:
            cls = _CLASSES.get(kind)
            if cls is None or cls is ch.Published:
                raise StorageError(f"unknown record type {kind!r}")
            out.append(cls(*row[1:]))
    if pos != len(payload):
        raise StorageError("a batch has bytes left over")
    return out


_UNDECODABLE = (StorageError, ValueError, TypeError, IndexError, struct.error, orjson.JSONDecodeError)


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
        return chain.from_iterable(self._frames(_decode_batch))

    def rows(self) -> Iterator[Any]:
        """Iterate rows instead of records (``batch_rows``): the same checks, no records built."""
        return chain.from_iterable(self._frames(batch_rows))

    def _frames(self, decode: Callable[[memoryview], list[T]]) -> Iterator[list[T]]:
        """Each good frame's records, a list per frame (flattened in C by the callers)."""
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
            records: list[T] = []
            if self._decode:
                try:
                    records = decode(payload)
                except _UNDECODABLE as e:
                    self.problem = f"undecodable record at offset {pos}: {e}"
                    return
            pos = self.good_end = end
            self.count += len(records)
            yield records

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
