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
  come from Spark's ``percentile_approx`` with ``LATENCY_ACCURACY``: the value
  returned for p is one of the latencies whose rank is within n / LATENCY_ACCURACY
  of ⌈p·n⌉.
* Counts are per topic, summed over its groups (a message acked by two groups
  counts two acks). A dead letter is also published to ``<topic>.dlq``, which is a
  topic of its own.

Hours are ``timestamp`` instants (independent of the session's time zone); days
are ``YYYY-MM-DD`` strings of the UTC date.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = [
    "COUNTED_EVENTS",
    "EVENT_SCHEMA",
    "LATENCY_ACCURACY",
    "NEWER_EVENTS",
    "PERCENTILES",
    "daily_counts",
    "events_only",
    "events_since",
    "hourly_counts",
    "hourly_table",
    "latencies",
    "latency_percentiles",
    "line_metrics",
    "summary",
    "topic_totals",
]

# The fields the job reads (others in a line are ignored). Explicit, so Spark never
# scans the input to infer a schema; and each aggregation parses only the fields it uses.
EVENT_SCHEMA: Final = (
    "ev STRING, code STRING, topic STRING, t DOUBLE, create_time DOUBLE, size LONG, attempt INT"
)
# Event kinds counted per topic × hour, each into a column of the same name.
COUNTED_EVENTS: Final = ("published", "delivered", "acked", "retried", "dead_lettered", "expired", "dropped")
# Kinds counted the same way, whose columns tables written before them lack (null when
# such a table is read back): kept out of COUNTED_EVENTS, which compares with old tables.
NEWER_EVENTS: Final = ("requeued", "deleted")
# Summed columns of the hourly table, in order (summing hours gives days exactly).
SUMS: Final = (*COUNTED_EVENTS, "bytes", "redelivered", *NEWER_EVENTS)
LATENCY_ACCURACY: Final = 10_000  # percentile_approx's accuracy: rank error at most n / 10,000
PERCENTILES: Final = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
_HOUR_S: Final = 3600
_DAY_S: Final = 86400


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


def _hour(t: Column) -> Column:
    return F.timestamp_seconds(F.floor(t / _HOUR_S) * _HOUR_S)


def _day(t: Column) -> Column:
    return F.date_from_unix_date(F.floor(t / _DAY_S).cast("int")).cast("string")


def _is(kind: str) -> Column:
    return F.col("ev") == F.lit(kind)


def _ratio(part: str, whole: str) -> Column:
    return F.when(F.col(whole) > 0, F.col(part) / F.col(whole)).otherwise(F.lit(0.0))


def hourly_counts(events: DataFrame) -> DataFrame:
    """Per topic × hour: ``SUMS`` (``COUNTED_EVENTS``, ``bytes``, ``redelivered``,
    ``NEWER_EVENTS``), ``redelivery_ratio``, ``day``."""
    sums = [F.count(F.when(_is(kind), 1)).alias(kind) for kind in COUNTED_EVENTS]
    sums.append(F.coalesce(F.sum(F.when(_is("published"), F.col("size"))), F.lit(0)).alias("bytes"))
    sums.append(F.count(F.when(_is("delivered") & (F.col("attempt") > 1), 1)).alias("redelivered"))
    sums.extend(F.count(F.when(_is(kind), 1)).alias(kind) for kind in NEWER_EVENTS)
    return (
        events.where(F.col("topic").isNotNull())  # old archives' ``deleted`` events carry no topic
        .withColumn("hour_t", F.floor(F.col("t") / _HOUR_S) * _HOUR_S)
        .groupBy("topic", "hour_t")
        .agg(*sums)
        .select(
            "topic",
            _hour(F.col("hour_t")).alias("hour"),
            _day(F.col("hour_t")).alias("day"),
            *SUMS,
            _ratio("redelivered", "delivered").alias("redelivery_ratio"),
        )
    )


def latencies(events: DataFrame, since_t: float | None = None) -> DataFrame:
    """One row per ack at or after ``since_t`` with a known creation time: ``topic``, ``hour``,
    ``latency_ms``.

    Creation times come from every ``published`` event, in the window or before it. One
    shuffle by code brings a message's publish and its acks together (a join would take
    two); a code published twice (two archives of one node) counts once, at its first time.
    """
    wanted = _is("published") | (_is("acked") & _in_window(since_t))
    per_code = (
        events.where(wanted)
        .groupBy("code")
        .agg(
            F.min(F.when(_is("published"), F.col("create_time"))).alias("created"),
            F.collect_list(F.when(_is("acked"), F.struct("topic", "t"))).alias("acks"),  # nulls left out
        )
        .where(F.col("created").isNotNull())
    )
    acks = per_code.select("created", F.explode("acks").alias("ack"))
    return acks.select(
        F.col("ack.topic").alias("topic"),
        _hour(F.col("ack.t")).alias("hour"),
        ((F.col("ack.t") - F.col("created")) * 1000.0).alias("latency_ms"),
    )


def latency_percentiles(latency: DataFrame) -> DataFrame:
    """Per topic × hour, and per topic overall (``hour`` null): p50, p95, p99, max and ``acks``.

    One pass for both levels (two grouping sets): the overall percentiles cannot be
    derived from the hourly ones.
    """
    sketch = F.percentile_approx("latency_ms", list(PERCENTILES.values()), LATENCY_ACCURACY)
    return (
        latency.groupingSets([("topic", "hour"), ("topic",)], "topic", "hour")
        .agg(sketch.alias("ps"), F.max("latency_ms").alias("max"), F.count("*").alias("acks"))
        .select(
            "topic",
            "hour",
            *(F.col("ps")[i].alias(name) for i, name in enumerate(PERCENTILES)),
            "max",
            "acks",
        )
    )


def hourly_table(counts: DataFrame, percentiles: DataFrame) -> DataFrame:
    """``hourly_counts`` with the hour's latency (``latency_p50_ms`` … ``latency_max_ms``; null
    without acks of known creation time)."""
    hourly = percentiles.where(F.col("hour").isNotNull()).select(
        "topic",
        "hour",
        *(F.col(name).alias(f"latency_{name}_ms") for name in (*PERCENTILES, "max")),
    )
    return counts.join(hourly, ["topic", "hour"], "left")


def daily_counts(hourly: DataFrame) -> DataFrame:
    """Per topic × day: the hours' sums, and the day's redelivery ratio."""
    return (
        hourly.groupBy("topic", "day")
        .agg(*(F.sum(name).alias(name) for name in SUMS))
        .withColumn("redelivery_ratio", _ratio("redelivered", "delivered"))
    )


def topic_totals(daily: DataFrame, percentiles: DataFrame) -> DataFrame:
    """Per topic: the days' sums, and the overall latency percentiles."""
    overall = percentiles.where(F.col("hour").isNull()).select(
        "topic", *(F.col(name).alias(f"latency_{name}_ms") for name in (*PERCENTILES, "max"))
    )
    sums = daily.groupBy("topic").agg(*(F.sum(name).alias(name) for name in SUMS))
    return sums.join(overall, "topic", "left")


# ---------------------------------------------------------------------------------------
# summary.json (plain Python on the collected rows: a few per topic and day)

SUMMARY_COUNTS: Final = ("published", "delivered", "acked", "retried", "dead_lettered", "expired")


def _ms(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def summary(
    topics: Iterable[Mapping[str, Any]], days: Iterable[Mapping[str, Any]], generated_at: str
) -> dict[str, Any]:
    """The console's ``summary.json`` from ``topic_totals`` and ``daily_counts`` rows.

    ``{"generated_at", "topics": {t: {counts…, "latency_ms": {"p50", "p95", "p99"}}},
    "days": [{"day", "topic", counts…, "dropped", "bytes", "redelivery_ratio"}]}``,
    days sorted by day then topic; a latency is null where no ack had a known creation time.
    """
    out_topics: dict[str, Any] = {}
    for row in sorted(topics, key=lambda r: str(r["topic"])):
        entry: dict[str, Any] = {name: int(row[name]) for name in SUMMARY_COUNTS}
        entry["latency_ms"] = {name: _ms(row[f"latency_{name}_ms"]) for name in PERCENTILES}
        out_topics[str(row["topic"])] = entry
    out_days = []
    for row in sorted(days, key=lambda r: (str(r["day"]), str(r["topic"]))):
        day: dict[str, Any] = {"day": str(row["day"]), "topic": str(row["topic"])}
        day.update({name: int(row[name]) for name in (*SUMMARY_COUNTS, "dropped", "bytes")})
        day["redelivery_ratio"] = round(float(row["redelivery_ratio"]), 6)
        out_days.append(day)
    return {"generated_at": generated_at, "topics": out_topics, "days": out_days}
