"""The master/slave link's frames (``/sync/v1``, a WebSocket opened by the follower).

Control frames are JSON objects with an ``op`` (``OPS`` lists every one): the follower's
``hello`` (its name, epoch, epoch history and log end), the leader's ``start`` (``resume``
from an LSN, or ``full``: a snapshot first, ended by ``snapshot_end``), ``ack`` (the LSN
the follower made durable), ``ping`` both ways (epoch, log end, time), ``handover``,
``promoted`` and ``refused``. Binary frames carry data: ``R`` + first LSN (8 bytes) +
count (4 bytes) + one WAL batch payload, exactly as the leader's WAL wrote it, and ``S`` +
a snapshot frame as a snapshot file holds it. What the frames mean to each end is
``kapok.replication.session``'s.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import orjson

from kapok.errors import BadRequestError, ReplicationError
from kapok.protocol import fields

__all__ = [
    "MAX_CONTROL_BYTES",
    "OPS",
    "RECORDS",
    "SNAPSHOT",
    "decode_control",
    "decode_records",
    "encode_control",
    "encode_records",
    "get_int",
    "get_str",
]

RECORDS: Final = b"R"
SNAPSHOT: Final = b"S"
_RECORDS_HEAD: Final = struct.Struct(">QI")

OPS: Final = frozenset({"hello", "start", "snapshot_end", "ack", "ping", "handover", "promoted", "refused"})
MAX_CONTROL_BYTES: Final = 64 * 1024
_MAX_U64: Final = 2**64 - 1


def encode_control(op: str, **fields: Any) -> bytes:
    return orjson.dumps({"op": op, **fields})


def decode_control(raw: str | bytes) -> dict[str, Any]:
    if len(raw) > MAX_CONTROL_BYTES:
        raise ReplicationError("control frame too large")
    try:
        frame = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ReplicationError("control frame is not JSON") from None
    if not isinstance(frame, dict) or frame.get("op") not in OPS:
        raise ReplicationError(f"unknown control frame {str(raw)[:80]!r}")
    return frame


def encode_records(first_lsn: int, count: int, payload: bytes) -> bytes:
    return RECORDS + _RECORDS_HEAD.pack(first_lsn, count) + payload


def decode_records(frame: bytes) -> tuple[int, int, memoryview]:
    """``(first LSN, count, payload)`` of an ``R`` frame."""
    head = _RECORDS_HEAD.size + 1
    if len(frame) < head or frame[:1] != RECORDS:
        raise ReplicationError("not a records frame")
    first_lsn, count = _RECORDS_HEAD.unpack_from(frame, 1)
    if count < 1:
        raise ReplicationError("a records frame without records")
    return first_lsn, count, memoryview(frame)[head:]


def get_int(frame: dict[str, Any], name: str) -> int:
    """A control frame's non-negative integer field (LSNs, epochs)."""
    try:
        return fields.get_int(frame, name, lo=0, hi=_MAX_U64)
    except BadRequestError as exc:
        raise ReplicationError(f"{frame.get('op')}: {exc.message}") from None


def get_str(frame: dict[str, Any], name: str, default: str | None = None) -> str:
    try:
        return fields.get_str(frame, name, default, max_len=MAX_CONTROL_BYTES)
    except BadRequestError as exc:
        raise ReplicationError(f"{frame.get('op')}: {exc.message}") from None
