"""Import a KapokMQ data directory (``MQDATA`` + ``WAL.log``) as Kapok change records.

KapokMQ keeps two files (reference spec §5.1–5.3):

* ``MQDATA``, the snapshot: one Go ``encoding/gob`` value of type ``[]byte``
  wrapping a JSON object ``{MessageCode: Message}`` of the unconsumed
  messages. The gob stream is ``uint(message length)``, ``int(type id 5)``
  (the byte ``0x0A``), the singleton field delta ``0x00``, ``uint(n)`` and
  the ``n`` JSON bytes. KapokMQ writes it in place, so it may be empty (a
  fresh node) or cut off (a crash during a snapshot).
* ``WAL.log``: one JSON Message per line, each the message's full new state;
  the last record of a code wins. KapokMQ turns every unparsable line,
  including the empty string after the final newline, into a phantom
  zero-valued message under the code ``""``; here blank lines are ignored
  and bad lines are counted and skipped, so no phantom is ever imported.

Messages use Go's PascalCase fields: ``MessageCode``, ``MessageData``,
``Topic``, ``CreateTime``, ``ConsumedTime``, ``DelayTime`` (seconds) and
``Status`` (-1 pending, 0 delayed, 1 consumed).

Parsing and translation are pure (``unwrap_gob_bytes``, ``check_message``,
``kapokmq_records``); only ``read_kapokmq_dir`` touches the disk. An import is an operator's explicit
act, so the reader is tolerant of what KapokMQ itself produces (missing
snapshot, phantom lines, a gob header that is slightly off) but refuses a
snapshot it cannot read at all rather than silently importing less.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from kapok.core import changes as ch
from kapok.core.model import Status
from kapok.core.topics import DEFAULT_GROUP
from kapok.errors import StorageError

__all__ = [
    "ImportResult",
    "check_message",
    "kapokmq_records",
    "read_gob_uint",
    "read_kapokmq_dir",
    "unwrap_gob_bytes",
]

SNAPSHOT_NAME: Final = "MQDATA"  # KapokMQ's default mq.persistentFile
WAL_NAME: Final = "WAL.log"  # fixed in KapokMQ
GOB_BYTES_TYPE_ID: Final = 5  # gob's predefined type id of []byte
MAX_PROBLEMS: Final = 100  # problems listed one by one; the rest are only counted

Message = dict[str, Any]

_DEFAULTS: Final[Message] = {
    "MessageCode": "",
    "MessageData": "",
    "Topic": "",
    "CreateTime": 0,
    "ConsumedTime": 0,
    "DelayTime": 0,
    "Status": 0,
}
_STRING_FIELDS: Final = ("MessageCode", "MessageData", "Topic")
_INT_FIELDS: Final = ("CreateTime", "ConsumedTime", "DelayTime", "Status")


# ---------------------------------------------------------------------------------------
# gob


def read_gob_uint(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode the gob unsigned integer at ``pos``; return it and the position after it.

    Below 128 a uint is one byte; otherwise one byte holding the negated byte
    count (0xFF = 1 byte, 0xFE = 2, ...) and then the value, big-endian.
    """
    if pos >= len(buf):
        raise ValueError(f"gob uint at offset {pos}: end of data")
    first = buf[pos]
    if first < 0x80:
        return first, pos + 1
    count = 256 - first
    if count > 8:
        raise ValueError(f"gob uint at offset {pos}: bad length byte 0x{first:02x}")
    end = pos + 1 + count
    if end > len(buf):
        raise ValueError(f"gob uint at offset {pos}: cut off")
    return int.from_bytes(buf[pos + 1 : end], "big"), end


def _read_gob_int(buf: bytes, pos: int) -> tuple[int, int]:
    # A gob int is a uint whose low bit says "complemented": 5 -> 10 (0x0A).
    u, pos = read_gob_uint(buf, pos)
    return (~(u >> 1) if u & 1 else u >> 1), pos


def unwrap_gob_bytes(data: bytes) -> bytes:
    """The payload of a gob stream holding exactly one ``[]byte`` value; ``ValueError`` otherwise."""
    length, pos = read_gob_uint(data, 0)
    end = pos + length
    if end != len(data):
        raise ValueError(f"gob message says {length} bytes, the file has {len(data) - pos}")
    type_id, pos = _read_gob_int(data, pos)
    if type_id != GOB_BYTES_TYPE_ID:
        raise ValueError(f"gob type id {type_id}, expected {GOB_BYTES_TYPE_ID} ([]byte)")
    if pos >= end or data[pos] != 0:
        raise ValueError("gob singleton field delta 0x00 missing")
    n, pos = read_gob_uint(data, pos + 1)
    if pos + n != end:
        raise ValueError(f"gob []byte says {n} bytes, the message has {end - pos}")
    return data[pos:end]


# ---------------------------------------------------------------------------------------
# Messages


def check_message(obj: object) -> Message | str:
    """The message with Go's zero values filled in, or why it is unusable.

    Go's decoder would fill missing fields with zero values too; what is
    present must have the type KapokMQ writes (a float or a bool is not an
    int64), codes and topics must be non-empty, Status one of -1, 0, 1.
    """
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    msg = {name: obj.get(name, default) for name, default in _DEFAULTS.items()}
    for name in _STRING_FIELDS:
        if not isinstance(msg[name], str):
            return f"{name} is not a string"
    for name in _INT_FIELDS:
        value = msg[name]
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{name} is not an integer"
    if not msg["MessageCode"]:
        return "empty MessageCode"
    if not msg["Topic"]:
        return f"message {msg['MessageCode']}: empty Topic"
    if msg["Status"] not in (-1, 0, 1):
        return f"message {msg['MessageCode']}: Status {msg['Status']} is not -1, 0 or 1"
    return msg


class _Problems:
    """Problem notes, bounded: a garbage WAL must not become a garbage report."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.extra = 0

    def add(self, note: str) -> None:
        if len(self.notes) < MAX_PROBLEMS:
            self.notes.append(note)
        else:
            self.extra += 1

    def final(self) -> list[str]:
        return [*self.notes, f"... and {self.extra} more"] if self.extra else self.notes


def _decode_snapshot(data: bytes, name: str, problems: _Problems) -> tuple[dict[str, Message], int]:
    """Messages of a snapshot's bytes and how many entries were skipped.

    Empty data is an empty snapshot. When the gob framing does not match,
    the JSON object is taken from between the first ``{`` and the last ``}``.
    """
    if not data.strip():
        return {}, 0
    try:
        payload = unwrap_gob_bytes(data)
    except ValueError as gob_error:
        start, end = data.find(b"{"), data.rfind(b"}")
        if start < 0 or end < start:
            raise StorageError(
                f"not a KapokMQ snapshot: bad gob framing ({gob_error}) and no JSON object"
            ) from None
        problems.add(f"{name}: bad gob framing ({gob_error}); used the JSON object inside")
        payload = data[start : end + 1]
    try:
        table = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise StorageError(
            f"unreadable KapokMQ snapshot (KapokMQ rewrites it in place, so a crash can cut it off): "
            f"{exc}; move it aside to import {WAL_NAME} alone"
        ) from None
    if not isinstance(table, dict):
        raise StorageError(f"expected a JSON object of messages in the snapshot, got {type(table).__name__}")
    messages: dict[str, Message] = {}
    skipped = 0
    for key, value in table.items():
        msg = check_message(value)
        if isinstance(msg, str):
            skipped += 1
            problems.add(f"{name} entry {key!r}: {msg}; skipped")
            continue
        if msg["MessageCode"] != key:
            problems.add(f"{name} entry {key!r} holds message {msg['MessageCode']}; kept that code")
        messages[msg["MessageCode"]] = msg
    return messages, skipped


@dataclass(slots=True)
class _WalContent:
    messages: dict[str, Message]  # last record per code
    lines: int  # non-blank lines
    skipped: int  # of those, unparsable or invalid


def _parse_wal(data: bytes, problems: _Problems) -> _WalContent:
    content = _WalContent({}, 0, 0)
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue  # KapokMQ's phantom "" record comes from these
        content.lines += 1
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            content.skipped += 1
            problems.add(f"{WAL_NAME} line {number}: not JSON; skipped")
            continue
        msg = check_message(obj)
        if isinstance(msg, str):
            content.skipped += 1
            problems.add(f"{WAL_NAME} line {number}: {msg}; skipped")
            continue
        content.messages[msg["MessageCode"]] = msg
    return content


# ---------------------------------------------------------------------------------------
# Records


def kapokmq_records(
    messages: Iterable[Message], *, first_seq: int, default_group: str = DEFAULT_GROUP
) -> list[ch.Change]:
    """Kapok change records that recreate ``messages`` in a broker.

    Each message becomes a ``Published`` into ``default_group`` that keeps
    its KapokMQ code, with sequence numbers from ``first_seq`` in creation
    order (ties keep the input order); consumed ones (Status 1) are then
    ``Settled`` as consumed at their ConsumedTime (CreateTime when it is 0).
    A negative DelayTime, which KapokMQ treats as "now", is clamped to 0.
    The caller must move its next sequence number past the last one used.
    ``StorageError`` on an invalid message or a repeated code.
    """
    checked: list[Message] = []
    seen: set[str] = set()
    for obj in messages:
        msg = check_message(obj)
        if isinstance(msg, str):
            raise StorageError(f"not an importable KapokMQ message: {msg}")
        if msg["MessageCode"] in seen:
            raise StorageError(f"KapokMQ message {msg['MessageCode']} given twice")
        seen.add(msg["MessageCode"])
        checked.append(msg)
    checked.sort(key=lambda m: m["CreateTime"])  # stable
    records: list[ch.Change] = []
    for seq, msg in enumerate(checked, first_seq):
        code, topic, created = msg["MessageCode"], msg["Topic"], float(msg["CreateTime"])
        records.append(
            ch.Published(
                seq=seq,
                code=code,
                topic=topic,
                data=msg["MessageData"].encode(),
                key="",
                priority=0,
                create_time=created,
                deliver_at=created + max(msg["DelayTime"], 0),
                expire_at=0.0,
                producer_id="",
                dedup_id="",
                headers=None,
                groups=(default_group,),
            )
        )
        if msg["Status"] == 1:
            at = float(msg["ConsumedTime"] or msg["CreateTime"])
            records.append(ch.Settled(code, topic, default_group, Status.CONSUMED.value, "imported", at))
    return records


# ---------------------------------------------------------------------------------------
# The directory


@dataclass(slots=True)
class ImportResult:
    messages: list[Message]  # snapshot overlaid by the WAL, one per code
    snapshot_count: int  # valid messages in MQDATA
    wal_lines: int  # non-blank lines in WAL.log
    wal_skipped: int  # of those, unparsable or invalid
    problems: list[str] = field(default_factory=list)  # human-readable notes, bounded
    snapshot_skipped: int = 0  # invalid entries in MQDATA


def read_kapokmq_dir(path: Path | str, *, snapshot_name: str = SNAPSHOT_NAME) -> ImportResult:
    """Read a KapokMQ data directory: the snapshot, overlaid by the WAL (last record wins).

    A missing or empty snapshot or WAL is fine (KapokMQ creates an empty
    MQDATA at startup, and keeps no WAL unless ``isPersistent`` is 2), but a
    directory with neither is most likely the wrong one and is refused.
    """
    directory = Path(path)
    if not directory.is_dir():
        raise StorageError(f"KapokMQ data directory {directory} does not exist or is not a directory")
    snapshot = _read_optional(directory / snapshot_name)
    wal = _read_optional(directory / WAL_NAME)
    if snapshot is None and wal is None:
        raise StorageError(
            f"{directory} holds neither {snapshot_name} nor {WAL_NAME}: not a KapokMQ data directory"
        )
    problems = _Problems()
    try:
        messages, snapshot_skipped = _decode_snapshot(snapshot or b"", snapshot_name, problems)
    except StorageError as exc:
        raise StorageError(f"{directory / snapshot_name}: {exc.message}") from exc
    snapshot_count = len(messages)
    content = _parse_wal(wal or b"", problems)
    messages.update(content.messages)
    return ImportResult(
        messages=list(messages.values()),
        snapshot_count=snapshot_count,
        wal_lines=content.lines,
        wal_skipped=content.skipped,
        problems=problems.final(),
        snapshot_skipped=snapshot_skipped,
    )


def _read_optional(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc
