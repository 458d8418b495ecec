"""The Analytics page's data: from the analytics job's summary.json, or from held messages."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson

from kapok.config import Config, load_config
from kapok.console.analytics import from_messages, from_summary, last_days, read_summary, summary_path
from kapok.core.broker import Broker
from kapok.core.model import Draft

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC).timestamp()
DAY = 86400.0


def test_the_last_week_ends_today_in_utc() -> None:
    assert last_days(NOW) == [f"2026-03-{d:02d}" for d in range(4, 11)]


def test_the_summary_path_is_configurable() -> None:
    assert summary_path(Config.default()) == Path("./data/analytics/summary.json")
    cfg = load_config(None, overrides=["console.analytics_dir=/srv/out"], env={})
    assert summary_path(cfg) == Path("/srv/out/summary.json")


def summary() -> dict[str, object]:
    """The shape the analytics job writes."""
    return {
        "generated_at": NOW - 3600,
        "topics": {
            "orders": {"published": 30, "delivered": 33, "acked": 29, "retried": 3, "dead_lettered": 1,
                       "expired": 0, "latency_ms": {"p50": 4.5, "p95": 20.0, "p99": 80.25}},
            "audit": {"published": 5, "delivered": 5, "acked": 5, "retried": 0, "dead_lettered": 0,
                      "expired": 0},
            "broken": "not an object",
        },
        "days": [
            {"day": "2026-03-10", "topic": "orders", "published": 10},
            {"day": "2026-03-09", "topic": "orders", "published": 20},
            {"day": "2026-03-09", "topic": "audit", "published": 5},
            {"day": "2026-02-01", "topic": "orders", "published": 99},  # older than a week
            {"day": "2026-03-08", "topic": "orders", "published": "many"},  # wrong type: skipped
            "junk",
        ],
    }  # fmt: skip


def test_from_summary_keeps_the_week_and_skips_bad_items() -> None:
    data = from_summary(summary(), NOW)
    assert data["source"] == "summary" and data["generated"] == "2026-03-10 11:00:00 UTC"
    growth = {s["name"]: s["values"] for s in data["growth"]["series"]}
    assert growth == {"audit": [0, 0, 0, 0, 0, 5, 0], "orders": [0, 0, 0, 0, 0, 20, 10]}
    assert data["growth"]["x"] == last_days(NOW) and data["growth"]["unit"] == "messages / day"
    assert data["latency"] == [{"topic": "orders", "p50": 4.5, "p95": 20.0, "p99": 80.25}]
    assert data["latency_chart"]["categories"] == ["orders"]
    assert [t["topic"] for t in data["totals"]] == ["audit", "orders"]


def test_read_summary_says_why_a_file_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    assert read_summary(path) == (None, "")  # no file: no complaint, the node's view is shown
    path.write_bytes(b"{not json")
    data, why = read_summary(path)
    assert data is None and "not valid JSON" in why
    path.write_bytes(b"[1, 2]")
    assert "not an analytics summary" in read_summary(path)[1]
    path.write_bytes(orjson.dumps(summary()))
    data, why = read_summary(path)
    assert why == "" and data is not None and "orders" in data["topics"]


def test_from_messages_counts_held_messages_per_day_and_measures_acks() -> None:
    broker = Broker(Config.default().mq.settings())
    broker.publish([Draft("t", b"old")], NOW - 2 * DAY)
    broker.publish([Draft("t", b"a"), Draft("t", b"b")], NOW - 10)
    consumer = broker.subscribe("t", now=NOW - 10)
    delivered = [e.msg.code for e in broker.take_pushes()[consumer.id]]
    broker.ack(consumer.id, delivered[:2], NOW)  # two acks: 2 days and 10 s after creation
    data = from_messages(broker.messages.newest_first(), NOW)
    assert data["source"] == "node" and data["scanned"] == 3 and not data["truncated"]
    assert {s["name"]: s["values"] for s in data["growth"]["series"]} == {"t": [0, 0, 0, 0, 1, 0, 2]}
    (latency,) = data["latency"]
    assert latency["topic"] == "t" and latency["p50"] == 10_000.0 and latency["p99"] == 2 * DAY * 1000
    (totals,) = data["totals"]
    assert totals["published"] == 3 and totals["acked"] == 2 and totals["delivered"] == 3
