"""Acceptance 1: the job's every count and percentile against plain Python on the same files.

Two archives: one written by hand (every event kind, three topics, three days, many
hours, a second group, acks whose publish aged out, torn last lines, an empty file),
and one made by a real ``kapok serve`` that processed 3,000 messages with nacks,
redeliveries (lease timeouts among them) and dead letters. The job runs through the
CLI (``kapok analytics --input <storage dir>``, on the test run's session) and
directly with ``--since``; the reference below is plain Python.
"""

from __future__ import annotations

import json
import math
import random
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kapok.analytics.job import run_job
from kapok.analytics.transforms import GROUP_SUMS, PERCENTILES
from kapok.cli import main
from kapok.config import Config, load_config
from kapok.console import analytics as console_analytics
from kapok.errors import AnalyticsError
from kapok.launch import start_node, wait_for
from kapok.testing.slow import scaled

# ---------------------------------------------------------------------------------------
# The reference: plain Python

COUNTED = ("published", "delivered", "acked", "retried", "dead_lettered", "expired", "dropped")


@dataclass
class Expected:
    skipped: int = 0
    events: int = 0
    hourly: dict[tuple[str, int], Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    hourly_latency: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    topic_latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # Per group, and the latency split (queue wait, processing) per topic.
    groups: dict[tuple[str, str, int], Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    split: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    # Deliveries per consumer: (topic, group, consumer, hour) → delivered, redelivered.
    consumers: dict[tuple[str, str, str, int], Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter)
    )

    def daily(self) -> dict[tuple[str, str], Counter[str]]:
        out: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        for (topic, hour), counts in self.hourly.items():
            out[(topic, day_of(hour))].update(counts)
        return out

    def topics(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for (topic, _), counts in self.hourly.items():
            out[topic].update(counts)
        return out


def day_of(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def read_events(paths: Iterable[Path]) -> tuple[list[dict[str, Any]], int]:
    """Every line that is a JSON object with ``ev`` and ``t``; and how many lines were not."""
    events: list[dict[str, Any]] = []
    skipped = 0
    for path in paths:
        for line in path.read_bytes().split(b"\n"):
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                skipped += 1
                continue
            if isinstance(event, dict) and isinstance(event.get("ev"), str) and event.get("t") is not None:
                events.append(event)
            else:
                skipped += 1
    return events, skipped


def expected_from(paths: Iterable[Path], since: float | None = None) -> Expected:
    everything, skipped = read_events(paths)
    out = Expected(skipped=skipped)
    created: dict[str, float] = {}
    for event in everything:
        if event["ev"] == "published":
            created[event["code"]] = min(created.get(event["code"], math.inf), event["create_time"])
    _split(everything, created, since, out)
    for event in everything:
        t = float(event["t"])
        if since is not None and t < since:
            continue
        out.events += 1
        if "group" in event:
            counts = out.groups[(event["topic"], event["group"], int(t // 3600) * 3600)]
            counts[event["ev"]] += 1
            counts["redelivered"] += event["ev"] == "delivered" and event["attempt"] > 1
            if event["ev"] == "delivered" and event.get("consumer"):
                mine = out.consumers[
                    (event["topic"], event["group"], event["consumer"], int(t // 3600) * 3600)
                ]
                mine["delivered"] += 1
                mine["redelivered"] += event["attempt"] > 1
        if "topic" not in event:
            continue
        key = (event["topic"], int(t // 3600) * 3600)
        counts = out.hourly[key]
        kind = event["ev"]
        if kind in COUNTED:
            counts[kind] += 1
        if kind == "published":
            counts["bytes"] += event["size"]
        if kind == "delivered" and event["attempt"] > 1:
            counts["redelivered"] += 1
        if kind == "acked" and event["code"] in created:
            latency = (t - created[event["code"]]) * 1000.0
            out.hourly_latency[key].append(latency)
            out.topic_latency[event["topic"]].append(latency)
    return out


def _split(
    everything: list[dict[str, Any]], created: dict[str, float], since: float | None, out: Expected
) -> None:
    """Queue wait (first delivery − due) and processing (ack − the delivery before it) per
    entry (code × group); due = creation + the delay (``deliver_at`` − creation, if > 0)."""
    due = {}
    for event in everything:
        if event["ev"] == "published" and event["code"] in created:
            delay = max(0.0, float(event.get("deliver_at") or 0.0) - event["create_time"])
            due[event["code"]] = created[event["code"]] + delay
    steps: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for event in everything:
        if "group" in event and "topic" in event:
            steps[(event["code"], event["group"])].append(event)
    for (code, _), events in steps.items():
        events.sort(key=lambda e: e["t"])
        deliveries = [e["t"] for e in events if e["ev"] == "delivered"]
        if deliveries and code in due and (since is None or deliveries[0] >= since):
            out.split[(events[0]["topic"], "queue_wait")].append((deliveries[0] - due[code]) * 1000.0)
        for e in events:
            before = [t for t in deliveries if t <= e["t"]]
            if e["ev"] == "acked" and before and (since is None or e["t"] >= since):
                out.split[(e["topic"], "processing")].append((e["t"] - before[-1]) * 1000.0)


def check_percentile(got: float | None, values: list[float], p: float, digits: int = 9) -> None:
    """``got`` is the value of ``values`` of rank ⌈p·n⌉ (nearest rank), to ``digits`` decimals."""
    if not values:
        assert got is None
        return
    assert got is not None
    ordered = sorted(values)
    n = len(ordered)
    rank = max(1, math.ceil(p * n - 1e-9))
    tolerance = 0.5 * 10.0**-digits + 1e-9
    assert abs(got - ordered[rank - 1]) <= tolerance, (got, p, ordered[max(0, rank - 3) : rank + 2])


def check_counts(got: Mapping[str, Any], want: Counter[str], names: Iterable[str]) -> None:
    assert {name: int(got[name]) for name in names} == {name: want[name] for name in names}


def check_output(spark: SparkSession, output: Path, want: Expected) -> dict[str, Any]:
    """Compare hourly/, daily/ and summary.json under ``output`` with ``want``; the summary."""
    names = (*COUNTED, "bytes", "redelivered")
    hourly = {
        (r["topic"], int(r["hour_s"])): r.asDict()
        for r in spark.read.parquet(str(output / "hourly"))
        .withColumn("hour_s", F.col("hour").cast("long"))
        .collect()
    }
    assert set(hourly) == set(want.hourly)
    for key, row in hourly.items():
        counts = want.hourly[key]
        check_counts(row, counts, names)
        assert str(row["day"]) == day_of(key[1])
        assert row["redelivery_ratio"] == pytest.approx(_ratio(counts))
        latency = want.hourly_latency.get(key, [])
        for name, p in PERCENTILES.items():
            check_percentile(row[f"latency_{name}_ms"], latency, p)
        assert row["latency_max_ms"] == (pytest.approx(max(latency)) if latency else None)

    daily = {
        (r["topic"], str(r["day"])): r.asDict() for r in spark.read.parquet(str(output / "daily")).collect()
    }
    want_daily = want.daily()
    assert set(daily) == set(want_daily)
    for topic_day, row in daily.items():
        check_counts(row, want_daily[topic_day], names)
        assert row["redelivery_ratio"] == pytest.approx(_ratio(want_daily[topic_day]))

    groups = {
        (r["topic"], r["group"], int(r["hour_s"])): r.asDict()
        for r in spark.read.parquet(str(output / "groups"))
        .withColumn("hour_s", F.col("hour").cast("long"))
        .collect()
    }
    assert set(groups) >= set(want.groups)  # and the windows of an entry unacked across their end
    for group_key, row in groups.items():
        check_counts(row, want.groups.get(group_key, Counter()), GROUP_SUMS)

    consumers = (
        {
            (r["topic"], r["group"], r["consumer"], int(r["hour_s"])): r.asDict()
            for r in spark.read.parquet(str(output / "consumers"))
            .withColumn("hour_s", F.col("hour").cast("long"))
            .collect()
        }
        if list((output / "consumers").glob("day=*"))  # no day: no delivery named a consumer
        else {}
    )
    assert set(consumers) == set(want.consumers)
    for consumer_key, row in consumers.items():
        check_counts(row, want.consumers[consumer_key], ("delivered", "redelivered"))

    summary: dict[str, Any] = json.loads((output / "summary.json").read_text())
    assert set(summary) == {
        "generated_at",
        "topics",
        "days",
        "window",
        "histogram_bounds_ms",
        "groups",
        "consumers",
    }
    totals: dict[tuple[str, str, str], Counter[str]] = defaultdict(Counter)
    for (topic, group, consumer, _), counts in want.consumers.items():
        totals[(topic, group, consumer)].update(counts)
    assert {(c["topic"], c["group"], c["consumer"]): c["delivered"] for c in summary["consumers"]} == {
        key: counts["delivered"] for key, counts in totals.items()
    }
    want_topics = want.topics()
    assert set(summary["topics"]) == set(want_topics)
    for topic, entry in summary["topics"].items():
        assert set(entry) >= {*COUNTED[:-1], "latency_ms", "queue_wait_ms", "processing_ms", "histograms"}
        check_counts(entry, want_topics[topic], COUNTED[:-1])
        for name, p in PERCENTILES.items():
            check_percentile(entry["latency_ms"][name], want.topic_latency.get(topic, []), p, 3)
            for metric in ("queue_wait", "processing"):
                values = want.split.get((topic, metric), [])
                check_percentile(entry[f"{metric}_ms"][name], values, p, 3)
        hist = entry["histograms"]["latency"]
        assert (sum(hist) if hist else 0) == len(want.topic_latency.get(topic, []))
    assert {(g["topic"], g["group"]) for g in summary["groups"]} == {(t, g) for t, g, _ in groups}
    assert [(d["day"], d["topic"]) for d in summary["days"]] == sorted((day, t) for t, day in want_daily)
    for entry in summary["days"]:
        counts = want_daily[(entry["topic"], entry["day"])]
        check_counts(entry, counts, (*COUNTED, "bytes"))
        assert entry["redelivery_ratio"] == pytest.approx(_ratio(counts), abs=1e-6)
    return summary


def _ratio(counts: Counter[str]) -> float:
    return counts["redelivered"] / counts["delivered"] if counts["delivered"] else 0.0


# ---------------------------------------------------------------------------------------
# A hand-built archive


def make_config(*sets: str) -> Config:
    return load_config(None, overrides=list(sets), env={})


T0 = datetime(2026, 3, 1, 22, 0, tzinfo=UTC).timestamp()


def _message_events(rng: random.Random, i: int, dlq: list[dict[str, Any]]) -> list[dict[str, Any]]:
    topic = rng.choice(["orders", "emails", "audit"])
    code = f"{i:032x}"
    t = T0 + rng.uniform(0, 30 * 3600)  # 22:00 on day one to 04:00 on day three
    out: list[dict[str, Any]] = [
        {"ev": "published", "code": code, "topic": topic, "t": t, "create_time": t, "deliver_at": t,
         "size": rng.randint(1, 500), "producer": f"p{i % 4}", "priority": 0, "key": ""},
    ]  # fmt: skip
    fate = rng.random()
    base = {"code": code, "topic": topic, "group": "default"}
    if fate < 0.05:
        return [*out, {"ev": "expired", **base, "t": t + 60}]
    if fate < 0.08:
        return [*out, {"ev": "dropped", **base, "t": t + 1}]
    now = t + rng.uniform(0.001, 0.05)
    out.append({"ev": "delivered", **base, "t": now, "attempt": 1})
    for attempt in range(2, 2 + (rng.random() < 0.2) + (rng.random() < 0.05)):
        now += rng.uniform(0.01, 40)
        out.append(
            {"ev": "retried", **base, "t": now, "reason": rng.choice(["nack", "timeout", "disconnect"])}
        )
        out.append({"ev": "delivered", **base, "t": now + 0.001, "attempt": attempt})
    now += rng.lognormvariate(-3, 1.5)
    if fate < 0.12:
        out.append({"ev": "dead_lettered", **base, "t": now, "reason": "rejected"})
        copy = f"d{i:031x}"
        dlq.append({"ev": "published", "code": copy, "topic": f"{topic}.dlq", "t": now,
                    "create_time": now, "size": 40, "producer": "kapok"})  # fmt: skip
    else:
        out.append({"ev": "acked", **base, "t": now})
    if rng.random() < 0.1:  # a second group
        out.append({"ev": "delivered", **base, "group": "audit-log", "t": t + 0.5, "attempt": 1})
        out.append({"ev": "acked", **base, "group": "audit-log", "t": t + rng.uniform(0.5, 9000)})
    if rng.random() < 0.02:
        out.append({"ev": "deleted", "code": code, "t": now + 1})
    return out


def write_hand_built_archive(store: Path) -> list[Path]:
    rng = random.Random(15)
    archive = store / "archive"
    archive.mkdir(parents=True)
    (store / "wal").mkdir()
    files: list[list[dict[str, Any]]] = [[], [], []]
    dlq: list[dict[str, Any]] = []
    for i in range(900):
        files[i % 3].extend(_message_events(rng, i, dlq))
    files[1].extend(dlq)
    for i in range(5):  # acks whose publish aged out of the archive: counted, no latency
        files[2].append(
            {"ev": "acked", "code": f"e{i:031x}", "topic": "orders", "group": "default", "t": T0 + i}
        )
    paths = []
    for n, events in enumerate(files):
        path = archive / f"archive-20260301T220000-{n}.jsonl"
        with path.open("w") as out:
            out.writelines(json.dumps(e) + "\n" for e in events)
            if n != 1:
                out.write('{"ev": "acked", "code": "0000ff", "top')  # cut by a crash
        paths.append(path)
    empty = archive / "archive-20260303T040000-3.jsonl"  # started just before a crash
    empty.touch()
    return [*paths, empty]


def test_hand_built_archive_gives_the_same_numbers_as_plain_python(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    paths = write_hand_built_archive(store)
    want = expected_from(paths)
    assert want.skipped == 2 and {t for t, _ in want.hourly} >= {"orders", "emails", "orders.dlq"}
    assert len({day_of(h) for _, h in want.hourly}) == 3

    assert main(["analytics", "--input", str(store)]) == 0  # output: <storage dir>/analytics
    assert "2 torn or foreign lines skipped" in capsys.readouterr().err
    summary = check_output(spark, store / "analytics", want)
    assert summary["topics"]["orders"]["expired"] > 0
    # The console reads this file from the same place: what it draws is what was computed.
    path = console_analytics.summary_path(make_config(f"storage.dir={store}"))
    read, problem = console_analytics.read_summary(path)
    assert read == summary and problem == ""
    shown = console_analytics.from_summary(summary, T0 + 30 * 3600)
    assert [row["topic"] for row in shown["latency"]] == sorted(want.topics())
    assert {s["name"]: sum(s["values"]) for s in shown["growth"]["series"]} == {
        t: c["published"] for t, c in want.topics().items()
    }

    since = T0 + 12 * 3600  # acks in the window, published before it, still have a latency
    result = run_job(
        spark, [str(p) for p in paths], str(tmp_path / "since"), since_t=since, now=T0 + 40 * 3600
    )
    # The window is widened to whole days: day two is recomputed from its midnight on.
    want_since = expected_from(paths, T0 + 2 * 3600)
    assert day_of(since) == day_of(T0 + 2 * 3600) != day_of(T0 + 2 * 3600 - 1)
    assert (result.events, result.skipped_lines) == (want_since.events, 2)
    check_output(spark, tmp_path / "since", want_since)
    assert result.summary["generated_at"] == "2026-03-03T14:00:00Z"


# ---------------------------------------------------------------------------------------
# An archive made by a real node

SECRET = "test"


def _call(url: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {SECRET}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=scaled(10)) as response:
        return json.loads(response.read())


def _pull(url: str, topic: str, n: int, lease_s: float = 30.0) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = _call(
        url, "GET", f"/v1/topics/{topic}/messages?max={n}&lease_s={lease_s}"
    )["messages"]
    return messages


def _drive(url: str) -> None:
    """3,000 messages through a node: acks, nacks, lease timeouts and dead letters."""
    for topic, count in (("orders", 2000), ("emails", 1000)):
        for start in range(0, count, 500):
            batch = [{"data": f"{topic}-{i}"} for i in range(start, start + 500)]
            _call(url, "POST", f"/v1/topics/{topic}/messages", {"messages": batch})
    # Five leases left to end: the node delivers those messages again (retried: timeout).
    lapsed = [m["code"] for m in _pull(url, "emails", 5, lease_s=0.05)]
    assert len(lapsed) == 5

    def _status(code: str) -> str:
        return str(_call(url, "GET", f"/v1/messages/{code}")["groups"]["default"]["status"])

    wait_for(lambda: all(_status(code) == "ready" for code in lapsed), scaled(10))
    doomed = None  # nacked until it is dead-lettered (mq.max_deliveries=3)
    for topic in ("orders", "emails"):
        while messages := _pull(url, topic, 400):
            codes = [m["code"] for m in messages]
            nack = [m["code"] for m in messages if m["attempts"] == 1 and int(m["code"], 16) % 10 == 0]
            doomed = doomed or codes[0]
            if doomed in codes:
                nack.append(doomed)
            reject = [codes[-1]] if topic == "orders" and len(codes) > 300 else []
            settle = set(nack) | set(reject)
            if nack:
                _call(url, "POST", f"/v1/topics/{topic}/nack", {"codes": sorted(set(nack)), "requeue": True})
            if reject:
                _call(url, "POST", f"/v1/topics/{topic}/nack", {"codes": reject, "requeue": False})
            _call(url, "POST", f"/v1/topics/{topic}/ack", {"codes": [c for c in codes if c not in settle]})


def test_real_node_archive_gives_the_same_numbers_as_plain_python(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = tmp_path / "node" / "data"
    node = start_node(tmp_path / "node", f"storage.dir={data}", "storage.fsync=never", "mq.max_deliveries=3")
    try:
        _drive(node.url)
    finally:
        assert node.stop() == 0  # a clean stop: the archiver writes out everything
    paths = sorted((data / "archive").glob("archive-*.jsonl"))
    want = expected_from(paths)
    topics = want.topics()
    assert (topics["orders"]["published"], topics["emails"]["published"]) == (2000, 1000)
    assert topics["orders"]["dead_lettered"] >= 2 and topics["orders.dlq"]["published"] >= 2
    assert topics["orders"]["retried"] >= 100 and topics["emails"]["retried"] >= 50
    assert topics["orders"]["acked"] + topics["orders"]["dead_lettered"] == 2000
    assert topics["emails"]["redelivered"] >= 50 and want.skipped == 0
    assert want.consumers  # each pull names its consumer ("http:<address>")

    assert main(["analytics", "--input", str(data), "--output", str(tmp_path / "out")]) == 0
    summary = check_output(spark, tmp_path / "out", want)
    # Everything was settled: each group's last backlog is empty.
    assert {(g["topic"], g["group"]) for g in summary["groups"]} == {
        ("orders", "default"),
        ("emails", "default"),
    }
    assert {(g["ready"], g["in_flight"], g["oldest_unacked_age_s"]) for g in summary["groups"]} == {
        (0, 0, None)
    }


def test_window_minute_writes_minute_windows(spark: SparkSession, tmp_path: Path) -> None:
    paths = write_hand_built_archive(tmp_path / "store")
    everything, _ = read_events(paths)
    want: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
    for event in everything:
        if "topic" in event and event["ev"] in COUNTED:
            want[(event["topic"], int(event["t"] // 60) * 60)][event["ev"]] += 1
    out = tmp_path / "out"
    argv = ["analytics", "--input", str(tmp_path / "store"), "--output", str(out), "--window", "minute"]
    assert main(argv) == 0
    minutes = {
        (r["topic"], int(r["m"])): r.asDict()
        for r in spark.read.parquet(str(out / "by_minute"))
        .withColumn("m", F.col("minute").cast("long"))
        .collect()
    }
    assert set(minutes) == set(want)
    for key, row in minutes.items():
        check_counts(row, want[key], COUNTED)
    groups = spark.read.parquet(str(out / "groups_by_minute"))
    assert {"minute", "ready", "in_flight", "oldest_unacked_age_s", "day"} <= set(groups.columns)
    assert groups.where(F.col("minute").cast("long") % 60 != 0).count() == 0
    assert not (out / "hourly").exists() and (out / "daily").exists()
    assert json.loads((out / "summary.json").read_text())["window"] == "minute"


def test_watch_runs_again_on_the_archive_as_it_grows(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    archive = store / "archive"
    archive.mkdir(parents=True)
    event = {"ev": "published", "code": "a", "topic": "t", "t": T0, "create_time": T0, "size": 1}
    (archive / "archive-20260301T220000-0.jsonl").write_text(json.dumps(event) + "\n")
    seen: list[int] = []
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # stands in for the wait between runs
        summary = json.loads((store / "analytics" / "summary.json").read_text())
        seen.append(summary["topics"]["t"]["published"])
        pauses.append(seconds)
        if len(pauses) == 2:
            raise KeyboardInterrupt  # Ctrl-C
        more = {**event, "code": "b"}
        (archive / "archive-20260301T230000-1.jsonl").write_text(json.dumps(more) + "\n")

    monkeypatch.setattr("kapok.analytics.command.wait", pause)
    assert main(["analytics", "--input", str(store), "--watch", "30"]) == 130
    assert (seen, pauses) == ([1, 2], [30.0, 30.0])
    assert capsys.readouterr().err.count("next run in 30 s") == 2


def test_what_only_spark_can_check_is_one_clear_error(spark: SparkSession, tmp_path: Path) -> None:
    foreign = tmp_path / "notes.txt"  # what a URI might name: no local check saw it
    foreign.write_text("hello\nworld\n")
    with pytest.raises(AnalyticsError, match="not an archive: none of the 2 lines"):
        run_job(spark, [f"file://{foreign}"], str(tmp_path / "out"), now=T0)
    with pytest.raises(AnalyticsError, match=r"^the Spark job failed: .*does not exist") as caught:
        run_job(spark, [f"file://{tmp_path}/nowhere/*.jsonl"], str(tmp_path / "out"), now=T0)
    assert "\n" not in caught.value.message
