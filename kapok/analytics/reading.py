"""Reading the archive: a file's bytes → its events, its totals, and its events in buckets.

Runs inside Spark's tasks (``kapok.analytics.job``) and in tests, with no Spark:

* ``parse_lines``: a file's bytes → its rows (``EVENT_FIELDS``) and how many lines were
  no JSON object. Arrow's reader parses the whole file; a file with a line it refuses
  (the cut last line a crash leaves, a foreign line, a field of another type) is read
  again line by line, where such a line is skipped (not an object) or keeps the fields
  that have their type (an object). A row is an event when it has ``ev`` and ``t``.
* ``scan``: per file, what the job needs before the events: its line totals, first and
  last event time, and per topic × group the time of the group's first event.
* ``read_file``: both at once, for the job's one read of each file: its scan, and its
  events split into ``buckets`` by code (every event of a code in one bucket, in every
  file), each bucket one Arrow IPC stream. Spark then moves a few large values per file
  instead of a row per event.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from kapok.analytics.kinds import GROUP_KINDS

__all__ = [
    "BLOB_DDL",
    "EMPTY_EVENTS",
    "EVENT_FIELDS",
    "FileScan",
    "bucket_rows",
    "buckets",
    "events_of",
    "file_scan",
    "ipc_bytes",
    "ipc_table",
    "parse_lines",
    "read_events",
    "read_file",
    "scan",
]

# The fields the job reads, with their Arrow types (others in a line are ignored).
EVENT_FIELDS: Final = pa.schema(
    [
        ("ev", pa.string()),
        ("code", pa.string()),
        ("topic", pa.string()),
        ("group", pa.string()),
        ("t", pa.float64()),
        ("create_time", pa.float64()),
        ("deliver_at", pa.float64()),
        ("size", pa.int64()),
        ("attempt", pa.int32()),
        ("run", pa.string()),
        ("lsn", pa.int64()),
        ("consumer", pa.string()),
    ]
)
EMPTY_EVENTS: Final = EVENT_FIELDS.empty_table()
# ``read_file``'s rows: "scan" (``name``: the file, ``blob``: its pickled ``FileScan``) or
# "events" (``key``: the bucket, ``blob``: the bucket's events as an Arrow IPC stream).
BLOB_DDL: Final = "kind STRING, key LONG, name STRING, blob BINARY"
_BLOB_FIELDS: Final = pa.schema(
    [("kind", pa.string()), ("key", pa.int64()), ("name", pa.string()), ("blob", pa.binary())]
)
_READ: Final = pj.ReadOptions(use_threads=False, block_size=4 << 20)
_PARSE: Final = pj.ParseOptions(explicit_schema=EVENT_FIELDS, unexpected_field_behavior="ignore")
_IPC: Final = pa.ipc.IpcWriteOptions(compression="lz4")
_HASHED: Final = 32  # a code's last bytes that pick its bucket


def parse_lines(data: bytes) -> tuple[pa.Table, int]:
    """``data``'s rows (``EVENT_FIELDS``) and how many of its non-blank lines were no JSON object."""
    if not data.strip():
        return EMPTY_EVENTS, 0
    try:
        return pj.read_json(pa.BufferReader(data), read_options=_READ, parse_options=_PARSE), 0
    except pa.ArrowInvalid:
        return _parse_each(data)


def _parse_each(data: bytes) -> tuple[pa.Table, int]:
    """``parse_lines`` line by line: the objects' lines again through Arrow's reader, or,
    when it still refuses one (a field of another type), each field checked here."""
    lines: list[bytes] = []
    objects: list[dict[str, Any]] = []
    bad = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            bad += 1
            continue
        if isinstance(value, dict):
            lines.append(line)
            objects.append(value)
        else:
            bad += 1
    if not lines:
        return EMPTY_EVENTS, bad
    try:
        return pj.read_json(pa.BufferReader(b"\n".join(lines)), read_options=_READ, parse_options=_PARSE), bad
    except pa.ArrowInvalid:
        pass
    columns = {field.name: [_typed(o.get(field.name), field.type) for o in objects] for field in EVENT_FIELDS}
    return pa.table(columns, schema=EVENT_FIELDS), bad


def _typed(value: Any, kind: pa.DataType) -> Any:
    """``value`` if it has the field's type, else None (a number for a float is one)."""
    if pa.types.is_string(kind):
        return value if isinstance(value, str) else None
    if isinstance(value, bool):
        return None
    if pa.types.is_floating(kind):
        return float(value) if isinstance(value, int | float) else None
    bits = 31 if kind == pa.int32() else 63
    return value if isinstance(value, int) and -(2**bits) <= value < 2**bits else None


def _is_event(table: pa.Table) -> pa.ChunkedArray:
    return pc.and_(pc.is_valid(table["ev"]), pc.is_valid(table["t"]))


def read_events(data: bytes, from_t: float | None = None) -> pa.Table:
    """The events of one file's bytes (those at or after ``from_t``)."""
    table, _ = parse_lines(data)
    return _events(table, from_t)


def _events(table: pa.Table, from_t: float | None) -> pa.Table:
    events = table.filter(_is_event(table))
    return events if from_t is None else events.filter(pc.greater_equal(events["t"], from_t))


@dataclass(frozen=True, slots=True)
class FileScan:
    """One file's totals: lines that were no event, events (at or after ``since_t``; all),
    first and last event time; per (topic, group) the time of its first event."""

    skipped: int
    events: int
    all_events: int
    first_t: float | None
    last_t: float | None
    starts: dict[tuple[str, str], float]


def scan(data: bytes, since_t: float | None) -> FileScan:
    """``FileScan`` of one file's bytes."""
    table, bad = parse_lines(data)
    return _scan(table, bad, since_t)


def _scan(table: pa.Table, bad: int, since_t: float | None) -> FileScan:
    is_event = _is_event(table)
    events = table.filter(is_event)
    n = events.num_rows
    in_window = n if since_t is None else pc.sum(pc.greater_equal(events["t"], since_t)).as_py() or 0
    named = events.filter(
        pc.and_(
            pc.and_(pc.is_in(events["ev"], pa.array(GROUP_KINDS)), pc.is_valid(events["group"])),
            pc.and_(pc.is_valid(events["code"]), pc.is_valid(events["topic"])),
        )
    )
    starts = named.group_by(["topic", "group"], use_threads=False).aggregate([("t", "min")])
    bounds = pc.min_max(events["t"]).as_py() if n else {"min": None, "max": None}
    return FileScan(
        skipped=bad + table.num_rows - n,
        events=int(in_window),
        all_events=n,
        first_t=bounds["min"],
        last_t=bounds["max"],
        starts={
            (topic, group): t
            for topic, group, t in zip(
                starts["topic"].to_pylist(),
                starts["group"].to_pylist(),
                starts["t_min"].to_pylist(),
                strict=True,
            )
        },
    )


def buckets(codes: pa.ChunkedArray | pa.Array, n: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Each code's bucket of ``n``: a hash of its last ``_HASHED`` bytes, the same in every
    process (Python's own ``hash`` of a string is not); a null code's is 0."""
    array = codes.combine_chunks() if isinstance(codes, pa.ChunkedArray) else codes
    if len(array) == 0:
        return np.zeros(0, dtype=np.int64)
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[array.offset : array.offset + len(array) + 1]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)
        if data_buffer is not None and data_buffer.size
        else np.zeros(1, np.uint8)
    )
    starts, ends = offsets[:-1], offsets[1:]
    h = np.zeros(len(array), dtype=np.uint64)
    for back in range(1, _HASHED + 1):
        at = ends - back
        byte = np.where(at >= starts, data[np.clip(at, 0, len(data) - 1)], 0).astype(np.uint64)
        h = h * np.uint64(1_000_003) + byte
    out = (h % np.uint64(n)).astype(np.int64)
    if array.null_count:
        out[np.asarray(array.is_null())] = 0
    return out


def read_file(
    name: str, data: bytes, since_t: float | None, n: int, from_t: float | None = None
) -> pa.RecordBatch:
    """One file's ``BLOB_DDL`` rows: its scan, and its events (those at or after ``from_t``)
    in ``n`` buckets by code (none for 0)."""
    table, bad = parse_lines(data)
    rows: dict[str, list[Any]] = {
        "kind": ["scan"],
        "key": [0],
        "name": [name],
        "blob": [pickle.dumps(_scan(table, bad, since_t))],
    }
    for column, values in _bucket_columns(_events(table, from_t), n).items():
        rows[column] += values
    return pa.RecordBatch.from_pydict(rows, schema=_BLOB_FIELDS)


def bucket_rows(events: pa.Table, n: int) -> pa.RecordBatch:
    """``events`` (``EVENT_FIELDS``) as "events" rows of ``BLOB_DDL``, one per bucket of ``n``."""
    return pa.RecordBatch.from_pydict(_bucket_columns(events, n), schema=_BLOB_FIELDS)


def _bucket_columns(events: pa.Table, n: int) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {"kind": [], "key": [], "name": [], "blob": []}
    if events.num_rows and n:
        keys = buckets(events["code"], n)
        ordered = events.take(np.argsort(keys, kind="stable"))
        start = 0
        for key, size in enumerate(np.bincount(keys, minlength=n).tolist()):
            if size:
                rows["kind"].append("events")
                rows["key"].append(key)
                rows["name"].append(None)
                rows["blob"].append(ipc_bytes(ordered.slice(start, size)))
                start += size
    return rows


def file_scan(blob: bytes) -> FileScan:
    """The ``FileScan`` of a "scan" row's blob (pickled by this module in a task of this job)."""
    found = pickle.loads(blob)
    if not isinstance(found, FileScan):
        raise TypeError("not a file scan")
    return found


def events_of(blobs: Iterable[bytes]) -> pa.Table:
    """The events of "events" rows' blobs, as one table."""
    tables = [ipc_table(blob) for blob in blobs]
    return pa.concat_tables(tables) if tables else EMPTY_EVENTS


def ipc_bytes(table: pa.Table) -> bytes:
    """``table`` as an Arrow IPC stream (LZ4-compressed): how the job's tasks pass tables on."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_IPC) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def ipc_table(blob: bytes) -> pa.Table:
    """The table of an ``ipc_bytes`` stream."""
    return pa.ipc.open_stream(blob).read_all()
