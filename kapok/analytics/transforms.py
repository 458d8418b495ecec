"""The analytics job's logic, as pure functions DataFrame → DataFrame.

Input: the archive's JSON lines (``kapok.storage.archive``), one lifecycle event a
line: ``{"ev", "code", "topic", "group", "t", ...}`` with ``t`` in unix seconds
(a message's creation time for ``published``).

Rules, each in one function below:

* The job reads the lines with Spark's JSON reader and ``EVENT_SCHEMA``; a line that
  is not a whole JSON object (the cut last line a crash leaves) becomes a row whose
  fields are all null. ``events_only`` drops such rows and ``line_metrics`` counts
  them.
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

from collections.abc import Iterable, Mapping
from datetime import UTC
from typing import Any, Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from kapok.analytics import lifecycle as lc

__all__ = [
    "COUNTED_EVENTS",
    "EVENT_SCHEMA",
    "GROUP_SUMS",
    "HIST_BOUNDS_MS",
    "NEWER_EVENTS",
    "PERCENTILES",
    "WINDOWS",
    "daily_counts",
    "duration_stats",
    "events_only",
    "events_since",
    "group_counts",
    "group_table",
    "hourly_counts",
    "hourly_table",
    "line_metrics",
    "summary",
    "table_names",
    "topic_counts",
    "topic_totals",
    "window_column",
]

# The fields the job reads (others in a line are ignored). Explicit, so Spark never
# scans the input to infer a schema; and each aggregation parses only the fields it uses.
EVENT_SCHEMA: Final = (
    "ev STRING, code STRING, topic STRING, group STRING, t DOUBLE, create_time DOUBLE, deliver_at DOUBLE, "
    "size LONG, attempt INT"
)
# Event kinds counted per topic × hour, each into a column of the same name.
COUNTED_EVENTS: Final = ("published", "delivered", "acked", "retried", "dead_lettered", "expired", "dropped")
# Kinds counted the same way, whose columns tables written before them lack (null when
# such a table is read back): kept out of COUNTED_EVENTS, which compares with old tables.
NEWER_EVENTS: Final = ("requeued", "deleted")
# Summed columns of the hourly table, in order (summing hours gives days exactly).
SUMS: Final = (*COUNTED_EVENTS, "bytes", "redelivered", *NEWER_EVENTS)
PERCENTILES: Final = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
_HOUR_S: Final = 3600
_DAY_S: Final = 86400
# ``--window``: its length in seconds (UTC windows of fixed length: no leap seconds).
WINDOWS: Final = {"minute": 60, "hour": _HOUR_S, "day": _DAY_S}
# Per topic × group × window: the counts of the kinds that name a group.
GROUP_SUMS: Final = (*lc.GROUP_KINDS, "redelivered")
# Histogram buckets of every duration, in ms: bucket i counts bounds[i-1] < v <= bounds[i]
# (the first from −inf, one more after the last bound, to +inf).
HIST_BOUNDS_MS: Final = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000,
    100_000, 200_000, 600_000,
)  # fmt: skip
# Duration columns of the windows table and the topic totals, per ``lifecycle.DURATION_METRICS``.
_STATS: Final = (*PERCENTILES, "max")


def window_column(window: str) -> str:
    """The windows table's time column: ``minute``, ``hour``, or ``day_start`` (``day`` is the
    partition's date string)."""
    return "day_start" if window == "day" else window


def table_names(window: str) -> tuple[str, str]:
    """The windows table's and the groups table's directories for ``window``: ``hourly`` and
    ``groups`` for hours (the names from before ``--window``), else suffixed by the grain."""
    if window == "hour":
        return "hourly", "groups"
    return f"by_{window}", f"groups_by_{window}"


def _is_event() -> Column:
    return F.col("ev").isNotNull() & F.col("t").isNotNull()


def _in_window(since_t: float | None) -> Column:
    return F.lit(True) if since_t is None else F.col("t") >= F.lit(since_t)


def events_only(rows: DataFrame) -> DataFrame:
    """The rows that are events (not torn or foreign lines)."""
    return rows.where(_is_event())


def events_since(events: DataFrame, since_t: float | None) -> DataFrame:
    """The events at or after unix time ``since_t`` (all of them for None)."""
    return events if since_t is None else events.where(_in_window(since_t))


def line_metrics(since_t: float | None) -> list[Column]:
    """Aggregates over all rows: ``skipped`` lines (no event), ``events`` in the window,
    ``all_events``."""
    return [
        F.count(F.when(~_is_event(), 1)).alias("skipped"),
        F.count(F.when(_is_event() & _in_window(since_t), 1)).alias("events"),
        F.count(F.when(_is_event(), 1)).alias("all_events"),
    ]


def _day(t: Column) -> Column:
    return F.date_from_unix_date(F.floor(t / _DAY_S).cast("int")).cast("string")


def _is(kind: str) -> Column:
    return F.col("ev") == F.lit(kind)


def _ratio(part: str, whole: str) -> Column:
    return F.when(F.col(whole) > 0, F.col(part) / F.col(whole)).otherwise(F.lit(0.0))


def _window_t(t: Column, window: str) -> Column:
    return lc.window_start(t, WINDOWS[window])


def _stamp(window_t: Column) -> Column:
    return F.timestamp_seconds(window_t)


def group_counts(events: DataFrame, window: str = "hour") -> DataFrame:
    """Per topic × group × window (``window_t``, unix s): ``SUMS``; ``group`` is null for the
    kinds that name no group (``published``, ``deleted``). One aggregation feeds the topics'
    and the groups' tables."""
    sums = [F.count(F.when(_is(kind), 1)).alias(kind) for kind in COUNTED_EVENTS]
    sums.append(F.coalesce(F.sum(F.when(_is("published"), F.col("size"))), F.lit(0)).alias("bytes"))
    sums.append(F.count(F.when(_is("delivered") & (F.col("attempt") > 1), 1)).alias("redelivered"))
    sums.extend(F.count(F.when(_is(kind), 1)).alias(kind) for kind in NEWER_EVENTS)
    return (
        events.where(F.col("topic").isNotNull())  # old archives' ``deleted`` events carry no topic
        .withColumn("window_t", _window_t(F.col("t"), window))
        .groupBy("topic", "group", "window_t")
        .agg(*sums)
    )


def topic_counts(grouped: DataFrame, window: str = "hour") -> DataFrame:
    """Per topic × window: ``group_counts`` summed over the groups: the window's start (column
    ``window_column(window)``), ``day``, ``SUMS``, ``redelivery_ratio``."""
    return (
        grouped.groupBy("topic", "window_t")
        .agg(*(F.sum(name).alias(name) for name in SUMS))
        .select(
            "topic",
            _stamp(F.col("window_t")).alias(window_column(window)),
            _day(F.col("window_t")).alias("day"),
            *SUMS,
            _ratio("redelivered", "delivered").alias("redelivery_ratio"),
        )
    )


def hourly_counts(events: DataFrame, window: str = "hour") -> DataFrame:
    """Per topic × window: ``SUMS`` (``COUNTED_EVENTS``, ``bytes``, ``redelivered``,
    ``NEWER_EVENTS``), ``redelivery_ratio``, ``day``."""
    return topic_counts(group_counts(events, window), window)


def duration_stats(durations: DataFrame) -> DataFrame:
    """Per topic × metric × window, and per topic × metric overall (``window_t`` null): p50,
    p95, p99 (nearest rank, exact), ``max``, ``count`` and ``hist`` (counts per
    ``HIST_BOUNDS_MS`` bucket) of ``lifecycle.durations``' rows.

    One pass for both levels: each value once per level, shuffled by its key and sorted
    there (the overall percentiles cannot be derived from the windows' ones). It measured
    the same CPU as Spark's ``percentile_approx`` sketches (which fall back to sorting
    beyond 128 keys a task anyway), and its percentiles are exact.
    """
    key = ("topic", "metric", "window_t")
    values = durations.select(*key, "value_ms")
    both = values.unionByName(values.withColumn("window_t", F.lit(None).cast("long")))
    group = Window.partitionBy(*key)
    ranked = both.select(
        *key,
        "value_ms",
        F.count("*").over(group).alias("n"),
        F.row_number().over(group.orderBy("value_ms")).alias("rank"),
    )
    value = F.col("value_ms")
    bucket = sum(
        ((value > F.lit(float(b))).cast("int") for b in HIST_BOUNDS_MS[1:]), (value > 1.0).cast("int")
    )
    hist = F.array(*(F.count(F.when(F.col("bucket") == i, 1)) for i in range(len(HIST_BOUNDS_MS) + 1)))

    def at_rank(p: float) -> Column:
        rank = F.greatest(F.lit(1), F.ceil(F.col("n") * F.lit(p) - F.lit(1e-9)))
        return F.max(F.when(F.col("rank") == rank, value))

    return (
        ranked.withColumn("bucket", bucket)
        .groupBy(*key)
        .agg(
            *(at_rank(p).alias(name) for name, p in PERCENTILES.items()),
            F.max("value_ms").alias("max"),
            F.count("*").alias("count"),
            hist.alias("hist"),
        )
    )


def _pivot() -> list[Column]:
    """One row's duration columns from its metrics' rows: ``<metric>_p50_ms`` … ``_max_ms``,
    ``<metric>_hist``, and ``delayed`` (how many messages had a delay)."""
    out: list[Column] = []
    for metric in lc.DURATION_METRICS:
        mine = F.col("metric") == metric
        out.extend(F.max(F.when(mine, F.col(name))).alias(f"{metric}_{name}_ms") for name in _STATS)
        out.append(F.first(F.when(mine, F.col("hist")), ignorenulls=True).alias(f"{metric}_hist"))
    out.append(
        F.coalesce(F.sum(F.when(F.col("metric") == "delay", F.col("count"))), F.lit(0)).alias("delayed")
    )
    return out


def hourly_table(counts: DataFrame, stats: DataFrame, window: str = "hour") -> DataFrame:
    """``hourly_counts`` with the window's durations (``_pivot``; null without any)."""
    column = window_column(window)
    per_window = (
        stats.where(F.col("window_t").isNotNull())
        .groupBy("topic", _stamp(F.col("window_t")).alias(column))
        .agg(*_pivot())
    )
    return counts.join(per_window, ["topic", column], "left").withColumn(
        "delayed", F.coalesce(F.col("delayed"), F.lit(0))
    )


def group_table(grouped: DataFrame, backlog: DataFrame, counts: DataFrame, window: str = "hour") -> DataFrame:
    """Per topic × group × window: the window's start, ``day``, ``GROUP_SUMS``, ``ready``,
    ``in_flight``, ``oldest_unacked_age_s`` (``lifecycle.backlog``; its rows: the windows in
    which the group had an event or an unacked entry), on the days of ``counts``."""
    group_sums = grouped.where(F.col("group").isNotNull()).select("topic", "group", "window_t", *GROUP_SUMS)
    column = window_column(window)
    return (
        backlog.join(group_sums, ["topic", "group", "window_t"], "left")
        .select(
            "topic",
            "group",
            _stamp(F.col("window_t")).alias(column),
            _day(F.col("window_t")).alias("day"),
            *(F.coalesce(F.col(name), F.lit(0)).alias(name) for name in GROUP_SUMS),
            "ready",
            "in_flight",
            "oldest_unacked_age_s",
        )
        .join(counts.select("day").distinct(), "day", "left_semi")
    )


def daily_counts(hourly: DataFrame) -> DataFrame:
    """Per topic × day: the hours' sums, and the day's redelivery ratio."""
    return (
        hourly.groupBy("topic", "day")
        .agg(*(F.sum(name).alias(name) for name in SUMS))
        .withColumn("redelivery_ratio", _ratio("redelivered", "delivered"))
    )


def topic_totals(daily: DataFrame, stats: DataFrame) -> DataFrame:
    """Per topic: the days' sums, and the overall durations (``_pivot``)."""
    overall = stats.where(F.col("window_t").isNull()).groupBy("topic").agg(*_pivot())
    sums = daily.groupBy("topic").agg(*(F.sum(name).alias(name) for name in SUMS))
    return sums.join(overall, "topic", "left")


# ---------------------------------------------------------------------------------------
# summary.json (plain Python on the collected rows: a few per topic and day)

SUMMARY_COUNTS: Final = ("published", "delivered", "acked", "retried", "dead_lettered", "expired")


def _ms(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _hist(value: Any) -> list[int] | None:
    return None if value is None else [int(n) for n in value]


def _group(row: Mapping[str, Any], column: str) -> dict[str, Any]:
    start = row[column]
    out: dict[str, Any] = {
        "topic": str(row["topic"]),
        "group": str(row["group"]),
        "window_start": start.astimezone(UTC).isoformat().replace("+00:00", "Z") if start else None,
        "ready": int(row["ready"]),
        "in_flight": int(row["in_flight"]),
    }
    age = row["oldest_unacked_age_s"]
    out["oldest_unacked_age_s"] = None if age is None else round(float(age), 3)
    out.update({name: int(row[name]) for name in GROUP_SUMS})
    return out


def summary(
    topics: Iterable[Mapping[str, Any]],
    days: Iterable[Mapping[str, Any]],
    generated_at: str,
    groups: Iterable[Mapping[str, Any]] = (),
    window: str = "hour",
) -> dict[str, Any]:
    """The console's ``summary.json`` from ``topic_totals``, ``daily_counts`` and the last
    ``group_table`` row of each group.

    ``{"generated_at", "topics": {t: {counts…, "latency_ms": {"p50", "p95", "p99"}, …}},
    "days": [{"day", "topic", counts…, "dropped", "bytes", "redelivery_ratio"}], …}``,
    days sorted by day then topic; a latency is null where no ack had a known creation time.
    Added after those keys: per topic ``queue_wait_ms``, ``processing_ms`` and ``delay_ms``
    (p50, p95, p99 each), ``delayed`` and ``histograms`` (``latency``, ``queue_wait``,
    ``processing``, ``delay``: counts per bucket, null without any); at the top
    ``window``, ``histogram_bounds_ms`` and ``groups`` (sorted by topic, group: the
    backlog at the end of the group's last window).
    """
    out_topics: dict[str, Any] = {}
    for row in sorted(topics, key=lambda r: str(r["topic"])):
        entry: dict[str, Any] = {name: int(row[name]) for name in SUMMARY_COUNTS}
        entry["latency_ms"] = {name: _ms(row[f"latency_{name}_ms"]) for name in PERCENTILES}
        for metric in lc.DURATION_METRICS[1:]:
            entry[f"{metric}_ms"] = {name: _ms(row.get(f"{metric}_{name}_ms")) for name in PERCENTILES}
        entry["delayed"] = int(row.get("delayed") or 0)
        entry["histograms"] = {metric: _hist(row.get(f"{metric}_hist")) for metric in lc.DURATION_METRICS}
        out_topics[str(row["topic"])] = entry
    out_days = []
    for row in sorted(days, key=lambda r: (str(r["day"]), str(r["topic"]))):
        day: dict[str, Any] = {"day": str(row["day"]), "topic": str(row["topic"])}
        day.update({name: int(row[name]) for name in (*SUMMARY_COUNTS, "dropped", "bytes")})
        day["redelivery_ratio"] = round(float(row["redelivery_ratio"]), 6)
        out_days.append(day)
    column = window_column(window)
    out_groups = [
        _group(row, column) for row in sorted(groups, key=lambda r: (str(r["topic"]), str(r["group"])))
    ]
    return {
        "generated_at": generated_at,
        "topics": out_topics,
        "days": out_days,
        "window": window,
        "histogram_bounds_ms": list(HIST_BOUNDS_MS),
        "groups": out_groups,
    }
