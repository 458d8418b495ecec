"""The analytics job: archive lines → ``transforms`` → Parquet and ``summary.json``.

It only wires; every rule lives in ``kapok.analytics.transforms``. Output, under
``OUTPUT`` (a local directory or any URI Spark writes):

* ``hourly/day=YYYY-MM-DD/`` Parquet: per topic × hour the counts, bytes,
  redelivery ratio and latency percentiles;
* ``daily/day=YYYY-MM-DD/`` Parquet: per topic × day the counts, bytes and
  redelivery ratio;
* ``groups/day=YYYY-MM-DD/`` Parquet: per topic × group × hour the counts and the
  backlog at the hour's end (``kapok.analytics.lifecycle``). With ``window`` "minute" or
  "day" the two per-window tables are ``by_minute/`` and ``groups_by_minute/`` (or
  ``by_day/``, ``groups_by_day/``) instead of ``hourly/`` and ``groups/``;
* ``summary.json``: what the console draws (``transforms.summary``), replaced
  atomically on a local disk, so a reader never sees half of it. Its days and counts
  are read back from ``daily/`` (every day it holds); its latencies are the run's.

A run replaces whole days, and only those it recomputed: a ``since_t`` window is
widened to the midnight (UTC) before it, and the tables are written with dynamic
partition overwrite, so the other days stay as written (history outlives the
archive's retention). A recomputed day whose written partition holds more than the
archive still does (an earlier hour, or more counted events) is kept as it was
(``JobResult.kept_days``). Timestamps are written as Parquet INT64 microseconds.

The input is read twice: the line totals parse only ``ev`` and ``t``; then each event
once (``kapok.analytics.unique``: every node's archive may be given, one archive twice,
and one shuffle drops the repeats) is cached, and the later passes read the cache. (An
observation of the line totals during another pass saves a pass, but Spark reports
nothing for it when no line is an event.) The aggregates
are small (a row per topic and hour) and are cached, as each feeds several outputs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from py4j.protocol import Py4JError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from kapok.analytics import lifecycle as lc
from kapok.analytics import transforms as tf
from kapok.analytics.session import first_line
from kapok.analytics.unique import read_schema, unique_events
from kapok.errors import AnalyticsError

__all__ = ["SUMMARY_FILE", "JobResult", "run_job", "write_text"]

SUMMARY_FILE = "summary.json"
DAY_S = 86400
# Timestamps as Parquet INT64 microseconds, UTC-adjusted (not the legacy INT96).
WRITE_CONF = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}


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
) -> JobResult:
    """Run the job over ``sources`` (files, directories, globs or URIs) into ``output``.

    ``days`` (``YYYY-MM-DD``, UTC): only those days are counted and written (an incremental
    run's); every event read still counts in the messages' lives (backlog, latencies).
    """
    try:
        return _run(spark, sources, output, since_t, now, progress, days, window)
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
) -> JobResult:
    rows = (
        spark.read.schema(read_schema(tf.EVENT_SCHEMA)).option("mode", "PERMISSIVE").json(list(sources))
        if sources
        else spark.createDataFrame([], read_schema(tf.EVENT_SCHEMA))  # a node that has archived nothing yet
    )
    # A window is widened to whole days: every day partition it touches is recomputed
    # from all of that day's events the archive still holds, never from a part of them.
    since_t = None if since_t is None else math.floor(since_t / DAY_S) * DAY_S
    cached: list[DataFrame] = []

    def cache(frame: DataFrame) -> DataFrame:
        cached.append(frame.persist(StorageLevel.MEMORY_AND_DISK))
        return frame

    try:
        # Per file (parses only ``ev`` and ``t``): its first and last event time, for the
        # input ledger of incremental runs, at no extra pass.
        is_event = F.col("ev").isNotNull() & F.col("t").isNotNull()
        per_file = (
            rows.groupBy(F.input_file_name().alias("file"))
            .agg(
                *tf.line_metrics(since_t),
                F.min(F.when(is_event, F.col("t"))).alias("first_t"),
                F.max(F.when(is_event, F.col("t"))).alias("last_t"),
            )
            .collect()
        )
        file_times = {str(r["file"]): (r["first_t"], r["last_t"]) for r in per_file}
        totals = {name: sum(int(r[name]) for r in per_file) for name in ("skipped", "events", "all_events")}
        skipped, count = int(totals["skipped"]), int(totals["events"])
        if skipped and not totals["all_events"]:
            raise AnalyticsError(f"not an archive: none of the {skipped} lines read is a lifecycle event")
        # Every node's archive may be given, and one archive twice: each event counts once.
        events = cache(unique_events(tf.events_only(rows)))
        unique = tf.events_since(events, since_t).count()
        repeated, count = count - unique, unique
        progress(
            f"{count:,} events"
            + (f" ({repeated:,} more lines repeated them: counted once)" if repeated else "")
            + (f" ({skipped:,} torn or foreign lines skipped)" if skipped else "")
        )
        lives = events  # every event read: a message's life may span days (backlog, latencies)
        if days is not None:  # an incremental run: only these days are counted and written
            day = F.date_from_unix_date(F.floor(F.col("t") / DAY_S).cast("int")).cast("string")
            events = events.where(day.isin(list(days)))
        # One shuffle by code: each message's life per group (durations, backlog).
        msgs = cache(lc.messages(lives))
        entries = cache(lc.entries(msgs, lc.group_starts(msgs)))
        percentiles = cache(tf.duration_stats(lc.durations(entries, msgs, tf.WINDOWS[window], since_t)))
        grouped = cache(tf.group_counts(tf.events_since(events, since_t), window))
        hourly = cache(tf.hourly_table(tf.topic_counts(grouped, window), percentiles, window))
        backlog = lc.backlog(entries, tf.WINDOWS[window], grouped.where(F.col("group").isNotNull()))
        groups = cache(tf.group_table(grouped, backlog, hourly, window))
        daily = cache(tf.daily_counts(hourly))
        kept = _partial_days(spark, output, hourly, daily, window)
        if kept:
            progress(
                f"kept {len(kept)} earlier day(s) as they were ({', '.join(kept)}): "
                "the archive no longer holds all their events"
            )
            hourly = hourly.where(~F.col("day").isin(kept))
            daily = daily.where(~F.col("day").isin(kept))
            groups = groups.where(~F.col("day").isin(kept))
        topic_hours = hourly.count()
        with _write_conf(spark):
            windows_table, groups_table = tf.table_names(window)
            for name, table in ((windows_table, hourly), ("daily", daily), (groups_table, groups)):
                (
                    table.coalesce(1)
                    .write.mode("overwrite")
                    .option("partitionOverwriteMode", "dynamic")  # only the days written here
                    .partitionBy("day")
                    .parquet(_join(output, name))
                )
        # The summary covers every day of the table (history older than the archive too),
        # not only the days this run recomputed; its latencies are those of the acks read.
        history = _read_table(spark, _join(output, "daily"), daily.schema)
        topic_rows: list[dict[str, Any]] = []
        day_rows: list[dict[str, Any]] = []
        if history is not None:  # else no day has events yet
            topic_rows = [row.asDict() for row in tf.topic_totals(history, percentiles).collect()]
            day_rows = [row.asDict() for row in history.collect()]
        group_rows = [row.asDict() for row in _last_windows(groups, window).collect()]
    finally:
        for frame in cached:
            frame.unpersist()
    generated_at = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    summary = tf.summary(topic_rows, day_rows, generated_at, group_rows, window)
    write_text(spark, _join(output, SUMMARY_FILE), orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    return JobResult(output, count, skipped, len(topic_rows), topic_hours, summary, tuple(kept), file_times)


def _last_windows(groups: DataFrame, window: str) -> DataFrame:
    """Each group's row of its last window (the backlog the summary shows)."""
    last = Window.partitionBy("topic", "group").orderBy(F.col(tf.window_column(window)).desc())
    return groups.withColumn("n", F.row_number().over(last)).where(F.col("n") == 1).drop("n")


def _partial_days(
    spark: SparkSession, output: str, hourly: DataFrame, daily: DataFrame, window: str = "hour"
) -> list[str]:
    """The recomputed days whose written partition holds more than the archive still does.

    A day's existing partition wins when it has an hour earlier than the recount's first
    hour of that day, or more counted events: the archive lost some of that day's events
    (retention, or fewer inputs), so the recount would be partial.
    """
    old_daily = _read_table(spark, _join(output, "daily"), daily.schema)
    old_hourly = _read_table(spark, _join(output, tf.table_names(window)[0]), hourly.schema)
    if old_daily is None or old_hourly is None:
        return []
    days = [str(row["day"]) for row in daily.select("day").distinct().collect()]
    if not days:
        return []
    counted = sum((F.col(name) for name in tf.COUNTED_EVENTS[1:]), F.col(tf.COUNTED_EVENTS[0]))

    def per_day(table_daily: DataFrame, table_hourly: DataFrame) -> dict[str, tuple[int, Any]]:
        totals = {
            str(r["day"]): int(r["n"])
            for r in table_daily.where(F.col("day").isin(days))
            .groupBy("day")
            .agg(F.sum(counted).alias("n"))
            .collect()
        }
        firsts = {
            str(r["day"]): r["first"]
            for r in table_hourly.where(F.col("day").isin(days))
            .groupBy("day")
            .agg(F.min(tf.window_column(window)).alias("first"))
            .collect()
        }
        return {day: (totals.get(day, 0), firsts.get(day)) for day in set(totals) | set(firsts)}

    old = per_day(old_daily, old_hourly)
    new = per_day(daily, hourly)
    kept = []
    for day, (old_n, old_first) in old.items():
        new_n, new_first = new.get(day, (0, None))
        earlier = old_first is not None and (new_first is None or old_first < new_first)
        if old_n > new_n or earlier:
            kept.append(day)
    return sorted(kept)


def _read_table(spark: SparkSession, uri: str, schema: StructType) -> DataFrame | None:
    """A table written by an earlier run (None if there is none), its ``day`` a string."""
    jvm: Any = spark.sparkContext._jvm
    conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(conf)
    if not fs.exists(path) or not fs.globStatus(jvm.org.apache.hadoop.fs.Path(uri + "/day=*")):
        return None
    return spark.read.schema(schema).parquet(uri)


@contextmanager
def _write_conf(spark: SparkSession) -> Iterator[None]:
    """The session's settings for the job's writes, restored after (the session may be a caller's)."""
    before: dict[str, str | None] = {key: spark.conf.get(key, None) for key in WRITE_CONF}
    for key, value in WRITE_CONF.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def write_text(spark: SparkSession, uri: str, text: str) -> None:
    """Write a small text file: atomically on a local disk, else through Spark's Hadoop client."""
    if _is_local(uri):
        path = Path(uri.removeprefix("file://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return
    # Python has no client for every file system Spark writes (hdfs, s3a, abfs ...);
    # the JVM's Hadoop FileSystem has, with the session's credentials.
    jvm: Any = spark.sparkContext._jvm
    conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
    target = jvm.org.apache.hadoop.fs.Path(uri)
    stream = target.getFileSystem(conf).create(target, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def _spark_error_line(exc: BaseException) -> str:
    # A Py4J error starts with "An error occurred while calling o42.parquet." and the
    # Java exception's own message follows; that one says what went wrong.
    for line in str(exc).splitlines():
        line = line.strip().lstrip(": ").strip()
        if line and not line.startswith("An error occurred while calling"):
            return line
    return first_line(exc)
