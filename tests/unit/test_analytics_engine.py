"""The job's rules on a few hand-written lines, with the expected figures written out.

``kapok.analytics.engine`` does the per-event work (reading, counts, each message's
life, durations and their statistics) in plain Python and Arrow, and
``kapok.analytics.transforms`` makes the tables of its figures: both run here in this
process, with no Spark (``engine.figures_of``: one partition of what the job's tasks do).
"""

from __future__ import annotations

import itertools
import json
from bisect import bisect_left
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from kapok.analytics import engine, reading
from kapok.analytics import summary as sm
from kapok.analytics import transforms as tf

H = 3600.0
DAY = 86400.0
T0 = datetime(2026, 3, 1, tzinfo=UTC).timestamp()  # a midnight, UTC


def _lines(*items: dict[str, Any] | str) -> bytes:
    return "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items).encode()


def _figures(
    *items: dict[str, Any] | str, window: str = "hour", since_t: float | None = None
) -> engine.Figures:
    found, _ = engine.figures_of([_lines(*items)], window_s=tf.WINDOWS[window], since_t=since_t)
    return found


def _durations(*items: dict[str, Any], since_t: float | None = None) -> list[tuple[str, str, int, float]]:
    """The durations ``engine.lives`` finds: (topic, metric, window_t, value_ms), sorted."""
    data = _lines(*items)
    starts = engine.merge_starts([reading.scan(data, since_t)])
    rows = engine.lives(reading.read_events(data), window_s=int(H), since_t=since_t, days=None, starts=starts)
    out: list[tuple[str, str, int, float]] = []
    for row in pa.Table.from_batches(list(rows), schema=engine.OUT_FIELDS).to_pylist():
        if row["kind"] == "v":
            values = reading.ipc_table(row["blob"]).to_pylist()
            out.extend((row["topic"], row["metric"], v["window_t"], round(v["value"], 6)) for v in values)
    return sorted(out)


def _stats(rows: list[tuple[str, str, int, float]]) -> dict[tuple[str, str, int | None], tf.StatRow]:
    """``engine.stats`` of duration rows (topic, metric, window_t, value_ms), packed in two
    "v" rows per topic × metric (as two tasks would)."""
    packed = []
    for half, (topic, metric) in itertools.product((0, 1), sorted({(r[0], r[1]) for r in rows})):
        mine = [r for r in rows if (r[0], r[1]) == (topic, metric)][half::2]
        if not mine:
            continue
        table = pa.table({"window_t": [r[2] for r in mine], "value": [r[3] for r in mine]})
        packed.append({"kind": "v", "topic": topic, "metric": metric, "blob": reading.ipc_bytes(table)})
    batch = pa.RecordBatch.from_pylist(packed, schema=engine.OUT_FIELDS)
    found = engine.decode(pa.Table.from_batches(list(engine.stats([batch])), schema=engine.OUT_FIELDS))
    return {(s.topic, s.metric, s.window_t): s for s in found.stats}


def _hourly(found: engine.Figures, window: str = "hour") -> list[dict[str, Any]]:
    return tf.hourly_table(tf.topic_counts(found.counts, window), found.stats)


def _pub(code: str, topic: str, t: float, size: int = 10) -> dict[str, Any]:
    return {"ev": "published", "code": code, "topic": topic, "t": t, "create_time": t, "size": size}


def _ev(kind: str, code: str, topic: str, t: float, **more: Any) -> dict[str, Any]:
    return {"ev": kind, "code": code, "topic": topic, "group": "g", "t": t, **more}


def test_torn_and_foreign_lines_are_counted_not_events() -> None:
    data = _lines(
        _pub("a", "t", T0), '{"ev":"acked","code":"a","to', '{"ev":"acked","t":1', '{"no": 1}', "[1]"
    )
    scan = reading.scan(data, None)
    assert (scan.skipped, scan.events, scan.all_events) == (4, 1, 1)
    assert reading.read_events(data)["code"].to_pylist() == ["a"]


def test_a_field_of_another_type_is_null_and_the_rest_of_the_line_counts() -> None:
    data = _lines(_pub("a", "t", T0), {**_pub("b", "t", T0), "size": "big"}, {"ev": 3, "t": T0}, "")
    table, bad = reading.parse_lines(data)
    assert bad == 0 and table["size"].to_pylist() == [10, None, None]
    assert reading.read_events(data)["code"].to_pylist() == ["a", "b"]  # the third has no ``ev``


def test_line_totals_and_the_events_counted_share_the_window() -> None:
    items = (_pub("a", "t", T0), _pub("b", "t", T0 + 10), _pub("c", "t", T0 + 20))
    scan = reading.scan(_lines(*items), T0 + 10)
    assert (scan.events, scan.all_events, scan.first_t, scan.last_t) == (2, 3, T0, T0 + 20)
    assert _figures(*items, since_t=T0 + 10).events == 2


def test_hourly_counts_count_each_kind_in_the_hour_of_its_own_time() -> None:
    found = _figures(
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
    rows = {(r["topic"], r["window_t"]): r for r in tf.topic_counts(found.counts)}
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
    assert first["hour"] == datetime.fromtimestamp(T0, UTC)
    second = rows[("t", int(T0 + H))]
    assert (second["acked"], second["published"], second["bytes"], second["redelivery_ratio"]) == (
        1,
        0,
        0,
        0.0,
    )
    assert rows[("u", int(T0 + DAY))]["day"] == "2026-03-02"
    assert len(rows) == 3


def test_each_kind_counts_as_itself_requeues_have_no_latency_deletes_are_not_drops() -> None:
    items = (
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
    found = _figures(*items)
    rows = {r["topic"]: r for r in tf.topic_counts(found.counts)}
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
    assert [d for d in _durations(*items) if d[1] == "latency"] == []
    [total] = [r for r in sm.topic_totals(tf.daily_counts(_hourly(found)), found.stats) if r["topic"] == "t"]
    assert (total["deleted"], total["dropped"], total["requeued"]) == (1, 1, 0)


def test_latency_is_ack_minus_creation_in_the_hour_of_the_ack() -> None:
    items = (
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
        return [(t, w, v) for t, metric, w, v in _durations(*items, since_t=since) if metric == "latency"]

    after = [("t", int(T0), 500.0), ("t", int(T0 + H), 3600250.0), ("t", int(T0 + H), 3600500.0)]
    assert rows(None) == [("t", int(T0 - H), 10000.0), *after]
    assert rows(T0) == after  # acks in the window, their publish before it


def test_percentiles_per_hour_and_per_topic_in_one_pass() -> None:
    rows = [("t", "latency", int(T0), float(v)) for v in range(100, 0, -1)]
    rows += [("t", "latency", int(T0 + H), 1000.0), ("u", "latency", int(T0), 7.0)]
    out = _stats(rows)
    assert set(out) == {
        ("t", "latency", int(T0)),
        ("t", "latency", int(T0 + H)),
        ("t", "latency", None),
        ("u", "latency", int(T0)),
        ("u", "latency", None),
    }
    hour = out[("t", "latency", int(T0))]
    assert (*hour.figures, hour.count) == (50.0, 95.0, 99.0, 100.0, 100)
    overall = out[("t", "latency", None)]
    assert (overall.figures[0], overall.figures[2], overall.figures[3], overall.count) == (
        51.0,
        100.0,
        1000.0,
        101,
    )
    assert out[("u", "latency", None)].figures[1] == 7.0


def test_days_and_topics_sum_the_hours_exactly() -> None:
    found = _figures(
        _pub("a", "t", T0 + 10, size=3),
        _pub("b", "t", T0 + H + 10, size=4),
        _ev("delivered", "a", "t", T0 + 20, attempt=1),
        _ev("delivered", "a", "t", T0 + H + 20, attempt=2),
        _ev("acked", "a", "t", T0 + H + 30),
        _pub("c", "t", T0 + DAY, size=5),
    )
    hourly = _hourly(found)
    lat = {r["window_t"]: r["latency_p50_ms"] for r in hourly}
    assert lat == {int(T0): None, int(T0 + H): (H + 20) * 1000.0, int(T0 + DAY): None}
    daily = {r["day"]: r for r in tf.daily_counts(hourly)}
    assert (daily["2026-03-01"]["published"], daily["2026-03-01"]["bytes"]) == (2, 7)
    assert (daily["2026-03-01"]["delivered"], daily["2026-03-01"]["redelivery_ratio"]) == (2, 0.5)
    assert (daily["2026-03-02"]["published"], daily["2026-03-02"]["delivered"]) == (1, 0)
    [total] = sm.topic_totals(tf.daily_counts(hourly), found.stats)
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
    out = sm.summary([topic], [day], "2026-03-01T00:00:00Z")
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
        "consumers": [],
    }
    assert list(out["days"][0])[:3] == ["day", "topic", "published"]
    assert list(out)[:3] == ["generated_at", "topics", "days"]  # the console's keys come first


def test_summary_adds_the_latency_split_histograms_and_each_groups_last_backlog() -> None:
    topic: dict[str, Any] = {"topic": "t", **dict.fromkeys(tf.SUMS, 0)}
    for metric in tf.DURATION_METRICS:
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
    earlier = {**group, "minute": datetime.fromtimestamp(T0, UTC), "ready": 9}
    last = sm.last_windows([earlier, group, {**group, "group": "a", "oldest_unacked_age_s": None}], "minute")
    out = sm.summary([topic], [], "x", last, "minute")
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


def _backlog(
    found: engine.Figures, window_s: int
) -> dict[tuple[str, str, int], tuple[int, int, float | None]]:
    windows = [(c.topic, c.group, c.window_t) for c in found.counts if c.group is not None]
    return tf.backlog(found.parts, window_s, windows)


def test_backlog_at_each_window_end_ready_in_flight_and_oldest_unacked() -> None:
    found = _figures(
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
    rows = _backlog(found, int(H))
    got = {int(window_t - T0) // int(H): figures for (_, _, window_t), figures in rows.items()}
    assert got == {
        0: (2, 1, H - 10),  # a (requeued) and c ready, b in flight; a is the oldest (due T0+10)
        1: (0, 1, 2 * H - 40),  # a acked, c deleted; b still in flight
        2: (0, 0, None),
        3: (1, 0, H),  # d, due at the window's start
    }
    table = tf.group_table(found.counts, rows, {"2026-03-01"})
    counts = {
        int(r["hour"].timestamp() - T0) // int(H): (
            r["delivered"],
            r["retried"],
            r["acked"],
            r["redelivered"],
        )
        for r in table
    }
    assert counts == {0: (2, 1, 0, 0), 1: (1, 0, 1, 1), 2: (0, 0, 1, 0), 3: (0, 0, 0, 0)}
    assert {r["day"] for r in table} == {"2026-03-01"}
    assert tf.group_table(found.counts, rows, {"2026-03-02"}) == []  # only the days counted


def test_backlog_in_minute_windows_and_a_redelivery_without_requeue() -> None:
    # An archive written before ``retried`` covered recovery: a second delivery while in flight.
    found = _figures(
        _pub("a", "t", T0),
        _ev("delivered", "a", "t", T0 + 1, attempt=1),
        _ev("delivered", "a", "t", T0 + 61, attempt=2),
        _ev("acked", "a", "t", T0 + 150),
        window="minute",
    )
    got = {int(window_t - T0): figures for (_, _, window_t), figures in _backlog(found, 60).items()}
    assert got == {0: (0, 1, 60.0), 60: (0, 1, 120.0), 120: (0, 0, None)}


def test_queue_wait_excludes_the_delay_processing_is_from_the_acked_delivery() -> None:
    items = (
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
    rows = _durations(*items)
    assert sorted((metric, round(value, 3)) for _, metric, _, value in rows) == [
        ("delay", 60000.0),
        ("latency", 12000.0),
        ("latency", 30000.0),
        ("latency", 75000.0),
        ("processing", 2000.0),
        ("processing", 5000.0),
        ("queue_wait", 1000.0),
        ("queue_wait", 10000.0),
    ]
    assert {window_t for _, _, window_t, _ in rows} == {int(T0)}
    assert [r for r in _durations(*items, since_t=T0 + 205) if r[1] == "queue_wait"] == []


def test_histograms_count_each_value_in_its_log_spaced_bucket() -> None:
    values = [0.2, 1.0, 1.5, 5000.0, 5000.1, 600000.0, 600001.0, 1e9]
    out = _stats([("t", "latency", int(T0), v) for v in values] + [("t", "delay", int(T0 + H), 3.0)])
    hist = list(out[("t", "latency", int(T0))].hist)
    assert len(hist) == len(tf.HIST_BOUNDS_MS) + 1 == 19
    expected = [0] * 19
    for v in values:
        expected[bisect_left(tf.HIST_BOUNDS_MS, v)] += 1
    assert hist == expected
    assert (hist[0], hist[1], hist[11], hist[12], hist[17], hist[18]) == (2, 1, 1, 1, 1, 2)
    assert list(out[("t", "latency", None)].hist) == hist and out[("t", "latency", None)].count == 8
    delay = out[("t", "delay", None)]
    assert delay.hist[2] == 1 and delay.figures[0] == 3.0


def test_windows_of_a_minute_or_a_day() -> None:
    items = (_pub("a", "t", T0 + 59), _pub("b", "t", T0 + 61), _pub("c", "t", T0 + DAY + 1))
    minutes = {
        int(r["minute"].timestamp() - T0): r["published"]
        for r in tf.topic_counts(_figures(*items, window="minute").counts, "minute")
    }
    assert minutes == {0: 1, 60: 1, int(DAY): 1}
    days = tf.topic_counts(_figures(*items, window="day").counts, "day")
    assert {(int(r["day_start"].timestamp() - T0), r["day"], r["published"]) for r in days} == {
        (0, "2026-03-01", 2),
        (int(DAY), "2026-03-02", 1),
    }
    assert tf.table_names("hour") == ("hourly", "groups") and tf.table_names("minute")[0] == "by_minute"


def test_the_windows_table_carries_the_latency_split_and_delays() -> None:
    found = _figures(
        {**_pub("e", "t", T0 + 100), "deliver_at": T0 + 160},
        _ev("delivered", "e", "t", T0 + 170, attempt=1),
        _ev("acked", "e", "t", T0 + 175),
    )
    [row] = _hourly(found)
    assert (row["latency_p50_ms"], row["queue_wait_p99_ms"], row["processing_max_ms"]) == (
        75000.0,
        10000.0,
        5000.0,
    )
    assert (row["delayed"], row["delay_p50_ms"]) == (1, 60000.0)
    assert row["queue_wait_hist"][bisect_left(tf.HIST_BOUNDS_MS, 10000.0)] == 1
    [total] = sm.topic_totals(tf.daily_counts([row]), found.stats)
    assert (total["delayed"], total["processing_p50_ms"], total["latency_hist"][15]) == (1, 5000.0, 1)


def test_deliveries_per_consumer_and_window() -> None:
    found = _figures(
        _pub("a", "t", T0),
        _ev("delivered", "a", "t", T0 + 1, attempt=1, consumer="alice"),
        _ev("retried", "a", "t", T0 + 2, attempt=1, reason="nack"),
        _ev("delivered", "a", "t", T0 + 3, attempt=2, consumer="bob"),
        _ev("acked", "a", "t", T0 + 4),
        _pub("b", "t", T0 + H),
        _ev("delivered", "b", "t", T0 + H + 1, attempt=1, consumer="alice"),
        _ev("delivered", "c", "t", T0 + H + 2, attempt=1),  # an older archive's: no consumer
    )
    table = tf.consumer_table(found.consumers, {"2026-03-01"})
    assert [
        (r["consumer"], int(r["hour"].timestamp() - T0), r["delivered"], r["redelivered"]) for r in table
    ] == [
        ("alice", 0, 1, 0),
        ("alice", int(H), 1, 0),
        ("bob", 0, 1, 1),
    ]
    assert sm.consumer_totals(table) == [
        {"topic": "t", "group": "g", "consumer": "alice", "delivered": 2, "redelivered": 0},
        {"topic": "t", "group": "g", "consumer": "bob", "delivered": 1, "redelivered": 1},
    ]
    assert tf.consumers_table("hour") == "consumers" and tf.consumers_table("day") == "consumers_by_day"


def test_a_code_has_one_bucket_in_every_file_and_process() -> None:
    codes = pa.array([f"{i:032x}" for i in range(2000)] + [None, "x", ""])
    keys = reading.buckets(codes, 8)
    assert keys.tolist() == reading.buckets(codes, 8).tolist()  # a pure function of the bytes
    assert keys[2000] == 0 and set(keys.tolist()) == set(range(8))
    assert min(list(keys[:2000]).count(k) for k in range(8)) > 2000 / 8 / 2  # spread
    # The same code in a slice of another array (an Arrow offset) gets the same bucket.
    assert reading.buckets(codes.slice(1000, 10), 8).tolist() == keys[1000:1010].tolist()


def test_read_file_gives_its_scan_and_each_event_once_in_its_codes_bucket() -> None:
    items = [_pub(f"c{i}", "t", T0 + i) for i in range(50)] + [
        _ev("acked", f"c{i}", "t", T0 + 60) for i in range(50)
    ]
    data = _lines(*items, "torn")
    batch = reading.read_file("f", data, T0 + 10, 4)
    rows = batch.to_pylist()
    assert rows[0]["kind"] == "scan" and rows[0]["name"] == "f"
    scan = reading.file_scan(rows[0]["blob"])
    assert (scan.skipped, scan.events, scan.all_events) == (1, 90, 100)
    seen: dict[str, int] = {}
    for row in rows[1:]:
        assert row["kind"] == "events"
        for code in reading.ipc_table(row["blob"])["code"].to_pylist():
            assert seen.setdefault(code, row["key"]) == row["key"]
    assert len(seen) == 50 and sum(reading.ipc_table(r["blob"]).num_rows for r in rows[1:]) == 100
    assert reading.read_file("f", data, None, 0).num_rows == 1  # a scan only


def _workload(
    seed: int, messages: int, days: int, groups: tuple[str, ...] = ("g", "h")
) -> list[dict[str, Any]]:
    """A mixed archive over ``days``: ``groups``, retries, dead letters, delays, deletes,
    messages open across midnights and at the end, consumers named."""
    import random

    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(messages):
        code, topic = f"m{i:05d}", f"t{i % 3}"
        t = T0 + rng.random() * days * DAY
        delay = 7200.0 if i % 17 == 0 else 0.0
        out.append({**_pub(code, topic, t), "deliver_at": t + delay})
        if i % 23 == 0:
            out.append({"ev": "deleted", "code": code, "topic": topic, "t": t + 3 * H})
        for group in groups:
            at, attempt = t + delay + rng.expovariate(1 / 600), 1
            while True:
                if rng.random() < 0.03:  # never delivered, or never acked: open at the end
                    break
                out.append({**_ev("delivered", code, topic, at, attempt=attempt), "group": group,
                            "consumer": f"c{i % 2}"})  # fmt: skip
                at += rng.expovariate(1 / 900)  # often across a midnight
                roll = rng.random()
                if roll < 0.1 and attempt < 3:
                    out.append({**_ev("retried", code, topic, at, attempt=attempt), "group": group})
                    attempt += 1
                    continue
                kind = "dead_lettered" if roll < 0.12 else "acked"
                if rng.random() < 0.97:
                    out.append({**_ev(kind, code, topic, at), "group": group})
                break
    rng.shuffle(out)
    return out


def test_a_run_resumed_from_the_carried_events_equals_a_full_run_on_its_days() -> None:
    # A first run reads two files, the second across the second midnight, and carries what a
    # later run needs from that midnight on: every event since, and the events before it of
    # the messages still open then. The later run reads only the new file and what was
    # carried: every figure of its days must be the full run's.
    items = _workload(seed=5, messages=3_000, days=3)
    cut = T0 + DAY  # the second midnight
    before = [item for item in items if item["t"] < cut]
    later = [item for item in items if item["t"] >= cut]
    half = len(later) // 2
    old = [_lines(*before[100:]), _lines(*before[:100], *later[:half])]  # the second spans the midnight
    new = [_lines(*later[half:])]
    window_s = int(H)
    full, _ = engine.figures_of([*old, *new], window_s=window_s)
    first, scans = engine.figures_of(old, window_s=window_s, carry_t=cut)
    carried = first.carry.to_pylist()
    after = [event for event in carried if event["t"] >= cut]
    assert len(after) == half  # every event since the midnight
    open_codes = {event["code"] for event in carried if event["t"] < cut}
    assert 0 < len(open_codes) < 3_000 // 10  # of the time before, a few messages open then, not all
    days = sorted({datetime.fromtimestamp(item["t"], UTC).strftime("%Y-%m-%d") for item in later})
    resumed, _ = engine.figures_of(
        new,
        window_s=window_s,
        since_t=cut,
        days=days,
        carried=first.carry,
        starts=engine.merge_starts(scans),
    )
    assert resumed.events == len(later)

    def in_days(rows: list[Any]) -> list[Any]:
        return sorted((r for r in rows if r.window_t is not None and r.window_t >= cut), key=repr)

    assert in_days(resumed.counts) == in_days(full.counts)
    assert in_days(resumed.consumers) == in_days(full.consumers)
    assert in_days(resumed.stats) == in_days(full.stats) and in_days(full.stats)
    full_backlog = {k: v for k, v in _backlog(full, window_s).items() if k[2] >= cut}
    resumed_backlog = {k: v for k, v in _backlog(resumed, window_s).items() if k[2] >= cut}
    assert resumed_backlog == full_backlog
    assert any(ready or flying for ready, flying, _ in full_backlog.values())


@pytest.mark.parametrize("groups", [("g",), ("g", "h")], ids=["one group", "two groups"])
@pytest.mark.parametrize("window", ["minute", "hour"])
def test_the_common_messages_arrays_give_what_their_walk_gives(groups: tuple[str, ...], window: str) -> None:
    # Most messages of one group live the common life (published, delivered, acked), which
    # ``kapok.analytics.common`` figures in arrays; walking every message must agree to the bit.
    data = _lines(*_workload(seed=9, messages=4_000, days=2, groups=groups))
    events, starts = reading.read_events(data), engine.merge_starts([reading.scan(data, None)])
    cut = T0 + DAY

    def figures(walk_all: bool, since_t: float | None) -> engine.Figures:
        rows = engine.lives(
            events,
            window_s=tf.WINDOWS[window],
            since_t=since_t,
            days=None,
            starts=starts,
            carry_t=cut,
            walk_all=walk_all,
        )
        return engine.decode(pa.Table.from_batches(list(engine.stats(rows)), schema=engine.OUT_FIELDS))

    for since_t in (None, cut + 600):
        walked, fast = figures(True, since_t), figures(False, since_t)
        assert sorted(fast.parts, key=repr) == sorted(walked.parts, key=repr) and walked.parts
        assert sorted(fast.stats, key=repr) == sorted(walked.stats, key=repr) and walked.stats
        assert sorted(fast.carry.to_pylist(), key=repr) == sorted(walked.carry.to_pylist(), key=repr)
        assert walked.carry.num_rows


@pytest.mark.parametrize("collide", [False, True], ids=["hashed", "every hash the same"])
def test_unique_keeps_one_of_each_copy_and_rows_that_share_only_a_hash(
    collide: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kapok.analytics import unique as uq

    if collide:  # as if every row's hash collided: the exact grouping alone decides
        monkeypatch.setattr(uq, "_hashes", lambda events: np.zeros(events.num_rows, dtype=np.uint64))
    lines = [
        _pub("a", "t", T0),
        _ev("delivered", "a", "t", T0 + 1, attempt=1),
        _ev("acked", "a", "t", T0 + 2),
    ]
    other = {**_ev("delivered", "a", "t", T0 + 1, attempt=1), "consumer": "c1"}  # one field apart
    events = reading.read_events(_lines(*lines, *lines, lines[0], other, {**lines[0], "size": None}))
    kept = uq.unique(events)
    assert kept.num_rows == 5  # the three, the one with a consumer, the one without a size
    assert sorted(map(repr, kept.to_pylist())) == sorted(map(repr, reading.read_events(
        _lines(*lines, other, {**lines[0], "size": None})
    ).to_pylist()))  # fmt: skip
