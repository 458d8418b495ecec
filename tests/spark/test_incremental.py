"""Incremental runs: only the new archive files are read, only the days they touch rewritten.

An archive over three days, a file every six hours. A first run is full and writes the
ledger, and carries every event from the last day's midnight on and the messages open
then; a run after a new file of day three reads only that file and what was carried,
rewrites day three only (the other days' files stay as they were, to the byte and the
mtime), and its tables equal a full run's over everything, latencies too, although an ack
of the new file has its publish in a file of day one. A file gone (retention) changes
nothing written; a ledger that does not read, or ``--full``, makes a full run."""

from __future__ import annotations

import json
import os
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from kapok.analytics.incremental import run_incremental
from kapok.analytics.job import run_job
from kapok.analytics.ledger import CARRY_DIR, LEDGER_FILE, decode

T0 = datetime(2026, 3, 1, 0, 0, tzinfo=UTC).timestamp()  # day one, 00:00 UTC
FILE_S = 6 * 3600
SETTINGS = {"window": "hour", "inputs": ["data"]}


def _message(rng: random.Random, code: str, t: float, acked: float) -> list[dict[str, Any]]:
    topic = rng.choice(("orders", "emails"))
    return [
        {
            "ev": "published",
            "code": code,
            "topic": topic,
            "t": t,
            "create_time": t,
            "size": rng.randint(1, 99),
        },
        {"ev": "delivered", "code": code, "topic": topic, "group": "g", "t": t + 0.01, "attempt": 1},
        {"ev": "acked", "code": code, "topic": topic, "group": "g", "t": acked},
    ]


def _write(archive: Path, start: float, events: list[dict[str, Any]]) -> Path:
    archive.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromtimestamp(start, UTC).strftime("%Y%m%dT%H%M%S")
    path = archive / f"archive-{stamp}-0.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _three_days(archive: Path) -> tuple[float, list[dict[str, Any]]]:
    """Files of six hours from day one 00:00 to day three 12:00; their end, and day one's
    unacked publishes (acked later)."""
    rng = random.Random(26)
    start = T0
    waiting: list[dict[str, Any]] = []
    while start < T0 + 2 * 86400 + 12 * 3600:
        events: list[dict[str, Any]] = []
        for i in range(30):
            t = rng.uniform(start, start + FILE_S - 60)
            events += _message(rng, f"{int(start)}-{i}", t, t + rng.uniform(0.02, 5))
        if start == T0:  # published on day one (group g already reads the topic), acked on day three
            late = _message(rng, "late", start + FILE_S - 100, 0.0)
            events.append(late[0])
            waiting = late[1:]
        _write(archive, start, events)
        start += FILE_S
    return start, waiting


def _partitions(output: Path) -> dict[str, dict[str, tuple[str, int]]]:
    """Per table/day partition: each file's name → its bytes and mtime."""
    out: dict[str, dict[str, tuple[str, int]]] = {}
    for table in _tables(output):
        for part in sorted((output / table).glob("day=*")):
            out[f"{table}/{part.name}"] = {
                f.name: (f.read_bytes().hex(), f.stat().st_mtime_ns) for f in sorted(part.glob("*.parquet"))
            }
    return out


def _tables(output: Path) -> list[str]:
    """The tables written (hourly, daily, per group …): folders of ``day=`` partitions."""
    return sorted(p.parent.name for p in output.glob("*/day=*") if p.is_dir() and p.name.endswith("01"))


def _rows(spark: SparkSession, output: Path, table: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(row) for row in spark.read.parquet(str(output / table)).collect())


def _run(spark: SparkSession, archive: Path, output: Path, now: float, full: bool = False) -> list[str]:
    said: list[str] = []
    files = [str(p) for p in sorted(archive.glob("archive-*.jsonl"))]
    run_incremental(spark, files, str(output), settings=SETTINGS, full=full, now=now, progress=said.append)
    return said


@pytest.mark.timeout(300)  # four runs of the job
def test_a_new_file_rewrites_only_its_days_and_gives_what_a_full_run_gives(
    spark: SparkSession, tmp_path: Path
) -> None:
    archive, output = tmp_path / "data" / "archive", tmp_path / "out"
    end, waiting = _three_days(archive)
    said = _run(spark, archive, output, end)
    assert said[0] == "a full run: first run"
    ledger = decode((output / LEDGER_FILE).read_text())
    assert len(ledger.files) == 10 and ledger.settings == SETTINGS
    before = _partitions(output)
    tables = _tables(output)
    assert {"daily", "hourly"} <= set(tables)
    assert sorted(before) == [f"{t}/day=2026-03-0{d}" for t in tables for d in (1, 2, 3)]

    # The run carried what a run that starts on day three needs of the days before: the
    # messages open at its midnight (the late one).
    carried = ledger.carried
    assert (
        carried is not None and carried.t == T0 + 2 * 86400 and carried.starts.keys() == {"orders", "emails"}
    )
    assert [p.name for p in (output / CARRY_DIR).iterdir()] == [carried.name]
    held = spark.read.parquet(str(output / CARRY_DIR / carried.name)).collect()
    assert [(row["ev"], row["code"]) for row in held if row["t"] < carried.t] == [("published", "late")]
    day_three = [
        e for p in sorted(archive.glob("*.jsonl"))[8:] for e in map(json.loads, p.read_text().splitlines())
    ]
    assert sorted(row["t"] for row in held if row["t"] >= carried.t) == sorted(e["t"] for e in day_three)
    assert carried.recent == len(day_three) > 0

    originals = {path: path.read_text() for path in sorted(archive.glob("archive-*.jsonl"))}
    # No file read before is read again, not even day three's: garbage of the same size and
    # mtime would show as skipped lines (and the ledger still takes them as they were).
    for path in sorted(archive.glob("archive-*.jsonl")):
        stat = path.stat()
        path.write_bytes(b"x" * (stat.st_size - 1) + b"\n")
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    # A new file of day three; its acks include one of a message published on day one.
    rng = random.Random(7)
    events = [e for i in range(20) for e in _message(rng, f"new-{i}", end + i * 60, end + i * 60 + 1)]
    events += [{**e, "t": end + 3000.0} for e in waiting]
    _write(archive, end, events)
    said = _run(spark, archive, output, end + 3600)
    assert said[0] == (
        "an incremental run: 1 new or grown file(s) of 11, 1 day(s) to recompute (2026-03-03), "
        "from 1 file(s) and what the run before carried from 2026-03-03"
    )
    assert not any("skipped" in line for line in said), said
    now_carried = decode((output / LEDGER_FILE).read_text()).carried
    assert now_carried is not None and now_carried.name != carried.name
    assert [p.name for p in (output / CARRY_DIR).iterdir()] == [now_carried.name]  # the old one went
    after = _partitions(output)
    for day in ("2026-03-01", "2026-03-02"):
        for table in tables:
            assert after[f"{table}/day={day}"] == before[f"{table}/day={day}"]
    assert after["daily/day=2026-03-03"] != before["daily/day=2026-03-03"]

    recount = tmp_path / "recount"
    for path, text in originals.items():  # as they were, mtime too
        stat = path.stat()
        path.write_text(text)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    run_job(spark, [str(archive)], str(recount), now=end + 3600)
    for table in tables:
        mine, full = _rows(spark, output, table), _rows(spark, recount, table)  # latencies included
        if table.startswith("groups"):
            # A group's backlog on a day not recomputed may change with later events: here the
            # late message's delivery on day three shows day one's backlog had it (docs).
            mine, full = ([r for r in rows if str(r[-1]) == "2026-03-03"] for rows in (mine, full))
        assert mine == full
    summary = json.loads((output / "summary.json").read_text())
    full = json.loads((recount / "summary.json").read_text())
    assert summary["days"] == full["days"]
    assert len(decode((output / LEDGER_FILE).read_text()).files) == 11

    # Nothing new: nothing recomputed, nothing rewritten.
    said = _run(spark, archive, output, end + 7200)
    assert said == ["nothing new in the 11 file(s) read before: the tables stay as they are"]
    assert _partitions(output) == after


@pytest.mark.timeout(300)
def test_gone_files_change_nothing_and_a_corrupt_ledger_means_a_full_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    archive, output = tmp_path / "data" / "archive", tmp_path / "out"
    end, _ = _three_days(archive)
    _run(spark, archive, output, end)
    before = _partitions(output)
    first = json.loads((output / "summary.json").read_text())

    # Retention deletes day one's files; a new file of day three arrives.
    for path in sorted(archive.glob("archive-*.jsonl"))[:4]:
        path.unlink()
    rng = random.Random(8)
    _write(archive, end, [e for i in range(5) for e in _message(rng, f"n{i}", end + i, end + i + 1)])
    said = _run(spark, archive, output, end + 3600)
    assert said[0].startswith(
        "an incremental run: 1 new or grown file(s) of 7, 1 day(s) to recompute (2026-03-03)"
    )
    after = _partitions(output)
    for table in _tables(output):
        assert after[f"{table}/day=2026-03-01"] == before[f"{table}/day=2026-03-01"]
        assert after[f"{table}/day=2026-03-02"] == before[f"{table}/day=2026-03-02"]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["days"][: len(first["days"]) - 2] == first["days"][:-2]  # days one and two
    assert len(decode((output / LEDGER_FILE).read_text()).files) == 7  # the gone ones left it

    # A torn ledger: a full run, which says why.
    (output / LEDGER_FILE).write_text('{"version": 1, "settings": {"window": "hour"}, "fil')
    said = _run(spark, archive, output, end + 7200)
    assert said[0].startswith("a full run: the input ledger does not read (not a ledger")
    assert len(decode((output / LEDGER_FILE).read_text()).files) == 7
    # --full: a full run too.
    assert _run(spark, archive, output, end + 7300, full=True)[0] == "a full run: --full"
