"""Acceptance (issue 26, item 2): a run replaces only the days it recomputed, and completely.

An archive over three days, a file every six hours. A full run writes every day; a
``--since 1h`` run after more events came leaves the earlier days' files as they were
and writes the current day as a full recount would. A run after retention deleted the
oldest files keeps the days the archive no longer fully holds. And the Parquet written
carries INT64 microsecond timestamps, UTC-adjusted, not INT96. (Item 5's stream query
stopped mid-batch: tests/spark/test_stream.py.)
"""

from __future__ import annotations

import hashlib
import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from kapok.analytics.job import run_job

T0 = datetime(2026, 3, 1, 0, 0, tzinfo=UTC).timestamp()  # day one, 00:00 UTC
FILE_S = 6 * 3600
TOPICS = ("orders", "emails")


def _events(rng: random.Random, start: float, end: float, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        t = rng.uniform(start, end - 60)
        code = f"{int(start)}-{i}"
        topic = rng.choice(TOPICS)
        out.append({"ev": "published", "code": code, "topic": topic, "t": t, "create_time": t,
                    "size": rng.randint(1, 100)})  # fmt: skip
        out.append({"ev": "delivered", "code": code, "topic": topic, "group": "default",
                    "t": t + 0.01, "attempt": 1})  # fmt: skip
        out.append({"ev": "acked", "code": code, "topic": topic, "group": "default",
                    "t": t + rng.uniform(0.02, 5)})  # fmt: skip
    return out


def _write_file(archive: Path, start: float, events: list[dict[str, Any]]) -> Path:
    archive.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromtimestamp(start, UTC).strftime("%Y%m%dT%H%M%S")
    path = archive / f"archive-{stamp}-0.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _three_days(store: Path) -> tuple[Path, float]:
    """Files of six hours each from day one 00:00 to day three 18:00; the end of the last."""
    rng = random.Random(26)
    (store / "wal").mkdir(parents=True)
    start = T0
    while start < T0 + 2 * 86400 + 18 * 3600:
        _write_file(store / "archive", start, _events(rng, start, start + FILE_S, 40))
        start += FILE_S
    return store / "archive", start


def _day_files(output: Path) -> dict[str, dict[str, str]]:
    """Per table/day partition: each file's name → the hash of its bytes."""
    out: dict[str, dict[str, str]] = {}
    for table in sorted({p.parent.name for p in output.glob("*/day=*")}):  # hourly, daily, groups …
        for part in sorted((output / table).glob("day=*")):
            out[f"{table}/{part.name}"] = {
                f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(part.glob("*.parquet"))
            }
    return out


def _counts(summary: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each topic's counts (not its durations: those are of the acks a run read)."""
    return {t: {k: v for k, v in e.items() if isinstance(v, int)} for t, e in summary["topics"].items()}


def _rows(spark: SparkSession, output: Path, table: str) -> list[tuple[Any, ...]]:
    """Every row of the table (its ``day`` among them), in order."""
    return sorted(tuple(row) for row in spark.read.parquet(str(output / table)).collect())


@pytest.mark.timeout(300)  # five runs of the job
def test_a_window_run_replaces_only_the_days_it_recomputes_and_those_completely(
    spark: SparkSession, tmp_path: Path
) -> None:
    store = tmp_path / "data"
    archive, end = _three_days(store)
    output = tmp_path / "out"
    run_job(spark, [str(archive)], str(output), now=end)
    before = _day_files(output)
    tables = sorted({name.split("/")[0] for name in before})
    assert {"daily", "hourly"} <= set(tables)
    assert sorted(before) == [f"{t}/day=2026-03-0{d}" for t in tables for d in (1, 2, 3)]
    first_summary = json.loads((output / "summary.json").read_text())

    # Three more hours of day three arrive; then a run over the last hour only.
    rng = random.Random(7)
    _write_file(archive, end, _events(rng, end, end + 3 * 3600, 30))
    now = end + 3 * 3600
    result = run_job(spark, [str(archive)], str(output), since_t=now - 3600, now=now)
    after = _day_files(output)
    for day in ("2026-03-01", "2026-03-02"):  # untouched: the very same files
        for table in tables:
            assert after[f"{table}/day={day}"] == before[f"{table}/day={day}"]
    # Day three is the whole day, as a full recount over the same archive gives it.
    recount = tmp_path / "recount"
    run_job(spark, [str(archive)], str(recount), now=now)
    for table in tables:
        assert _rows(spark, output, table) == _rows(spark, recount, table)
    # The summary covers every day written, not only the window's.
    summary = json.loads((output / "summary.json").read_text())
    full = json.loads((recount / "summary.json").read_text())
    assert summary["days"] == full["days"]
    assert _counts(summary) == _counts(full)  # latencies: of the acks read (the window's day)
    assert summary["days"][0]["day"] == "2026-03-01"
    assert (
        sum(t["published"] for t in summary["topics"].values())
        == sum(t["published"] for t in first_summary["topics"].values()) + 30
    )
    assert result.kept_days == ()


def test_days_the_archive_no_longer_fully_holds_keep_what_was_written(
    spark: SparkSession, tmp_path: Path
) -> None:
    store = tmp_path / "data"
    archive, end = _three_days(store)
    output = tmp_path / "out"
    run_job(spark, [str(archive)], str(output), now=end)
    before = _day_files(output)
    first = json.loads((output / "summary.json").read_text())
    # Retention deletes the files of day one and the first half of day two.
    for path in sorted(archive.glob("archive-*.jsonl"))[:6]:
        path.unlink()
    progress: list[str] = []
    result = run_job(spark, [str(archive)], str(output), now=end + 60, progress=progress.append)
    after = _day_files(output)
    for day in ("2026-03-01", "2026-03-02"):
        for table in ("hourly", "daily"):
            assert after[f"{table}/day={day}"] == before[f"{table}/day={day}"]
    assert result.kept_days == ("2026-03-02",)
    assert any("kept 1 earlier day(s) as they were (2026-03-02)" in line for line in progress)
    # Day three was recomputed (the same events: the same rows); the summary still has day one.
    for table in ("hourly", "daily"):
        assert after[f"{table}/day=2026-03-03"].keys() != before[f"{table}/day=2026-03-03"].keys()
    summary = json.loads((output / "summary.json").read_text())
    assert summary["days"] == first["days"]
    assert _counts(summary) == _counts(first)
    # A window run over the same archive (one hour back) keeps them too.
    run_job(spark, [str(archive)], str(output), since_t=end - 3600, now=end + 120)
    assert _day_files(output)["hourly/day=2026-03-02"] == before["hourly/day=2026-03-02"]


def test_timestamps_are_int64_microseconds_adjusted_to_utc(spark: SparkSession, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    _write_file(archive, T0, _events(random.Random(1), T0, T0 + 3600, 5))
    run_job(spark, [str(archive)], str(tmp_path / "out"), now=T0 + 3600)
    [path] = (tmp_path / "out" / "hourly").glob("day=*/*.parquet")
    schema = pq.ParquetFile(path).schema
    hour = schema.column(schema.names.index("hour"))
    assert hour.physical_type == "INT64"
    logical = json.loads(hour.logical_type.to_json())
    assert logical["Type"] == "Timestamp" and logical["timeUnit"] == "microseconds"
    assert logical["isAdjustedToUTC"] is True
    assert pq.read_table(path).column("hour").type.tz == "UTC"
