"""The job's per-event work, in Arrow and plain Python inside Spark's tasks.

Spark's JSON reader and generated code cost 120 CPU-seconds per million archived events
on two cores, most of it compiling and running code per row (docs/benchmarks.md); the
same work in Arrow kernels and one Python loop a message costs a tenth of that. So Spark
only distributes: it hands each task the bytes of its archive files (``binaryFile``,
which reads every file system Spark does, with its credentials), shuffles the events
by code and the durations by topic × metric, and writes the small results. Everything
here is pure functions over ``pyarrow`` tables and Python values, with no Spark, so it
runs in any executor and is tested without a JVM. The rules are those of
``kapok.analytics.transforms`` and ``kapok.analytics.lifecycle``'s docstrings.

The steps, each a function below:

* ``parse_lines``: a file's bytes → its rows (``EVENT_FIELDS``) and how many lines were
  no JSON object. Arrow's reader parses the whole file; a file with a line it refuses
  (the cut last line a crash leaves, a foreign line, a field of another type) is read
  again line by line, where such a line is skipped (not an object) or keeps the fields
  that have their type (an object). A row is an event when it has ``ev`` and ``t``.
* ``scan``: per file, what the job needs before the events: its line totals, first and
  last event time, and per topic × group the time of the group's first event.
* ``lives``: per partition of the events shuffled by code: each event once
  (``unique``), the counts per topic × group × window, each entry's walk (backlog
  changes and unacked spans, merged per topic × group × window) and its durations.
* ``stats``: per partition of the durations shuffled by topic × metric: exact
  percentiles (nearest rank), max, count and histogram per window and overall.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from kapok.analytics.kinds import GROUP_KINDS, HIST_BOUNDS_MS, PERCENTILES, SUMS
from kapok.analytics.lifecycle import Lives
from kapok.analytics.transforms import BacklogRow, CountRow, StatRow
from kapok.analytics.unique import unique

__all__ = [
    "EMPTY_EVENTS",
    "EVENT_FIELDS",
    "OUT_DDL",
    "Figures",
    "FileScan",
    "decode",
    "figures_of",
    "lives",
    "merge_starts",
    "parse_lines",
    "read_events",
    "scan",
    "stats",
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
    ]
)
EMPTY_EVENTS: Final = EVENT_FIELDS.empty_table()
EVENT_DDL: Final = (
    "ev STRING, code STRING, topic STRING, `group` STRING, t DOUBLE, create_time DOUBLE, deliver_at DOUBLE, "
    "size LONG, attempt INT, run STRING, lsn LONG"
)
# The rows ``lives`` and ``stats`` give Spark (DDL): ``kind`` says which: "n" (events in
# the window: ``value``), "c" (counts), "b" (backlog parts), "v" (a duration), "s" (a
# duration's stats); the small kinds carry their figures as JSON in ``data``.
OUT_DDL: Final = "kind STRING, topic STRING, metric STRING, window_t LONG, value DOUBLE, data STRING"
OUT_FIELDS: Final = pa.schema(
    [
        ("kind", pa.string()),
        ("topic", pa.string()),
        ("metric", pa.string()),
        ("window_t", pa.int64()),
        ("value", pa.float64()),
        ("data", pa.string()),
    ]
)
_DAY_S: Final = 86400
_READ: Final = pj.ReadOptions(use_threads=False, block_size=4 << 20)
_PARSE: Final = pj.ParseOptions(explicit_schema=EVENT_FIELDS, unexpected_field_behavior="ignore")
_EPOCH_DAY: Final = date(1970, 1, 1).toordinal()
_CHUNK: Final = 200_000  # events walked at a time (at code boundaries): bounded Python memory

# ---------------------------------------------------------------------------------------
# Reading


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


def read_events(data: bytes) -> pa.Table:
    """The events of one file's bytes."""
    table, _ = parse_lines(data)
    return table.filter(_is_event(table))


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


# ---------------------------------------------------------------------------------------
# Per partition of events by code


def _window(t: pa.ChunkedArray | pa.Array, window_s: int) -> pa.Array:
    return pc.multiply(pc.cast(pc.floor(pc.divide(t, float(window_s))), pa.int64()), window_s)


def _row(
    kind: str, topic: Any, window_t: Any = None, value: Any = None, metric: Any = None, data: Any = None
) -> dict[str, Any]:
    return {
        "kind": kind,
        "topic": topic,
        "metric": metric,
        "window_t": window_t,
        "value": value,
        "data": None if data is None else orjson.dumps(data).decode(),
    }


def _counts(events: pa.Table, window_s: int) -> list[dict[str, Any]]:
    """Per topic × group × window the ``SUMS`` of ``events`` (rows of kind "c")."""
    events = events.filter(pc.is_valid(events["topic"]))
    if events.num_rows == 0:
        return []
    published = pc.equal(events["ev"], "published")
    again = pc.and_(pc.equal(events["ev"], "delivered"), pc.greater(events["attempt"], 1))
    keyed = pa.table(
        {
            "topic": events["topic"],
            "group": events["group"],
            "window_t": _window(events["t"], window_s),
            "ev": events["ev"],
            "bytes": pc.if_else(published, pc.coalesce(events["size"], 0), 0),
            "again": pc.cast(pc.fill_null(again, False), pa.int64()),
        }
    )
    grouped = keyed.group_by(["topic", "group", "window_t", "ev"], use_threads=False).aggregate(
        [("ev", "count"), ("bytes", "sum"), ("again", "sum")]
    )
    sums: dict[tuple[str, str | None, int], list[int]] = {}
    index = {name: i for i, name in enumerate(SUMS)}
    for row in grouped.to_pylist():
        figures = sums.setdefault((row["topic"], row["group"], row["window_t"]), [0] * len(SUMS))
        if row["ev"] in index:
            figures[index[row["ev"]]] += row["ev_count"]
        figures[index["bytes"]] += row["bytes_sum"] or 0
        figures[index["redelivered"]] += row["again_sum"] or 0
    return [
        _row("c", topic, window_t, data=[group, figures])
        for (topic, group, window_t), figures in sums.items()
    ]


def lives(
    batches: Iterable[pa.RecordBatch],
    *,
    window_s: int,
    since_t: float | None,
    days: Sequence[str] | None,
    starts: Mapping[str, Mapping[str, float]],
) -> Iterator[pa.RecordBatch]:
    """One partition of events (all of a code's in one partition) → rows of ``OUT_DDL``:
    "n" (the unique events at or after ``since_t``), "c", "b" and "v" (durations at or
    after ``since_t``); ``days`` (``YYYY-MM-DD``) limits the counts. ``starts``: per topic,
    per group, the time of the group's first event in the whole input."""
    parts = list(batches)
    table = pa.Table.from_batches(parts, schema=EVENT_FIELDS) if parts else EMPTY_EVENTS
    events = unique(table)
    recent = events if since_t is None else events.filter(pc.greater_equal(events["t"], since_t))
    yield pa.RecordBatch.from_pylist([_row("n", None, value=float(recent.num_rows))], schema=OUT_FIELDS)
    counted = recent
    if days is not None:
        day = pc.cast(pc.floor(pc.divide(counted["t"], float(_DAY_S))), pa.int64())
        counted = counted.filter(pc.is_in(day, pa.array([_day_number(d) for d in days], pa.int64())))
    counts = _counts(counted, window_s)
    if counts:
        yield pa.RecordBatch.from_pylist(counts, schema=OUT_FIELDS)
    found = Lives(window_s, since_t, starts)
    known = events.filter(pc.and_(pc.is_valid(events["code"]), pc.is_valid(events["topic"])))
    for chunk in _code_chunks(known.sort_by("code")):
        codes, evs, topics, groups, ts, creates, delivers, attempts = (
            chunk[name].to_pylist()
            for name in ("code", "ev", "topic", "group", "t", "create_time", "deliver_at", "attempt")
        )
        n = len(codes)
        i = 0
        while i < n:
            j = i + 1
            while j < n and codes[j] == codes[i]:
                j += 1
            found.message(evs, topics, groups, ts, creates, delivers, attempts, i, j)
            i = j
        if len(found.values) >= _CHUNK:
            yield _values(found)
    yield _values(found)
    backlog = [
        _row("b", topic, window_t, data=[group, *parts])
        for (topic, group, window_t), parts in found.backlog.items()
    ]
    if backlog:
        yield pa.RecordBatch.from_pylist(backlog, schema=OUT_FIELDS)


def _values(found: Lives) -> pa.RecordBatch:
    """The durations ``found`` gathered so far, as "v" rows (and forgotten there)."""
    values, found.values = found.values, []
    topics, metrics, windows, ms = zip(*values, strict=True) if values else ((), (), (), ())
    return pa.RecordBatch.from_pydict(
        {
            "kind": pa.array(["v"] * len(values), pa.string()),
            "topic": pa.array(topics, pa.string()),
            "metric": pa.array(metrics, pa.string()),
            "window_t": pa.array(windows, pa.int64()),
            "value": pa.array(ms, pa.float64()),
            "data": pa.nulls(len(values), pa.string()),
        },
        schema=OUT_FIELDS,
    )


def _day_number(day: str) -> int:
    """Days since 1970-01-01 of a ``YYYY-MM-DD`` date."""
    return date.fromisoformat(day).toordinal() - _EPOCH_DAY


def _code_chunks(ordered: pa.Table) -> Iterator[pa.Table]:
    """``ordered`` (sorted by code) in slices of about ``_CHUNK`` rows that split no code."""
    n = ordered.num_rows
    codes = ordered["code"]
    start = 0
    while start < n:
        end = min(n, start + _CHUNK)
        while end < n and codes[end].as_py() == codes[end - 1].as_py():
            end += 1
        yield ordered.slice(start, end - start)
        start = end


# ---------------------------------------------------------------------------------------
# Per partition of durations by topic × metric


def stats(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Rows of every kind but "v" as they are; the "v" rows of each topic × metric (all of
    them in this partition) → one "s" row per window and one overall (``window_t`` null),
    ``data`` = ``[p50, p95, p99, max, count, hist]``."""
    parts: list[pa.RecordBatch] = []
    for batch in batches:
        is_value = pc.equal(batch["kind"], "v")
        other = batch.filter(pc.invert(is_value))
        if other.num_rows:
            yield other
        values = batch.filter(is_value)
        if values.num_rows:
            parts.append(values)
    if not parts:
        return
    table = pa.Table.from_batches(parts).sort_by(
        [("topic", "ascending"), ("metric", "ascending"), ("window_t", "ascending"), ("value", "ascending")]
    )
    topics = table["topic"].to_pylist()
    metrics = table["metric"].to_pylist()
    windows = table["window_t"].to_numpy()
    values = table["value"].to_numpy()
    out: list[dict[str, Any]] = []
    n = len(topics)
    i = 0
    while i < n:
        j = i
        while j < n and topics[j] == topics[i] and metrics[j] == metrics[i]:
            j += 1
        key_windows = windows[i:j]
        cuts = [0, *(np.flatnonzero(key_windows[1:] != key_windows[:-1]) + 1).tolist(), j - i]
        for a, b in itertools.pairwise(cuts):
            out.append(
                _row(
                    "s",
                    topics[i],
                    int(key_windows[a]),
                    metric=metrics[i],
                    data=_figures(values[i + a : i + b]),
                )
            )
        out.append(_row("s", topics[i], None, metric=metrics[i], data=_figures(np.sort(values[i:j]))))
        i = j
    yield pa.RecordBatch.from_pylist(out, schema=OUT_FIELDS)


_BOUNDS: Final = np.array(HIST_BOUNDS_MS, dtype=np.float64)


def _figures(ordered: np.ndarray[Any, np.dtype[np.float64]]) -> list[Any]:
    """``[p50, p95, p99, max, count, hist]`` of ascending values (nearest rank, exact)."""
    n = len(ordered)
    ranks = [max(1, math.ceil(n * p - 1e-9)) for p in PERCENTILES.values()]
    hist = np.bincount(np.searchsorted(_BOUNDS, ordered, side="left"), minlength=len(HIST_BOUNDS_MS) + 1)
    return [*(float(ordered[r - 1]) for r in ranks), float(ordered[-1]), n, hist.tolist()]


# ---------------------------------------------------------------------------------------
# The whole of it


def merge_starts(scans: Iterable[FileScan]) -> dict[str, dict[str, float]]:
    """Per topic, per group: the time of the group's first event over every file's scan."""
    starts: dict[str, dict[str, float]] = {}
    for one in scans:
        for (topic, group), t in one.starts.items():
            mine = starts.setdefault(topic, {})
            mine[group] = min(t, mine.get(group, t))
    return starts


@dataclass(frozen=True, slots=True)
class Figures:
    """What ``lives`` and ``stats`` found, gathered: the unique events at or after the
    window's start, and the rows ``kapok.analytics.transforms`` makes the tables of."""

    events: int
    counts: list[CountRow]
    stats: list[StatRow]
    parts: list[BacklogRow]


def decode(rows: pa.Table) -> Figures:
    """``Figures`` of every task's rows (``OUT_DDL``) but the durations ("v")."""

    def data(kind: str) -> Iterator[tuple[dict[str, Any], Any]]:
        mine = rows.filter(pc.equal(rows["kind"], kind)).select(["topic", "metric", "window_t", "data"])
        for row in mine.to_pylist():
            yield row, orjson.loads(row["data"])

    events = rows.filter(pc.equal(rows["kind"], "n"))
    return Figures(
        events=int(pc.sum(events["value"]).as_py() or 0),
        counts=[CountRow(row["topic"], group, row["window_t"], sums) for row, (group, sums) in data("c")],
        stats=[
            StatRow(row["topic"], row["metric"], row["window_t"], figures[:4], figures[4], figures[5])
            for row, figures in data("s")
        ],
        parts=[BacklogRow(row["topic"], parts[0], row["window_t"], *parts[1:]) for row, parts in data("b")],
    )


def figures_of(
    files: Sequence[bytes],
    *,
    window_s: int,
    since_t: float | None = None,
    days: Sequence[str] | None = None,
) -> tuple[Figures, list[FileScan]]:
    """The job's figures of ``files`` (their bytes) in this process, with no Spark and one
    partition: what the job's Spark stages compute, for tests and small inputs."""
    scans = [scan(data, since_t) for data in files]
    events = [batch for data in files for batch in read_events(data).to_batches()]
    found = lives(events, window_s=window_s, since_t=since_t, days=days, starts=merge_starts(scans))
    return decode(pa.Table.from_batches(list(stats(found)), schema=OUT_FIELDS)), scans
