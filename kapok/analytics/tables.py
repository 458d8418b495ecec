"""The analytics job's output tables: their columns, what an earlier run wrote, and
the settings the job writes them with.

The job (``kapok.analytics.job``) computes the rows; this module knows the tables they go
into: each table's Arrow schema (and its Spark DDL, to read a table back), reading back
the days an earlier run wrote (on a local disk in this process, elsewhere through Spark),
which recomputed days must be kept as written, and the session settings of the writes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kapok.analytics import transforms as tf
from kapok.analytics.files import hadoop_path, is_local, read_local_table

__all__ = [
    "WRITE_CONF",
    "dataframe",
    "day_rows",
    "join",
    "partial_days",
    "read_table",
    "schema_of",
    "write_conf",
]

# Timestamps as Parquet INT64 microseconds, UTC-adjusted (not the legacy INT96).
WRITE_CONF = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}


def partial_days(
    spark: SparkSession,
    output: str,
    hourly: Sequence[Mapping[str, Any]],
    daily: Sequence[Mapping[str, Any]],
    window: str = "hour",
) -> list[str]:
    """The recomputed days whose written partition holds more than the archive still does.

    A day's existing partition wins when it has a window earlier than the recount's first
    window of that day, or more counted events: the archive lost some of that day's events
    (retention, or fewer inputs), so the recount would be partial.
    """
    days = sorted({str(row["day"]) for row in daily})
    windows_table = tf.table_names(window)[0]
    column = tf.window_column(window)
    counted = tf.COUNTED_EVENTS
    old_daily = read_table(spark, join(output, "daily"), schema_of("daily", window), ["day", *counted], days)
    old_hourly = read_table(
        spark, join(output, windows_table), schema_of(windows_table, window), ["day", column], days
    )
    if old_daily is None or old_hourly is None or not days:
        return []
    old_totals: dict[str, int] = {}
    for row in old_daily.to_pylist():
        old_totals[row["day"]] = old_totals.get(row["day"], 0) + sum(row[name] or 0 for name in counted)
    old_firsts: dict[str, int] = {}
    for row in old_hourly.to_pylist():
        if row[column] is not None:
            first = int(row[column].timestamp())
            old_firsts[row["day"]] = min(first, old_firsts.get(row["day"], first))
    new_totals: dict[str, int] = {}
    for row in daily:
        new_totals[row["day"]] = new_totals.get(row["day"], 0) + sum(row[name] for name in counted)
    new_firsts: dict[str, int] = {}
    for row in hourly:
        new_firsts[row["day"]] = min(row["window_t"], new_firsts.get(row["day"], row["window_t"]))
    kept = []
    for day in set(old_totals) | set(old_firsts):
        old_first, new_first = old_firsts.get(day), new_firsts.get(day)
        earlier = old_first is not None and (new_first is None or old_first < new_first)
        if old_totals.get(day, 0) > new_totals.get(day, 0) or earlier:
            kept.append(day)
    return sorted(kept)


def day_rows(spark: SparkSession, output: str, window: str) -> list[dict[str, Any]]:
    """Every row of the ``daily`` table."""
    history = read_table(spark, join(output, "daily"), schema_of("daily", window))
    return [] if history is None else history.to_pylist()


def read_table(
    spark: SparkSession,
    uri: str,
    schema: pa.Schema,
    columns: Sequence[str] | None = None,
    days: Sequence[str] | None = None,
) -> pa.Table | None:
    """A table written by an earlier run (None if there is none), its ``day`` a string:
    ``columns`` of it (all for None), of ``days`` (all for None); a column it lacks (written
    before the column existed) reads as null. On a local disk this process reads it, else
    Spark does."""
    if is_local(uri):
        return read_local_table(uri, schema, columns, days)
    fs, path = hadoop_path(spark, uri)
    if not fs.exists(path) or not fs.globStatus(hadoop_path(spark, uri + "/day=*")[1]):
        return None
    frame = spark.read.schema(ddl(schema)).parquet(uri)
    if days is not None:
        frame = frame.where(F.col("day").isin(list(days)))
    return (frame if columns is None else frame.select(*columns)).toArrow()


_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
_HIST: Final = pa.list_(pa.int64())


def schema_of(name: str, window: str) -> pa.Schema:
    """The columns of table ``name`` (``day``, the partition, last): the windows table, ``daily``
    or the groups table."""
    sums = [pa.field(name, pa.int64()) for name in tf.SUMS]
    column = tf.window_column(window)
    windows_table, groups_table = tf.table_names(window)
    if name == "daily":
        fields = [pa.field("topic", pa.string()), *sums, pa.field("redelivery_ratio", pa.float64())]
    elif name == windows_table:
        durations: list[pa.Field] = []
        for metric in tf.DURATION_METRICS:
            durations.extend(
                pa.field(f"{metric}_{stat}_ms", pa.float64()) for stat in (*tf.PERCENTILES, "max")
            )
            durations.append(pa.field(f"{metric}_hist", _HIST))
        fields = [
            pa.field("topic", pa.string()),
            pa.field(column, _TIMESTAMP),
            *sums,
            pa.field("redelivery_ratio", pa.float64()),
            *durations,
            pa.field("delayed", pa.int64(), nullable=False),
        ]
    elif name == tf.consumers_table(window):
        fields = [
            pa.field("topic", pa.string()),
            pa.field("group", pa.string()),
            pa.field("consumer", pa.string()),
            pa.field(column, _TIMESTAMP),
            pa.field("delivered", pa.int64(), nullable=False),
            pa.field("redelivered", pa.int64(), nullable=False),
        ]
    elif name == groups_table:
        fields = [
            pa.field("topic", pa.string()),
            pa.field("group", pa.string()),
            pa.field(column, _TIMESTAMP),
            *(pa.field(name, pa.int64(), nullable=False) for name in tf.GROUP_SUMS),
            pa.field("ready", pa.int64()),
            pa.field("in_flight", pa.int64()),
            pa.field("oldest_unacked_age_s", pa.float64()),
        ]
    else:
        raise ValueError(f"no table {name!r}")
    return pa.schema([*fields, pa.field("day", pa.string())])


_SPARK_TYPES: Final = {
    "string": "STRING",
    "int64": "BIGINT",
    "double": "DOUBLE",
    "timestamp[us, tz=UTC]": "TIMESTAMP",
}


def ddl(schema: pa.Schema) -> str:
    def kind(field: pa.Field) -> str:
        if pa.types.is_list(field.type):
            return f"ARRAY<{_SPARK_TYPES[str(field.type.value_type)]}>"
        return _SPARK_TYPES[str(field.type)]

    return ", ".join(
        f"`{field.name}` {kind(field)}" + ("" if field.nullable else " NOT NULL") for field in schema
    )


def dataframe(spark: SparkSession, rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> DataFrame:
    """``rows`` (dicts with at least ``schema``'s columns) as a DataFrame of ``schema``."""
    columns = {field.name: pa.array([row[field.name] for row in rows], field.type) for field in schema}
    return spark.createDataFrame(pa.table(columns, schema=schema))


@contextmanager
def write_conf(spark: SparkSession) -> Iterator[None]:
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


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name
