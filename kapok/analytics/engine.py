"""The job's per-event work, in Arrow and plain Python inside Spark's tasks.

Spark's JSON reader and generated code cost 120 CPU-seconds per million archived events
on two cores, most of it compiling and running code per row (docs/benchmarks.md). So
Spark here only distributes: its tasks read the archive files' bytes (``binaryFile``,
through every file system Spark has, with its credentials), and hand them to
``kapok.analytics.reading``, which parses them with Arrow and splits each file's events
into buckets by code; Spark shuffles the buckets (a few large values, not a row per
event), runs ``lives`` on each bucket's events, shuffles the durations by topic ×
metric, runs ``stats``, and writes the small tables. Everything here is pure functions
over ``pyarrow`` tables and Python values, with no Spark: it runs in any executor, and
``figures_of`` runs the whole of it in one process for tests. The rules are those of
``kapok.analytics.transforms`` and ``kapok.analytics.lifecycle``'s docstrings.

* ``lives``: the events of one or more buckets (all of a code's events): each event once
  (``unique``), the counts per topic × group × window, each entry's life (backlog
  changes and unacked spans, merged per topic × group × window) and its durations,
  packed per topic × metric: the common messages in arrays (``common``), the others
  walked (``lifecycle``); and, for a later run, the events of the messages still open
  at ``carry_t``.
* ``stats``: the packed durations of each topic × metric: exact percentiles (nearest
  rank), max, count and histogram per window and overall.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Final

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from kapok.analytics.common import common
from kapok.analytics.kinds import COUNTED_EVENTS, HIST_BOUNDS_MS, NEWER_EVENTS, PERCENTILES, SUMS
from kapok.analytics.lifecycle import Lives
from kapok.analytics.reading import (
    EMPTY_EVENTS,
    EVENT_FIELDS,
    FileScan,
    events_of,
    ipc_bytes,
    ipc_table,
    read_events,
    scan,
)
from kapok.analytics.transforms import BacklogRow, ConsumerRow, CountRow, StatRow
from kapok.analytics.unique import unique

__all__ = [
    "OUT_DDL",
    "OUT_FIELDS",
    "Figures",
    "decode",
    "figures_of",
    "lives",
    "merge_starts",
    "stats",
]

# The rows ``lives`` and ``stats`` give Spark (DDL): ``kind`` says which: "n" (the events
# in the window: ``data`` their number), "c" (counts), "d" (deliveries per consumer),
# "b" (backlog parts), "s" (a duration's stats per window), all small, with their figures
# as JSON in ``data``; "v": the durations of one topic × metric, ``blob`` an Arrow IPC
# stream of (``window_t``, ``value``); "k": events carried to a later run (``blob``: an
# Arrow IPC stream of ``reading.EVENT_FIELDS``).
OUT_DDL: Final = "kind STRING, topic STRING, metric STRING, window_t LONG, data STRING, blob BINARY"
OUT_FIELDS: Final = pa.schema(
    [
        ("kind", pa.string()),
        ("topic", pa.string()),
        ("metric", pa.string()),
        ("window_t", pa.int64()),
        ("data", pa.string()),
        ("blob", pa.binary()),
    ]
)
_VALUES: Final = pa.schema([("window_t", pa.int64()), ("value", pa.float64())])
_DAY_S: Final = 86400
_EPOCH_DAY: Final = date(1970, 1, 1).toordinal()
_CHUNK: Final = 200_000  # events walked at a time (at code boundaries): bounded Python memory


# ---------------------------------------------------------------------------------------
# Per partition of events by code


def _window(t: pa.ChunkedArray | pa.Array, window_s: int) -> pa.Array:
    return pc.multiply(pc.cast(pc.floor(pc.divide(t, float(window_s))), pa.int64()), window_s)


def _row(kind: str, topic: Any, window_t: Any = None, metric: Any = None, data: Any = None) -> dict[str, Any]:
    return {
        "kind": kind,
        "topic": topic,
        "metric": metric,
        "window_t": window_t,
        "data": None if data is None else orjson.dumps(data).decode(),
        "blob": None,
    }


def _counts(events: pa.Table, window_s: int) -> list[dict[str, Any]]:
    """Per topic × group × window the ``SUMS`` of ``events`` (rows of kind "c"), and per
    topic × group × consumer × window its deliveries and redeliveries (kind "d")."""
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
            "consumer": events["consumer"],
            "bytes": pc.if_else(published, pc.coalesce(events["size"], 0), 0),
            "again": pc.cast(pc.fill_null(again, False), pa.int64()),
        }
    )
    grouped = keyed.group_by(["topic", "group", "window_t", "ev"], use_threads=False).aggregate(
        [("ev", "count"), ("bytes", "sum"), ("again", "sum")]
    )
    sums: dict[tuple[str, str | None, int], list[int]] = {}
    kinds = {name: SUMS.index(name) for name in (*COUNTED_EVENTS, *NEWER_EVENTS)}
    size, again_at = SUMS.index("bytes"), SUMS.index("redelivered")
    for row in grouped.to_pylist():
        figures = sums.setdefault((row["topic"], row["group"], row["window_t"]), [0] * len(SUMS))
        if row["ev"] in kinds:  # a kind the tables have no column for counts only as an event
            figures[kinds[row["ev"]]] += row["ev_count"]
        figures[size] += row["bytes_sum"] or 0
        figures[again_at] += row["again_sum"] or 0
    rows = [
        _row("c", topic, window_t, data=[group, figures])
        for (topic, group, window_t), figures in sums.items()
    ]
    # Deliveries per consumer (archives before consumers were named have none).
    named = keyed.filter(pc.and_(pc.equal(keyed["ev"], "delivered"), pc.is_valid(events["consumer"])))
    if named.num_rows:
        per_consumer = named.group_by(
            ["topic", "group", "consumer", "window_t"], use_threads=False
        ).aggregate([("ev", "count"), ("again", "sum")])
        rows.extend(
            _row(
                "d",
                row["topic"],
                row["window_t"],
                data=[row["group"], row["consumer"], row["ev_count"], row["again_sum"]],
            )
            for row in per_consumer.to_pylist()
        )
    return rows


def lives(
    events: pa.Table,
    *,
    window_s: int,
    since_t: float | None,
    days: Sequence[str] | None,
    starts: Mapping[str, Mapping[str, float]],
    carry_t: float | None = None,
    walk_all: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Every event of the codes it has (``reading.EVENT_FIELDS``) → rows of ``OUT_DDL``: "n"
    (the unique events at or after ``since_t``), "c", "b" and "v" (durations at or after
    ``since_t``); ``days`` (``YYYY-MM-DD``) limits the counts. ``starts``: per topic, per
    group, the time of the group's first event in the whole input. With ``carry_t``, also
    "k" rows (``blob``): every event from ``carry_t`` on, and the events before it of the
    messages still open then: all that a later run which starts at ``carry_t`` needs of
    the input read so far."""
    events = unique(events)
    recent = events if since_t is None else events.filter(pc.greater_equal(events["t"], since_t))
    rows = [_row("n", None, data=recent.num_rows)]
    counted = recent
    if days is not None:
        day = pc.cast(pc.floor(pc.divide(counted["t"], float(_DAY_S))), pa.int64())
        counted = counted.filter(pc.is_in(day, pa.array([_day_number(d) for d in days], pa.int64())))
    rows.extend(_counts(counted, window_s))
    yield pa.RecordBatch.from_pylist(rows, schema=OUT_FIELDS)
    if carry_t is not None:  # every event from ``carry_t`` on: a later run reads no file again for them
        after = events.filter(pc.greater_equal(events["t"], carry_t))
        if after.num_rows:
            yield _carry_row(after)
    found = Lives(window_s, since_t, starts)
    known = events.filter(pc.and_(pc.is_valid(events["code"]), pc.is_valid(events["topic"])))
    ordered = known.sort_by([("code", "ascending"), ("ev", "ascending")])
    if walk_all:  # every message walked: what the common ones' arrays must equal (tests)
        rest = ordered
    else:
        figured = common(ordered, starts=starts, window_s=window_s, since_t=since_t, carry_t=carry_t)
        found.add_parts(figured.parts)
        yield _packed(figured.values)
        if len(figured.carried):
            yield _carry_row(ordered.take(pa.array(figured.carried)))
        rest = figured.rest
    for chunk in _code_chunks(rest):
        codes, evs, topics, groups, ts, creates, delivers, attempts = (
            chunk[name].to_pylist()
            for name in ("code", "ev", "topic", "group", "t", "create_time", "deliver_at", "attempt")
        )
        n = len(codes)
        carried: list[int] = []
        i = 0
        while i < n:
            j = i + 1
            while j < n and codes[j] == codes[i]:
                j += 1
            closed = found.message(evs, topics, groups, ts, creates, delivers, attempts, i, j)
            if carry_t is not None and (closed is None or closed >= carry_t):
                carried.extend(k for k in range(i, j) if ts[k] < carry_t)
            i = j
        values, found.values = found.values, {}
        yield _packed(values)
        if carried:
            yield _carry_row(chunk.take(pa.array(carried, pa.int64())))
    backlog = [
        _row("b", topic, window_t, data=[group, *parts])
        for (topic, group, window_t), parts in found.backlog.items()
    ]
    yield pa.RecordBatch.from_pylist(backlog, schema=OUT_FIELDS)


def _packed(values: Mapping[tuple[str, str], tuple[Any, Any]]) -> pa.RecordBatch:
    """Durations as "v" rows, one per topic × metric: (windows, values in ms) of each."""
    rows = []
    for (topic, metric), (windows, ms) in values.items():
        row = _row("v", topic, metric=metric)
        row["blob"] = ipc_bytes(pa.table({"window_t": windows, "value": ms}, schema=_VALUES))
        rows.append(row)
    return pa.RecordBatch.from_pylist(rows, schema=OUT_FIELDS)


def _carry_row(events: pa.Table) -> pa.RecordBatch:
    """Events carried to a later run as one "k" row."""
    row = _row("k", None)
    row["blob"] = ipc_bytes(events)
    return pa.RecordBatch.from_pylist([row], schema=OUT_FIELDS)


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
    packed: dict[tuple[str, str], list[pa.Table]] = {}
    for batch in batches:
        is_value = pc.equal(batch["kind"], "v")
        other = batch.filter(pc.invert(is_value))
        if other.num_rows:
            yield other
        values = batch.filter(is_value)
        for topic, metric, blob in zip(
            *(values[name].to_pylist() for name in ("topic", "metric", "blob")), strict=True
        ):
            packed.setdefault((topic, metric), []).append(ipc_table(blob))
    out: list[dict[str, Any]] = []
    for (topic, metric), tables in packed.items():
        table = pa.concat_tables(tables)
        if table.num_rows == 0:
            continue
        windows = table["window_t"].to_numpy()
        values = table["value"].to_numpy()
        order = np.lexsort((values, windows))
        windows, by_window = windows[order], values[order]
        cuts = [0, *(np.flatnonzero(windows[1:] != windows[:-1]) + 1).tolist(), len(windows)]
        for a, b in itertools.pairwise(cuts):
            out.append(_row("s", topic, int(windows[a]), metric=metric, data=_figures(by_window[a:b])))
        out.append(_row("s", topic, None, metric=metric, data=_figures(np.sort(values))))
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


def merge_starts(
    scans: Iterable[FileScan], earlier: Mapping[str, Mapping[str, float]] | None = None
) -> dict[str, dict[str, float]]:
    """Per topic, per group: the time of the group's first event over every file's scan
    (and ``earlier``: what a run before found, in the same shape)."""
    starts = {topic: dict(groups) for topic, groups in (earlier or {}).items()}
    for one in scans:
        for (topic, group), t in one.starts.items():
            mine = starts.setdefault(topic, {})
            mine[group] = min(t, mine.get(group, t))
    return starts


@dataclass(frozen=True, slots=True)
class Figures:
    """What ``lives`` and ``stats`` found, gathered: the unique events at or after the
    window's start, the rows ``kapok.analytics.transforms`` makes the tables of, and the
    events carried to a later run (``lives``' ``carry_t``)."""

    events: int
    counts: list[CountRow]
    consumers: list[ConsumerRow]
    stats: list[StatRow]
    parts: list[BacklogRow]
    carry: pa.Table = field(default_factory=EVENT_FIELDS.empty_table)


def decode(rows: pa.Table) -> Figures:
    """``Figures`` of every task's rows (``OUT_DDL``) but the durations ("v")."""

    def data(kind: str) -> Iterator[tuple[dict[str, Any], Any]]:
        mine = rows.filter(pc.equal(rows["kind"], kind)).select(["topic", "metric", "window_t", "data"])
        for row in mine.to_pylist():
            yield row, orjson.loads(row["data"])

    return Figures(
        events=sum(int(n) for _, n in data("n")),
        counts=[CountRow(row["topic"], group, row["window_t"], sums) for row, (group, sums) in data("c")],
        consumers=[
            ConsumerRow(row["topic"], d[0], d[1], row["window_t"], d[2], d[3]) for row, d in data("d")
        ],
        stats=[
            StatRow(row["topic"], row["metric"], row["window_t"], figures[:4], figures[4], figures[5])
            for row, figures in data("s")
        ],
        parts=[BacklogRow(row["topic"], parts[0], row["window_t"], *parts[1:]) for row, parts in data("b")],
        carry=events_of(rows.filter(pc.equal(rows["kind"], "k"))["blob"].to_pylist()),
    )


def figures_of(
    files: Sequence[bytes],
    *,
    window_s: int,
    since_t: float | None = None,
    days: Sequence[str] | None = None,
    carry_t: float | None = None,
    carried: pa.Table | None = None,
    starts: Mapping[str, Mapping[str, float]] | None = None,
) -> tuple[Figures, list[FileScan]]:
    """The job's figures of ``files`` (their bytes) in this process, with no Spark and one
    partition: what the job's Spark stages compute, for tests and small inputs. With
    ``carried`` (an earlier run's ``Figures.carry`` at ``since_t``, and its ``starts``) the
    run resumes: ``files`` are the files new since, of which only the events at or after
    ``since_t`` are read."""
    scans = [scan(data, since_t) for data in files]
    from_t = None if carried is None else since_t
    read = [read_events(data, from_t) for data in files]
    events = pa.concat_tables([EMPTY_EVENTS, *([] if carried is None else [carried]), *read])
    first = merge_starts(scans, starts)
    found = lives(events, window_s=window_s, since_t=since_t, days=days, starts=first, carry_t=carry_t)
    return decode(pa.Table.from_batches(list(stats(found)), schema=OUT_FIELDS)), scans
