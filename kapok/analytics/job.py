"""The analytics job: archive files → ``engine`` → ``transforms`` → Parquet and ``summary.json``.

It only wires; the rules live in ``kapok.analytics.transforms`` and
``kapok.analytics.lifecycle``, the output tables' columns in ``kapok.analytics.tables``.
Output, under ``OUTPUT`` (a local directory or any URI Spark writes):

* ``hourly/day=YYYY-MM-DD/`` Parquet: per topic × hour the counts, bytes,
  redelivery ratio and the durations' percentiles and histograms;
* ``daily/day=YYYY-MM-DD/`` Parquet: per topic × day the counts, bytes and
  redelivery ratio;
* ``groups/day=YYYY-MM-DD/`` Parquet: per topic × group × hour the counts and the
  backlog at the hour's end;
* ``consumers/day=YYYY-MM-DD/`` Parquet: per topic × group × consumer × hour the
  deliveries and redeliveries (from archives that name consumers).
  With ``window`` "minute" or "day" the per-window tables are ``by_minute/``,
  ``groups_by_minute/`` and ``consumers_by_minute/`` (or ``…_day``) instead;
* ``summary.json``: what the console draws (``kapok.analytics.summary``), replaced
  atomically on a local disk, so a reader never sees half of it. Its days and counts
  are read back from ``daily/`` (every day it holds); its latencies are the run's.

A run replaces whole days, and only those it recomputed: a ``since_t`` window is
widened to the midnight (UTC) before it, and the tables are written with dynamic
partition overwrite, so the other days stay as written (history outlives the
archive's retention). A recomputed day whose written partition holds more than the
archive still does (an earlier hour, or more counted events) is kept as it was
(``JobResult.kept_days``). Timestamps are written as Parquet INT64 microseconds.

Spark reads each file once (``reading.read_file`` in its tasks: the file's totals, and its
events in buckets by code) and keeps what the tasks return for the two passes: the
files' totals (and each group's first event, which ``engine.lives`` needs), then the
figures (``engine``). The figures are small (rows per topic × window), so the tables are
made of them in this process and handed to Spark only to write.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kapok.analytics import engine, reading, tables
from kapok.analytics import summary as sm
from kapok.analytics import transforms as tf
from kapok.analytics.files import EVENTS_DDL, archive_files, file_bytes, write_text
from kapok.analytics.session import first_line
from kapok.errors import AnalyticsError

__all__ = ["SUMMARY_FILE", "JobResult", "Resume", "run_job", "scan_files"]

SUMMARY_FILE = "summary.json"
DAY_S = 86400


@dataclass(frozen=True, slots=True)
class JobResult:
    output: str
    events: int  # events in the window (every kind)
    skipped_lines: int  # lines that were no event: torn by a crash, or foreign
    topics: int
    topic_hours: int
    summary: dict[str, Any]
    kept_days: tuple[str, ...] = ()  # recomputed days left as written: the archive lost some events
    # per file read (as Spark names it): its first and last event time, None without events
    file_times: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    # with ``carry``: what a later run resumes from (``Resume``)
    carried: Resume | None = None


@dataclass(frozen=True, slots=True)
class Resume:
    """What a later run needs of the input read so far to start at ``t`` (a UTC midnight)
    with the files new since: ``events`` (a Parquet table's URI, or the table itself as a
    run gives it), every event from ``t`` on (``recent`` of them) and the events before
    ``t`` of the messages still open at ``t``; and per topic, per group, the time of the
    group's first event."""

    t: float
    events: str | pa.Table  # the URI a run resumes from; the table a run gives
    starts: dict[str, dict[str, float]]
    recent: int = 0


def run_job(
    spark: SparkSession,
    sources: Sequence[str],
    output: str,
    *,
    since_t: float | None = None,
    days: Sequence[str] | None = None,
    now: float,
    progress: Callable[[str], None] = lambda text: None,
    window: str = "hour",
    resume: Resume | None = None,
    carry: bool = False,
) -> JobResult:
    """Run the job over ``sources`` (files, directories, globs or URIs) into ``output``.

    ``days`` (``YYYY-MM-DD``, UTC): only those days are counted and written (an incremental
    run's); every event read still counts in the messages' lives (backlog, latencies).
    ``resume``: start at ``resume.t`` (its days and after) from what an earlier run carried,
    with ``sources`` the files new since (of which only the events from ``resume.t`` on are
    read). ``carry``: give what a later run needs to start at the last day's midnight
    (``JobResult.carried``).
    """
    try:
        return _run(spark, sources, output, since_t, now, progress, days, window, resume, carry)
    except (PySparkException, Py4JError) as exc:
        raise AnalyticsError(f"the Spark job failed: {_spark_error_line(exc)}") from exc


def _run(
    spark: SparkSession,
    sources: Sequence[str],
    output: str,
    since_t: float | None,
    now: float,
    progress: Callable[[str], None],
    days: Sequence[str] | None = None,
    window: str = "hour",
    resume: Resume | None = None,
    carry: bool = False,
) -> JobResult:
    # A window is widened to whole days: every day partition it touches is recomputed
    # from all of that day's events the archive still holds, never from a part of them.
    since_t = None if since_t is None else math.floor(since_t / DAY_S) * DAY_S
    if resume is not None:
        since_t = resume.t if since_t is None else max(since_t, resume.t)
    with _read(spark, sources, since_t, resume) as read:
        scans = _scans(read)
        starts = engine.merge_starts(scans.values(), resume.starts if resume else {})
        carry_t = _carry_t(scans.values(), resume) if carry else None
        figures = _figures(read, since_t, window, days, starts, carry_t)
    file_times = {name: (scan.first_t, scan.last_t) for name, scan in scans.items()}
    skipped = sum(scan.skipped for scan in scans.values())
    count = sum(scan.events for scan in scans.values()) + (resume.recent if resume else 0)
    if skipped and not any(scan.all_events for scan in scans.values()):
        raise AnalyticsError(f"not an archive: none of the {skipped} lines read is a lifecycle event")
    unique = figures.events
    repeated, count = count - unique, unique
    progress(
        f"{count:,} events"
        + (f" ({repeated:,} more lines repeated them: counted once)" if repeated else "")
        + (f" ({skipped:,} torn or foreign lines skipped)" if skipped else "")
    )
    counts, stats, parts = figures.counts, figures.stats, figures.parts
    hourly = tf.hourly_table(tf.topic_counts(counts, window), stats)
    windows = [(row.topic, row.group, row.window_t) for row in counts if row.group is not None]
    backlog = tf.backlog(parts, tf.WINDOWS[window], windows)
    groups = tf.group_table(counts, backlog, {row["day"] for row in hourly}, window)
    consumers = tf.consumer_table(figures.consumers, {row["day"] for row in hourly}, window)
    daily = tf.daily_counts(hourly)
    kept = tables.partial_days(spark, output, hourly, daily, window)
    if kept:
        progress(
            f"kept {len(kept)} earlier day(s) as they were ({', '.join(kept)}): "
            "the archive no longer holds all their events"
        )
        hourly, daily, groups = (
            [row for row in rows if row["day"] not in kept] for rows in (hourly, daily, groups)
        )
    windows_table, groups_table = tf.table_names(window)
    with tables.write_conf(spark):
        written = (
            (windows_table, hourly),
            ("daily", daily),
            (groups_table, groups),
            (tf.consumers_table(window), consumers),
        )
        for name, rows in written:
            (
                tables.dataframe(spark, rows, tables.schema_of(name, window))
                .coalesce(1)
                .write.mode("overwrite")
                .option("partitionOverwriteMode", "dynamic")  # only the days written here
                .partitionBy("day")
                .parquet(tables.join(output, name))
            )
    # The summary covers every day of the table (history older than the archive too),
    # not only the days this run recomputed; its latencies are those of the acks read.
    day_rows = tables.day_rows(spark, output, window)
    topic_rows = sm.topic_totals(day_rows, stats)
    group_rows = sm.last_windows(groups, window)
    generated_at = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    summary = sm.summary(
        topic_rows, day_rows, generated_at, group_rows, window, sm.consumer_totals(consumers)
    )
    write_text(
        spark, tables.join(output, SUMMARY_FILE), orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode()
    )
    carried = None
    if carry_t is not None:
        recent = int(pc.sum(pc.greater_equal(figures.carry["t"], carry_t)).as_py() or 0)
        carried = Resume(carry_t, figures.carry, starts, recent)
    return JobResult(
        output, count, skipped, len(topic_rows), len(hourly), summary, tuple(kept), file_times, carried
    )


def _carry_t(scans: Iterable[reading.FileScan], resume: Resume | None) -> float | None:
    """The midnight (UTC) that starts the input's last day; never before ``resume.t``."""
    last = max((scan.last_t for scan in scans if scan.last_t is not None), default=None)
    if last is None:
        return None if resume is None else resume.t
    t = math.floor(last / DAY_S) * DAY_S
    return t if resume is None else max(t, resume.t)


def scan_files(files: DataFrame | None) -> dict[str, reading.FileScan]:
    """Each file's ``reading.FileScan`` (one pass, in Spark's tasks), by its name as Spark gives it."""
    if files is None:
        return {}

    def scan(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for name, data in zip(batch["path"].to_pylist(), batch["content"].to_pylist(), strict=True):
                yield reading.read_file(name, file_bytes(name, data), None, 0)

    return _scans(files.mapInArrow(scan, reading.BLOB_DDL))


@contextmanager
def _read(
    spark: SparkSession, sources: Sequence[str], since_t: float | None, resume: Resume | None
) -> Iterator[DataFrame | None]:
    """Every file of ``sources`` read once (``reading.read_file``: its scan, its events in
    buckets), and ``resume``'s events in the same buckets, kept by Spark for the job's two
    passes (None without files)."""
    files = archive_files(spark, sources)
    if files is None:
        yield None
        return
    # More buckets than tasks: Spark hashes a bucket to its task, and some tasks get two.
    buckets = 4 * int(spark.conf.get("spark.sql.shuffle.partitions") or 2)
    from_t = None if resume is None else resume.t

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for name, data in zip(batch["path"].to_pylist(), batch["content"].to_pylist(), strict=True):
                yield reading.read_file(name, file_bytes(name, data), since_t, buckets, from_t)

    def bucketed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield reading.bucket_rows(pa.Table.from_batches([batch]).cast(reading.EVENT_FIELDS), buckets)

    rows = files.mapInArrow(read, reading.BLOB_DDL)
    if resume is not None:
        assert isinstance(resume.events, str)  # a run resumes from the table an earlier one wrote
        carried = spark.read.schema(EVENTS_DDL).parquet(resume.events)
        rows = rows.unionAll(carried.mapInArrow(bucketed, reading.BLOB_DDL))
    read_once = rows.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        yield read_once
    finally:
        read_once.unpersist()


def _scans(rows: DataFrame | None) -> dict[str, reading.FileScan]:
    if rows is None:
        return {}
    scans = rows.where(F.col("kind") == "scan").select("name", "blob").toArrow()
    return {
        name: reading.file_scan(blob)
        for name, blob in zip(scans["name"].to_pylist(), scans["blob"].to_pylist(), strict=True)
    }


def _figures(
    read: DataFrame | None,
    since_t: float | None,
    window: str,
    days: Sequence[str] | None,
    starts: Mapping[str, Mapping[str, float]],
    carry_t: float | None,
) -> engine.Figures:
    """The engine's figures of ``read``'s events: its buckets shuffled to the tasks,
    ``engine.lives``, the durations shuffled by topic × metric, ``engine.stats``: as
    ``engine.figures_of`` computes them in one process."""
    if read is None:  # a node that has archived nothing yet
        return engine.decode(engine.OUT_FIELDS.empty_table())
    tasks = read.sparkSession.conf.get("spark.sql.shuffle.partitions") or "2"

    def lives(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        events = reading.events_of(blob for batch in batches for blob in batch["blob"].to_pylist())
        return engine.lives(
            events, window_s=tf.WINDOWS[window], since_t=since_t, days=days, starts=starts, carry_t=carry_t
        )

    rows = (
        read.where(F.col("kind") == "events")
        .repartition(int(tasks), "key")
        .mapInArrow(lives, engine.OUT_DDL)
        .repartition(int(tasks), "topic", "metric")
        .mapInArrow(engine.stats, engine.OUT_DDL)
        .toArrow()
    )
    return engine.decode(rows)


def _spark_error_line(exc: BaseException) -> str:
    # A Py4J error starts with "An error occurred while calling o42.parquet." and the
    # Java exception's own message follows; that one says what went wrong.
    for line in str(exc).splitlines():
        line = line.strip().lstrip(": ").strip()
        if line and not line.startswith("An error occurred while calling"):
            return line
    return first_line(exc)
