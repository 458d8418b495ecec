"""Each event once, whatever the job's inputs overlap (``kapok.analytics.unique``).

The rule on small frames: a line's copies merge, by ``(run, lsn, ev)`` for current lines
and by content for older ones; two real events never do (two deliveries of one message in
one group, a second delivery after a DLQ requeue, the same LSN archived by two runs).
Then the job over the same archive given twice, and over a master's and a slave's
archives, counts what one copy of each counts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from kapok.analytics.job import run_job
from kapok.analytics.reading import read_events
from kapok.analytics.unique import KEY_COLUMNS, unique

T0 = 1_795_000_000.0


def _frame(events: list[dict[str, Any]]) -> pa.Table:
    return read_events("".join(json.dumps(e) + "\n" for e in events).encode())


def _keys(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(row.values()) for row in table.select(list(KEY_COLUMNS)).to_pylist())


def _life(run: str, lsn: int, code: str, *, attempts: int = 1) -> list[dict[str, Any]]:
    """A message published, delivered ``attempts`` times (nacked between them), acked."""
    out: list[dict[str, Any]] = [
        {"ev": "published", "code": code, "topic": "t", "t": T0, "create_time": T0, "size": 3,
         "run": run, "lsn": lsn},
    ]  # fmt: skip
    for attempt in range(1, attempts + 1):
        at = T0 + attempt
        lsn += 1
        out.append({"ev": "delivered", "code": code, "topic": "t", "group": "g", "t": at, "attempt": attempt,
                    "run": run, "lsn": lsn})  # fmt: skip
        if attempt < attempts:
            lsn += 1
            out.append({"ev": "retried", "code": code, "topic": "t", "group": "g", "t": at + 0.5,
                        "attempt": attempt, "reason": "nack", "run": run, "lsn": lsn})  # fmt: skip
    out.append(
        {"ev": "acked", "code": code, "topic": "t", "group": "g", "t": T0 + 9, "run": run, "lsn": lsn + 1}
    )
    return out


def _legacy(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k not in ("run", "lsn")} for e in events]


def test_the_key_columns_are_required() -> None:
    with pytest.raises(ValueError, match="lsn"):
        unique(pa.table({"run": ["r"], "ev": ["acked"]}))


def test_copies_merge_and_real_events_stay_apart() -> None:
    once = _life("r1", 10, "a", attempts=2) + _life("r1", 20, "b")
    # The same archive twice: every line twice; current and old lines alike.
    assert _keys(unique(_frame(once + once))) == _keys(_frame(once))
    old = _legacy(once)
    assert _keys(unique(_frame(old + old + old))) == _keys(_frame(old))
    # Two deliveries of one message in one group: two events (their attempts differ).
    table = unique(_frame(old))
    delivered = pc.and_(pc.equal(table["ev"], "delivered"), pc.equal(table["code"], "a"))
    assert pc.sum(delivered).as_py() == 2


def test_the_same_lsn_of_two_runs_is_two_events() -> None:
    # A master whose last records never reached its slave leads again later from the
    # same LSN (a new run): those are other events, even where their content agrees.
    first = _life("r1", 100, "a")
    again = _life("r2", 100, "a")
    assert unique(_frame(first + again + first)).num_rows == len(first) + len(again)


def test_a_requeued_dead_letter_delivered_again_is_counted() -> None:
    # The republished message has a code of its own: its delivery (attempt 1 again) is new.
    events = _life("r1", 1, "dead") + _life("r1", 20, "again")
    events.append({"ev": "requeued", "code": "dead", "topic": "t", "group": "g", "t": T0 + 5, "run": "r1",
                   "lsn": 19})  # fmt: skip
    assert unique(_frame(events + events[:3])).num_rows == len(events)


def _write(directory: Path, events: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True)
    text = "".join(json.dumps(e) + "\n" for e in events)
    (directory / "archive-20261126T000000-0.jsonl").write_text(text)


def _counts(summary: dict[str, Any]) -> dict[str, Any]:
    return {t: {k: v for k, v in f.items() if isinstance(v, int)} for t, f in summary["topics"].items()}


def test_the_job_counts_each_event_once_over_overlapping_archives(
    spark: SparkSession, tmp_path: Path
) -> None:
    master = [e for i in range(20) for e in _life("m1", 10 * i, f"m{i}", attempts=1 + i % 3)]
    slave = [e for i in range(10) for e in _life("s1", 300 + 10 * i, f"s{i}", attempts=1 + i % 2)]
    _write(tmp_path / "master", master)
    _write(tmp_path / "slave", slave)
    _write(tmp_path / "copy", master[: len(master) // 2])  # part of the master's archive, copied
    single = run_job(
        spark, [str(tmp_path / "master"), str(tmp_path / "slave")], str(tmp_path / "one"), now=T0
    )
    lines: list[str] = []
    overlapping = run_job(
        spark,
        [str(tmp_path / d) for d in ("master", "slave", "master", "copy")],
        str(tmp_path / "all"),
        now=T0,
        progress=lines.append,
    )
    assert single.events == overlapping.events == len(master) + len(slave)
    assert _counts(overlapping.summary) == _counts(single.summary)
    assert _counts(single.summary)["t"]["published"] == 30
    assert _counts(single.summary)["t"]["delivered"] == sum(1 + i % 3 for i in range(20)) + 15
    repeated = len(master) // 2  # the copy's lines; a file named twice is read once
    assert any(f"{repeated:,} more lines repeated them" in line for line in lines), lines
