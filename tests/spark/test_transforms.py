"""Each transform on a few hand-written rows, with the expected result written out."""

from __future__ import annotations

import json
from bisect import bisect_left
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kapok.analytics import lifecycle as lc
from kapok.analytics import transforms as tf

H = 3600.0
DAY = 86400.0
T0 = datetime(2026, 3, 1, tzinfo=UTC).timestamp()  # a midnight, UTC


def _latencies(events: DataFrame, since_t: float | None = None) -> DataFrame:
    """One row per ack at or after ``since_t`` with a known creation time: ``topic``,
    ``hour``, ``latency_ms`` (the end-to-end latencies of ``lifecycle.durations``)."""
    msgs = lc.messages(events)
    rows = lc.durations(lc.entries(msgs, lc.group_starts(msgs)), msgs, tf.WINDOWS["hour"], since_t)
    return rows.where(F.col("metric") == "latency").select(
        "topic", F.timestamp_seconds("window_t").alias("hour"), F.col("value_ms").alias("latency_ms")
    )


def _latency_percentiles(latency: DataFrame) -> DataFrame:
    """``tf.duration_stats`` of ``_latencies``' rows, with ``hour`` (null overall) and ``acks``."""
    rows = latency.select(
        "topic",
        F.col("hour").cast("long").alias("window_t"),
        F.lit("latency").alias("metric"),
        F.col("latency_ms").alias("value_ms"),
    )
    stats = tf.duration_stats(rows)
    return stats.select("*", F.timestamp_seconds("window_t").alias("hour"), F.col("count").alias("acks"))


def _rows(spark: SparkSession, *items: dict[str, Any] | str) -> DataFrame:
    """Archive lines as the job reads them (Spark's JSON reader, the event schema)."""
    values = [item if isinstance(item, str) else json.dumps(item) for item in items]
    return spark.read.schema(tf.EVENT_SCHEMA).json(spark.sparkContext.parallelize(values, 1))


def _events(spark: SparkSession, *items: dict[str, Any]) -> DataFrame:
    return tf.events_only(_rows(spark, *items))


def _pub(code: str, topic: str, t: float, size: int = 10) -> dict[str, Any]:
    return {"ev": "published", "code": code, "topic": topic, "t": t, "create_time": t, "size": size}


def _ev(kind: str, code: str, topic: str, t: float, **more: Any) -> dict[str, Any]:
    return {"ev": kind, "code": code, "topic": topic, "group": "g", "t": t, **more}


def test_torn_and_foreign_lines_are_counted_not_events(spark: SparkSession) -> None:
    rows = _rows(
        spark, _pub("a", "t", T0), '{"ev":"acked","code":"a","to', '{"ev":"acked","t":1', '{"no": 1}', "[1]"
    )
    totals = rows.agg(*tf.line_metrics(None)).first()
    assert totals is not None
    assert (totals["skipped"], totals["events"], totals["all_events"]) == (4, 1, 1)
    assert [r["code"] for r in tf.events_only(rows).collect()] == ["a"]


def test_line_metrics_and_events_since_share_the_window(spark: SparkSession) -> None:
    rows = _rows(spark, _pub("a", "t", T0), _pub("b", "t", T0 + 10), _pub("c", "t", T0 + 20))
    totals = rows.agg(*tf.line_metrics(T0 + 10)).first()
    assert totals is not None and (totals["events"], totals["all_events"]) == (2, 3)
    assert sorted(r["code"] for r in tf.events_since(tf.events_only(rows), T0 + 10).collect()) == ["b", "c"]


def test_hourly_counts_count_each_kind_in_the_hour_of_its_own_time(spark: SparkSession) -> None:
    events = _events(
        spark,
        _pub("a", "t", T0 + 10, size=100),
        _ev("delivered", "a", "t", T0 + 11, attempt=1),
        _ev("retried", "a", "t", T0 + 12, reason="nack"),
        _ev("delivered", "a", "t", T0 + 13, attempt=2),
        _ev("acked", "a", "t", T0 + H + 1),  # next hour
        _pub("b", "t", T0 + 20, size=5),
        _ev("dead_lettered", "b", "t", T0 + 30, reason="rejected"),
        _ev("expired", "c", "t", T0 + 40),
        _ev("dropped", "d", "t", T0 + 50),
        {"ev": "deleted", "code": "a", "t": T0 + 60},  # no topic: not counted
        _pub("x", "u", T0 + DAY + 5, size=7),  # another topic, the next day
    )
    rows = {
        (r["topic"], int(r["hour_s"])): r.asDict()
        for r in tf.hourly_counts(events).withColumn("hour_s", F.col("hour").cast("long")).collect()
    }
    first = rows[("t", int(T0))]
    assert {k: first[k] for k in (*tf.COUNTED_EVENTS, "bytes", "redelivered")} == {
        "published": 2,
        "delivered": 2,
        "acked": 0,
        "retried": 1,
        "dead_lettered": 1,
        "expired": 1,
        "dropped": 1,
        "bytes": 105,
        "redelivered": 1,
    }
    assert first["redelivery_ratio"] == 0.5 and first["day"] == "2026-03-01"
    second = rows[("t", int(T0 + H))]
    assert (second["acked"], second["published"], second["bytes"], second["redelivery_ratio"]) == (
        1,
        0,
        0,
        0.0,
    )
    assert rows[("u", int(T0 + DAY))]["day"] == "2026-03-02"
    assert len(rows) == 3


def test_each_kind_counts_as_itself_requeues_have_no_latency_deletes_are_not_drops(
    spark: SparkSession,
) -> None:
    events = _events(
        spark,
        _pub("a", "t", T0),
        _ev("delivered", "a", "t", T0 + 1, attempt=1),
        _ev("retried", "a", "t", T0 + 2, reason="recovery", attempt=1),
        _ev("expired", "a", "t", T0 + 3),  # mq.expired: dead_letter writes both
        _ev("dead_lettered", "a", "t", T0 + 3, reason="expired"),
        _pub("d", "t.dlq", T0 + 3),
        _ev("requeued", "d", "t.dlq", T0 + 4),  # published again to t: not an ack
        _pub("b", "t", T0 + 4),
        {"ev": "deleted", "code": "b", "topic": "t", "t": T0 + 5},  # one per message, no drop
        _ev("dropped", "c", "t", T0 + 6),  # overflow
        {"ev": "deleted", "code": "old", "t": T0 + 7},  # an old archive's: no topic, not counted
    )
    rows = {r["topic"]: r.asDict() for r in tf.hourly_counts(events).collect()}
    names = ("published", "acked", "retried", "dead_lettered", "expired", "dropped", "requeued", "deleted")
    assert {k: rows["t"][k] for k in names} == {
        "published": 2,
        "acked": 0,
        "retried": 1,
        "dead_lettered": 1,
        "expired": 1,
        "dropped": 1,
        "requeued": 0,
        "deleted": 1,
    }
    assert (rows["t.dlq"]["requeued"], rows["t.dlq"]["acked"]) == (1, 0)
    assert _latencies(events).count() == 0
    none = _latency_percentiles(spark.createDataFrame([], "topic STRING, hour TIMESTAMP, latency_ms DOUBLE"))
    hourly = tf.hourly_table(tf.hourly_counts(events), none)
    [total] = tf.topic_totals(tf.daily_counts(hourly), none).where(F.col("topic") == "t").collect()
    assert (total["deleted"], total["dropped"], total["requeued"]) == (1, 1, 0)


def test_latency_is_ack_minus_creation_in_the_hour_of_the_ack(spark: SparkSession) -> None:
    events = _events(
        spark,
        _pub("a", "t", T0),
        _pub("b", "t", T0 + 1.5),
        _pub("b", "t", T0 + 1.5),  # the same archive read twice: one latency
        _ev("acked", "a", "t", T0 + H + 0.25),
        {**_ev("acked", "a", "t", T0 + H + 0.5), "group": "other"},
        _ev("acked", "b", "t", T0 + 2.0),
        _ev("acked", "lost", "t", T0 + 3.0),  # its publish aged out: no latency
        _ev("acked", "early", "t", T0 - 10.0),
        _pub("early", "t", T0 - 20.0),
        _ev("delivered", "a", "t", T0 + 1.0, attempt=1),
    )

    def rows(since: float | None) -> list[tuple[str, int, float]]:
        frame = _latencies(events, since).withColumn("hour_s", F.col("hour").cast("long"))
        return sorted((r["topic"], int(r["hour_s"]), round(r["latency_ms"], 6)) for r in frame.collect())

    after = [("t", int(T0), 500.0), ("t", int(T0 + H), 3600250.0), ("t", int(T0 + H), 3600500.0)]
    assert rows(None) == [("t", int(T0 - H), 10000.0), *after]
    assert rows(T0) == after  # acks in the window, their publish before it


def test_percentiles_per_hour_and_per_topic_in_one_pass(spark: SparkSession) -> None:
    rows = [("t", datetime.fromtimestamp(T0, UTC), float(v)) for v in range(1, 101)]
    rows += [("t", datetime.fromtimestamp(T0 + H, UTC), 1000.0), ("u", datetime.fromtimestamp(T0, UTC), 7.0)]
    latency = spark.createDataFrame(rows, "topic STRING, hour TIMESTAMP, latency_ms DOUBLE")
    out = {
        (r["topic"], None if r["hour_s"] is None else int(r["hour_s"])): r.asDict()
        for r in _latency_percentiles(latency).withColumn("hour_s", F.col("hour").cast("long")).collect()
    }
    assert set(out) == {("t", int(T0)), ("t", int(T0 + H)), ("t", None), ("u", int(T0)), ("u", None)}
    hour = out[("t", int(T0))]
    assert (hour["p50"], hour["p95"], hour["p99"], hour["max"], hour["acks"]) == (
        50.0,
        95.0,
        99.0,
        100.0,
        100,
    )
    overall = out[("t", None)]
    assert (overall["p50"], overall["p99"], overall["max"], overall["acks"]) == (51.0, 100.0, 1000.0, 101)
    assert out[("u", None)]["p95"] == 7.0


def test_days_and_topics_sum_the_hours_exactly(spark: SparkSession) -> None:
    events = _events(
        spark,
        _pub("a", "t", T0 + 10, size=3),
        _pub("b", "t", T0 + H + 10, size=4),
        _ev("delivered", "a", "t", T0 + 20, attempt=1),
        _ev("delivered", "a", "t", T0 + H + 20, attempt=2),
        _ev("acked", "a", "t", T0 + H + 30),
        _pub("c", "t", T0 + DAY, size=5),
    )
    percentiles = _latency_percentiles(_latencies(events))
    hourly = tf.hourly_table(tf.hourly_counts(events), percentiles)
    lat = {
        int(r["h"]): r["latency_p50_ms"] for r in hourly.withColumn("h", F.col("hour").cast("long")).collect()
    }
    assert lat == {int(T0): None, int(T0 + H): (H + 20) * 1000.0, int(T0 + DAY): None}
    daily = {r["day"]: r.asDict() for r in tf.daily_counts(hourly).collect()}
    assert (daily["2026-03-01"]["published"], daily["2026-03-01"]["bytes"]) == (2, 7)
    assert (daily["2026-03-01"]["delivered"], daily["2026-03-01"]["redelivery_ratio"]) == (2, 0.5)
    assert (daily["2026-03-02"]["published"], daily["2026-03-02"]["delivered"]) == (1, 0)
    [total] = tf.topic_totals(tf.daily_counts(hourly), percentiles).collect()
    assert (total["published"], total["bytes"], total["acked"]) == (3, 12, 1)
    assert total["latency_p99_ms"] == (H + 20) * 1000.0


def test_summary_has_the_consoles_shape() -> None:
    counts = dict.fromkeys(tf.SUMS, 0)
    topic = {
        "topic": "t",
        **counts,
        "published": 3,
        **{f"latency_{p}_ms": 1.23456 for p in ("p50", "p95", "p99")},
    }
    topic["latency_max_ms"] = 9.0
    day = {"topic": "t", "day": "2026-03-01", **counts, "published": 3, "redelivery_ratio": 0.0}
    out = tf.summary([topic], [day], "2026-03-01T00:00:00Z")
    shown = {"published": 3, "delivered": 0, "acked": 0, "retried": 0, "dead_lettered": 0, "expired": 0}
    no_ms = {"p50": None, "p95": None, "p99": None}
    assert out == {
        "generated_at": "2026-03-01T00:00:00Z",
        "topics": {
            "t": {
                **shown,
                "latency_ms": {"p50": 1.235, "p95": 1.235, "p99": 1.235},
                "queue_wait_ms": no_ms,
                "processing_ms": no_ms,
                "delay_ms": no_ms,
                "delayed": 0,
                "histograms": {"latency": None, "queue_wait": None, "processing": None, "delay": None},
            }
        },
        "days": [
            {"day": "2026-03-01", "topic": "t", **shown, "dropped": 0, "bytes": 0, "redelivery_ratio": 0.0}
        ],
        "window": "hour",
        "histogram_bounds_ms": list(tf.HIST_BOUNDS_MS),
        "groups": [],
    }
    assert list(out["days"][0])[:3] == ["day", "topic", "published"]
    assert list(out)[:3] == ["generated_at", "topics", "days"]  # the console's keys come first


def test_summary_adds_the_latency_split_histograms_and_each_groups_last_backlog() -> None:
    topic: dict[str, Any] = {"topic": "t", **dict.fromkeys(tf.SUMS, 0)}
    for metric in lc.DURATION_METRICS:
        topic.update({f"{metric}_{p}_ms": 2.0 for p in ("p50", "p95", "p99", "max")})
        topic[f"{metric}_hist"] = [0] * 18 + [1]
    topic.update(delayed=4, queue_wait_p99_ms=7.00049)
    group = {
        "topic": "t",
        "group": "g",
        "minute": datetime.fromtimestamp(T0 + 60, UTC),
        "ready": 5,
        "in_flight": 2,
        "oldest_unacked_age_s": 90.12345,
        **dict.fromkeys(tf.GROUP_SUMS, 1),
    }
    out = tf.summary(
        [topic], [], "x", [group, {**group, "group": "a", "oldest_unacked_age_s": None}], "minute"
    )
    entry = out["topics"]["t"]
    assert entry["queue_wait_ms"] == {"p50": 2.0, "p95": 2.0, "p99": 7.0}
    assert (entry["delayed"], entry["histograms"]["delay"]) == (4, [0] * 18 + [1])
    assert out["window"] == "minute"
    assert out["groups"] == [
        {
            "topic": "t",
            "group": "a",
            "window_start": "2026-03-01T00:01:00Z",
            "ready": 5,
            "in_flight": 2,
            "oldest_unacked_age_s": None,
            **dict.fromkeys(tf.GROUP_SUMS, 1),
        },
        {
            "topic": "t",
            "group": "g",
            "window_start": "2026-03-01T00:01:00Z",
            "ready": 5,
            "in_flight": 2,
            "oldest_unacked_age_s": 90.123,
            **dict.fromkeys(tf.GROUP_SUMS, 1),
        },
    ]


def _figures(spark: SparkSession, window: str, *items: dict[str, Any]) -> tuple[DataFrame, DataFrame]:
    """The job's per-code figures: (entries, messages)."""
    msgs = lc.messages(_events(spark, *items))
    return lc.entries(msgs, lc.group_starts(msgs)), msgs


def test_backlog_at_each_window_end_ready_in_flight_and_oldest_unacked(spark: SparkSession) -> None:
    items = (
        _pub("a", "t", T0 + 10),
        _ev("delivered", "a", "t", T0 + 20, attempt=1),
        _ev("retried", "a", "t", T0 + 30, attempt=1, reason="nack"),
        _pub("b", "t", T0 + 40),
        _ev("delivered", "b", "t", T0 + 50, attempt=1),
        _pub("c", "t", T0 + 60),  # never delivered in g: assumed ready there (after g's start)
        _ev("delivered", "a", "t", T0 + H + 5, attempt=2),
        _ev("acked", "a", "t", T0 + H + 10),
        {"ev": "deleted", "code": "c", "topic": "t", "t": T0 + H + 30},  # its open entry ends
        _ev("acked", "b", "t", T0 + 2 * H + 1),  # in flight across two window ends
        _pub("d", "t", T0 + 3 * H),  # still ready at the input's end
        _pub("z", "t", T0 + 5),  # before g's first event, never touched: not g's
    )
    entries, _ = _figures(spark, "hour", *items)
    grouped = tf.group_counts(_events(spark, *items))
    rows = lc.backlog(entries, int(H), grouped.where(F.col("group").isNotNull()))
    got = {
        int(r["window_t"] - T0) // int(H): (r["ready"], r["in_flight"], r["oldest_unacked_age_s"])
        for r in rows.collect()
    }
    assert got == {
        0: (2, 1, H - 10),  # a (requeued) and c ready, b in flight; a is the oldest (due T0+10)
        1: (0, 1, 2 * H - 40),  # a acked, c deleted; b still in flight
        2: (0, 0, None),
        3: (1, 0, H),  # d, due at the window's start
    }
    table = tf.group_table(grouped, rows, tf.hourly_counts(_events(spark, *items)))
    counts = {
        int(r["hour"].timestamp() - T0) // int(H): (
            r["delivered"],
            r["retried"],
            r["acked"],
            r["redelivered"],
        )
        for r in table.collect()
    }
    assert counts == {0: (2, 1, 0, 0), 1: (1, 0, 1, 1), 2: (0, 0, 1, 0), 3: (0, 0, 0, 0)}
    assert {r["day"] for r in table.collect()} == {"2026-03-01"}


def test_backlog_in_minute_windows_and_a_redelivery_without_requeue(spark: SparkSession) -> None:
    # An archive written before ``retried`` covered recovery: a second delivery while in flight.
    entries, _ = _figures(
        spark,
        "minute",
        _pub("a", "t", T0),
        _ev("delivered", "a", "t", T0 + 1, attempt=1),
        _ev("delivered", "a", "t", T0 + 61, attempt=2),
        _ev("acked", "a", "t", T0 + 150),
    )
    got = {
        int(r["window_t"] - T0): (r["ready"], r["in_flight"], r["oldest_unacked_age_s"])
        for r in lc.backlog(entries, 60).collect()
    }
    assert got == {0: (0, 1, 60.0), 60: (0, 1, 120.0), 120: (0, 0, None)}


def test_queue_wait_excludes_the_delay_processing_is_from_the_acked_delivery(spark: SparkSession) -> None:
    entries, msgs = _figures(
        spark,
        "hour",
        {**_pub("e", "t", T0 + 100), "deliver_at": T0 + 160},  # published with a 60 s delay
        _ev("delivered", "e", "t", T0 + 170, attempt=1),
        _ev("acked", "e", "t", T0 + 175),
        {**_pub("f", "t", T0 + 200), "deliver_at": T0 + 200},  # no delay
        _ev("delivered", "f", "t", T0 + 201, attempt=1),
        _ev("retried", "f", "t", T0 + 203, attempt=1, reason="timeout"),
        _ev("delivered", "f", "t", T0 + 210, attempt=2),
        _ev("acked", "f", "t", T0 + 212),
        _ev("acked", "f", "t", T0 + 230, group="other"),  # no delivery of its own in the input
    )
    rows = lc.durations(entries, msgs, int(H), None).collect()
    got = sorted((r["metric"], round(r["value_ms"], 3)) for r in rows)
    assert got == [
        ("delay", 60000.0),
        ("latency", 12000.0),
        ("latency", 30000.0),
        ("latency", 75000.0),
        ("processing", 2000.0),
        ("processing", 5000.0),
        ("queue_wait", 1000.0),
        ("queue_wait", 10000.0),
    ]
    assert {int(r["window_t"]) for r in rows} == {int(T0)}
    assert lc.durations(entries, msgs, int(H), T0 + 205).where(F.col("metric") == "queue_wait").count() == 0


def test_histograms_count_each_value_in_its_log_spaced_bucket(spark: SparkSession) -> None:
    values = [0.2, 1.0, 1.5, 5000.0, 5000.1, 600000.0, 600001.0, 1e9]
    rows = [("t", int(T0), "latency", v) for v in values] + [("t", int(T0 + H), "delay", 3.0)]
    stats = tf.duration_stats(
        spark.createDataFrame(rows, "topic STRING, window_t LONG, metric STRING, value_ms DOUBLE")
    )
    out = {(r["metric"], r["window_t"]): r.asDict() for r in stats.collect()}
    hist = out[("latency", int(T0))]["hist"]
    assert len(hist) == len(tf.HIST_BOUNDS_MS) + 1 == 19
    expected = [0] * 19
    for v in values:
        expected[bisect_left(tf.HIST_BOUNDS_MS, v)] += 1
    assert hist == expected
    assert (hist[0], hist[1], hist[11], hist[12], hist[17], hist[18]) == (2, 1, 1, 1, 1, 2)
    assert out[("latency", None)]["hist"] == hist and out[("latency", None)]["count"] == 8
    assert out[("delay", None)]["hist"][2] == 1 and out[("delay", None)]["p50"] == 3.0


def test_windows_of_a_minute_or_a_day(spark: SparkSession) -> None:
    events = _events(spark, _pub("a", "t", T0 + 59), _pub("b", "t", T0 + 61), _pub("c", "t", T0 + DAY + 1))
    minutes = {
        int(r["minute"].timestamp() - T0): r["published"]
        for r in tf.hourly_counts(events, "minute").collect()
    }
    assert minutes == {0: 1, 60: 1, int(DAY): 1}
    days = tf.hourly_counts(events, "day").collect()
    assert {(int(r["day_start"].timestamp() - T0), r["day"], r["published"]) for r in days} == {
        (0, "2026-03-01", 2),
        (int(DAY), "2026-03-02", 1),
    }
    assert tf.table_names("hour") == ("hourly", "groups") and tf.table_names("minute")[0] == "by_minute"


def test_the_windows_table_carries_the_latency_split_and_delays(spark: SparkSession) -> None:
    items = (
        {**_pub("e", "t", T0 + 100), "deliver_at": T0 + 160},
        _ev("delivered", "e", "t", T0 + 170, attempt=1),
        _ev("acked", "e", "t", T0 + 175),
    )
    entries, msgs = _figures(spark, "hour", *items)
    stats = tf.duration_stats(lc.durations(entries, msgs, int(H), None))
    [row] = tf.hourly_table(tf.hourly_counts(_events(spark, *items)), stats).collect()
    assert (row["latency_p50_ms"], row["queue_wait_p99_ms"], row["processing_max_ms"]) == (
        75000.0,
        10000.0,
        5000.0,
    )
    assert (row["delayed"], row["delay_p50_ms"]) == (1, 60000.0)
    assert row["queue_wait_hist"][bisect_left(tf.HIST_BOUNDS_MS, 10000.0)] == 1
    [total] = tf.topic_totals(
        tf.daily_counts(tf.hourly_table(tf.hourly_counts(_events(spark, *items)), stats)), stats
    ).collect()
    assert (total["delayed"], total["processing_p50_ms"], total["latency_hist"][15]) == (1, 5000.0, 1)
