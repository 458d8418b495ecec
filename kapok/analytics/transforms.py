"""The analytics job's rules, and the tables made of the small figures (per topic ×
window) that ``kapok.analytics.engine`` computes from the events: plain Python, no Spark.
``summary.json`` is made of these tables in ``kapok.analytics.summary``.

Input: the archive's JSON lines (``kapok.storage.archive``), one lifecycle event a
line: ``{"ev", "code", "topic", "group", "t", ...}`` with ``t`` in unix seconds
(a message's creation time for ``published``).

Rules (in ``kapok.analytics.engine`` and ``kapok.analytics.lifecycle`` for the events,
in the functions below for the tables):

* A line that is not a JSON object with ``ev`` and ``t`` (the cut last line a crash
  leaves, a foreign line) is no event: it is counted as skipped
  (``kapok.analytics.reading``).
* Every event counts in the UTC hour and day of its own ``t``: a message published
  at 23:59 and acked at 00:01 counts as published on one day and acked on the next.
* Each event kind means one thing (docs/analytics.md, "Event schema"), and each is
  counted in a column of its own name: a dead letter published again is ``requeued``,
  never ``acked``; a delete is ``deleted``, never ``dropped`` (overflow only); an expiry
  moved to the DLQ counts in both ``expired`` and ``dead_lettered``. Archives written
  before these kinds say ``acked`` and ``dropped`` for those: their counts stay as
  written, and their ``deleted`` events carry no topic, so they are not counted.
* Counts are exact sums over events. ``bytes`` is the payload bytes published.
  ``redelivered`` counts deliveries with ``attempt`` > 1, and the redelivery ratio
  is redelivered / delivered (0 when nothing was delivered).
* Delivery latency is ack time − creation time (the ``acked`` event's ``t`` minus
  its message's ``published`` ``create_time``), in milliseconds, counted in the
  hour of the ack; only acks have one (not ``requeued``). An ack whose ``published``
  event is not in the input (aged out of the archive) has no latency. Percentiles
  are exact (nearest rank): the value for p is the latency of rank ⌈p·n⌉ (at least 1)
  in ascending order.
* Counts are per topic, summed over its groups (a message acked by two groups
  counts two acks). A dead letter is also published to ``<topic>.dlq``, which is a
  topic of its own.

* Windows (``--window``) are a minute, an hour (default) or a day: UTC, of fixed length
  (``WINDOWS``); the windows table's time column is ``window_column(window)``. "Hour" above
  reads "window".

Per entry (a message in one group; ``kapok.analytics.lifecycle``), from the one shuffle by
code that gathers a message's ``published``, ``deleted`` and events naming a group:

* An entry exists in each group the message has an event in, and in each other group of
  its topic whose first event is not later than the message's creation (a ``published``
  event names no group: a durable group gets what is published while it exists; groups
  that get part of a topic are overcounted as ready).
* Its events, sorted by (``t``, attempt: a delivery before the requeue of its attempt, that
  requeue before the next delivery, ends last), walk a state machine: ready from its due
  time (creation + delay), in flight at each ``delivered`` (also when already in flight:
  old archives), ready at each ``retried``, gone at its first end (``acked``,
  ``dead_lettered``, ``expired``, ``requeued``, ``dropped``) or its message's ``deleted``.
  Without its ``published`` event it is known from its first event on.
* Backlog per topic × group at a window's end E: ``ready`` and ``in_flight`` are running
  sums of the state changes before E (from the input's first event); the oldest unacked
  age is E − the due time of the oldest entry unacked at E (became ready or in flight
  before E, gone at or after E, or never). A row per window with an event of the group, a
  state change, or an entry unacked across the window's end.
* Durations in ms: queue wait = first delivery − due time (window of the delivery);
  processing = ack − the last delivery before it (window of the ack); latency = ack −
  creation (window of the ack); per message with ``deliver_at`` > ``create_time``, delay =
  their difference (window of its creation). Each: percentiles as latency's, max, count,
  and exact counts per ``HIST_BOUNDS_MS`` bucket (v ≤ 1 first, v > 600,000 last).

Windows are ``timestamp`` instants (independent of the session's time zone); days
are ``YYYY-MM-DD`` strings of the UTC date.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from kapok.analytics.kinds import (
    COUNTED_EVENTS,
    DURATION_METRICS,
    GROUP_SUMS,
    HIST_BOUNDS_MS,
    NEWER_EVENTS,
    PERCENTILES,
    SUMS,
    WINDOWS,
)

__all__ = [
    "COUNTED_EVENTS",
    "DURATION_METRICS",
    "GROUP_SUMS",
    "HIST_BOUNDS_MS",
    "NEWER_EVENTS",
    "PERCENTILES",
    "SUMS",
    "WINDOWS",
    "BacklogRow",
    "ConsumerRow",
    "CountRow",
    "StatRow",
    "add",
    "backlog",
    "consumer_table",
    "consumers_table",
    "daily_counts",
    "group_table",
    "hourly_table",
    "pivot",
    "table_names",
    "topic_counts",
    "window_column",
]

# Duration columns of the windows table and the topic totals, per ``DURATION_METRICS``.
_STATS: Final = (*PERCENTILES, "max")


@dataclass(frozen=True, slots=True)
class CountRow:
    """``SUMS`` of one topic × group × window (``group`` None: kinds that name no group)."""

    topic: str
    group: str | None
    window_t: int
    sums: Sequence[int]


@dataclass(frozen=True, slots=True)
class ConsumerRow:
    """One consumer's deliveries (and redeliveries among them) in a group × window."""

    topic: str
    group: str | None
    consumer: str
    window_t: int
    delivered: int
    redelivered: int


@dataclass(frozen=True, slots=True)
class StatRow:
    """One duration's figures per topic × window (``window_t`` None: overall): ``figures``
    are the percentiles' values in ``PERCENTILES``' order, then the max."""

    topic: str
    metric: str
    window_t: int | None
    figures: Sequence[float]
    count: int
    hist: Sequence[int]


@dataclass(frozen=True, slots=True)
class BacklogRow:
    """One task's ``kapok.analytics.lifecycle.BacklogParts`` entry."""

    topic: str
    group: str
    window_t: int
    d_ready: int
    d_in_flight: int
    open_since: float | None
    closed_since: float | None


def window_column(window: str) -> str:
    """The windows table's time column: ``minute``, ``hour``, or ``day_start`` (``day`` is the
    partition's date string)."""
    return "day_start" if window == "day" else window


def consumers_table(window: str) -> str:
    """The consumers table's directory for ``window``: ``consumers``, else suffixed by the grain."""
    return "consumers" if window == "hour" else f"consumers_by_{window}"


def table_names(window: str) -> tuple[str, str]:
    """The windows table's and the groups table's directories for ``window``: ``hourly`` and
    ``groups`` for hours (the names from before ``--window``), else suffixed by the grain."""
    if window == "hour":
        return "hourly", "groups"
    return f"by_{window}", f"groups_by_{window}"


def _stamp(window_t: int) -> datetime:
    return datetime.fromtimestamp(window_t, UTC)


def _day(window_t: int) -> str:
    return _stamp(window_t).strftime("%Y-%m-%d")


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole > 0 else 0.0


def add(total: list[int], figures: Sequence[int | None]) -> None:
    for i, n in enumerate(figures):
        total[i] += n or 0


def _least(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def topic_counts(counts: Iterable[CountRow], window: str = "hour") -> list[dict[str, Any]]:
    """Per topic × window: the counts per group summed over the groups: ``topic``, the
    window's start (column ``window_column(window)``), ``day``, ``SUMS``,
    ``redelivery_ratio``; and ``window_t`` (unix s), which the tables leave out."""
    sums: dict[tuple[str, int], list[int]] = {}
    for row in counts:
        add(sums.setdefault((row.topic, row.window_t), [0] * len(SUMS)), row.sums)
    column = window_column(window)
    out: list[dict[str, Any]] = []
    for (topic, window_t), figures in sorted(sums.items()):
        out.append({"topic": topic, "window_t": window_t, column: _stamp(window_t), "day": _day(window_t)})
        out[-1].update(zip(SUMS, figures, strict=True))
        out[-1]["redelivery_ratio"] = _ratio(out[-1]["redelivered"], out[-1]["delivered"])
    return out


def pivot(stats: Iterable[StatRow]) -> dict[str, Any]:
    """One row's duration columns from its metrics' stats: ``<metric>_p50_ms`` … ``_max_ms``,
    ``<metric>_hist`` (null without values), and ``delayed`` (how many messages had a delay)."""
    out: dict[str, Any] = {}
    for metric in DURATION_METRICS:
        out.update(dict.fromkeys((f"{metric}_{name}_ms" for name in _STATS), None))
        out[f"{metric}_hist"] = None
    out["delayed"] = 0
    for stat in stats:
        out.update(
            {f"{stat.metric}_{name}_ms": value for name, value in zip(_STATS, stat.figures, strict=True)}
        )
        out[f"{stat.metric}_hist"] = stat.hist
        if stat.metric == "delay":
            out["delayed"] = stat.count
    return out


def hourly_table(counts: Iterable[Mapping[str, Any]], stats: Iterable[StatRow]) -> list[dict[str, Any]]:
    """``topic_counts``' rows with the window's durations (``pivot``; null without any)."""
    per_window: dict[tuple[str, int], list[StatRow]] = {}
    for stat in stats:
        if stat.window_t is not None:
            per_window.setdefault((stat.topic, stat.window_t), []).append(stat)
    return [{**row, **pivot(per_window.get((row["topic"], row["window_t"]), ()))} for row in counts]


def backlog(
    parts: Iterable[BacklogRow], window_s: int, windows: Iterable[tuple[str, str, int]] = ()
) -> dict[tuple[str, str, int], tuple[int, int, float | None]]:
    """Per topic × group × window (unix s) that ``parts`` or ``windows`` name: ``ready`` and
    ``in_flight`` at the window's end, and the oldest unacked age in s (None when nothing is
    unacked).

    ``parts`` are ``kapok.analytics.lifecycle.BacklogParts`` from every task: ready and in
    flight are running sums of the changes; the oldest unacked entry at a window's end E is
    the oldest of those still unacked at the input's end that began before E and of those
    unacked at E that ended later; its age is E − its due time.
    """
    merged: dict[tuple[str, str, int], list[Any]] = {key: [0, 0, None, None] for key in windows}
    for part in parts:
        mine = merged.setdefault((part.topic, part.group, part.window_t), [0, 0, None, None])
        mine[0] += part.d_ready
        mine[1] += part.d_in_flight
        mine[2] = _least(mine[2], part.open_since)
        mine[3] = _least(mine[3], part.closed_since)
    out: dict[tuple[str, str, int], tuple[int, int, float | None]] = {}
    running: dict[tuple[str, str], list[Any]] = {}
    for key in sorted(merged):
        d_ready, d_in_flight, open_since, closed_since = merged[key]
        state = running.setdefault(key[:2], [0, 0, None])
        state[0] += d_ready
        state[1] += d_in_flight
        state[2] = _least(state[2], open_since)
        oldest = _least(state[2], closed_since)
        out[key] = (state[0], state[1], None if oldest is None else key[2] + window_s - oldest)
    return out


def group_table(
    counts: Iterable[CountRow],
    backlog_rows: Mapping[tuple[str, str, int], tuple[int, int, float | None]],
    days: Iterable[str],
    window: str = "hour",
) -> list[dict[str, Any]]:
    """Per topic × group × window of ``backlog_rows`` on ``days``: the window's start,
    ``day``, ``GROUP_SUMS``, ``ready``, ``in_flight``, ``oldest_unacked_age_s``."""
    index = [SUMS.index(name) for name in GROUP_SUMS]
    sums: dict[tuple[str, str, int], list[int]] = {}
    for count in counts:
        if count.group is not None:
            add(sums.setdefault((count.topic, count.group, count.window_t), [0] * len(SUMS)), count.sums)
    wanted = set(days)
    column = window_column(window)
    out = []
    for (topic, group, window_t), (ready, in_flight, age) in sorted(backlog_rows.items()):
        day = _day(window_t)
        if day not in wanted:
            continue
        figures = sums.get((topic, group, window_t), [0] * len(SUMS))
        row: dict[str, Any] = {"topic": topic, "group": group, column: _stamp(window_t), "day": day}
        row.update({name: figures[i] for name, i in zip(GROUP_SUMS, index, strict=True)})
        row.update(ready=ready, in_flight=in_flight, oldest_unacked_age_s=age)
        out.append(row)
    return out


def consumer_table(
    rows: Iterable[ConsumerRow], days: Iterable[str], window: str = "hour"
) -> list[dict[str, Any]]:
    """Per topic × group × consumer × window on ``days``: the window's start, ``day``,
    ``delivered`` and ``redelivered`` (summed over the tasks)."""
    sums: dict[tuple[str, str | None, str, int], list[int]] = {}
    for row in rows:
        add(
            sums.setdefault((row.topic, row.group, row.consumer, row.window_t), [0, 0]),
            (row.delivered, row.redelivered),
        )
    wanted = set(days)
    column = window_column(window)
    out = []
    for (topic, group, consumer, window_t), (delivered, redelivered) in sorted(
        sums.items(), key=lambda item: (item[0][0], item[0][1] or "", item[0][2], item[0][3])
    ):
        if _day(window_t) in wanted:
            out.append(
                {
                    "topic": topic,
                    "group": group,
                    "consumer": consumer,
                    column: _stamp(window_t),
                    "day": _day(window_t),
                    "delivered": delivered,
                    "redelivered": redelivered,
                }
            )
    return out


def daily_counts(hourly: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per topic × day: the windows' sums, and the day's redelivery ratio."""
    sums: dict[tuple[str, str], list[int]] = {}
    for row in hourly:
        add(sums.setdefault((row["topic"], row["day"]), [0] * len(SUMS)), [row[name] for name in SUMS])
    out: list[dict[str, Any]] = []
    for (topic, day), figures in sorted(sums.items()):
        out.append({"topic": topic, "day": day, **dict(zip(SUMS, figures, strict=True))})
        out[-1]["redelivery_ratio"] = _ratio(out[-1]["redelivered"], out[-1]["delivered"])
    return out
