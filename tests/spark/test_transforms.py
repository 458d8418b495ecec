"""Each transform on a few hand-written rows, with the expected result written out."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kapok.analytics import transforms as tf

H = 3600.0
DAY = 86400.0
T0 = datetime(2026, 3, 1, tzinfo=UTC).timestamp()  # a midnight, UTC


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
    assert tf.latencies(events).count() == 0
    none = tf.latency_percentiles(
        spark.createDataFrame([], "topic STRING, hour TIMESTAMP, latency_ms DOUBLE")
    )
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
        frame = tf.latencies(events, since).withColumn("hour_s", F.col("hour").cast("long"))
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
        for r in tf.latency_percentiles(latency).withColumn("hour_s", F.col("hour").cast("long")).collect()
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
    percentiles = tf.latency_percentiles(tf.latencies(events))
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
    assert out == {
        "generated_at": "2026-03-01T00:00:00Z",
        "topics": {"t": {**shown, "latency_ms": {"p50": 1.235, "p95": 1.235, "p99": 1.235}}},
        "days": [
            {"day": "2026-03-01", "topic": "t", **shown, "dropped": 0, "bytes": 0, "redelivery_ratio": 0.0}
        ],
    }
    assert list(out["days"][0])[:3] == ["day", "topic", "published"]
