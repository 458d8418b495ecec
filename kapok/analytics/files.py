"""The job's files: the archive files it reads, and what it writes and reads beside its
tables, on a local disk directly or through Spark's Hadoop client (hdfs, s3a, abfs …:
Python has no client for every file system Spark writes; the JVM has, with the
session's credentials)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from kapok.analytics import reading
from kapok.analytics.ledger import FileStamp

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "EVENTS_DDL",
    "archive_files",
    "file_bytes",
    "file_key",
    "hadoop_path",
    "is_local",
    "list_files",
    "read_local_table",
    "read_text",
    "remove_children",
    "write_events",
    "write_text",
]


def hadoop_path(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    """``uri``'s Hadoop file system (with the session's settings and credentials) and path."""
    jvm: Any = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def is_local(uri: str) -> bool:
    """A path, or a ``file:`` URI."""
    return "://" not in uri or uri.startswith("file:")


def _local_path(source: str) -> str:
    return unquote(urlsplit(source).path) if source.startswith("file:") else source


def file_key(uri: str) -> str:
    """One name per file, whoever spells it: a local file's absolute path, else the URI."""
    return os.path.abspath(_local_path(uri)) if is_local(uri) else uri


def archive_files(spark: SparkSession, sources: Sequence[str]) -> DataFrame | None:
    """A row per file of ``sources`` (files, directories, globs or URIs): ``path`` (as Spark
    names it) and ``content``: its bytes, read by Spark's own file systems, or null for a
    local file, which the task reads itself (``file_bytes``): its bytes then do not pass
    through the JVM on their way to Python. None for none."""
    local = [source for source in sources if _local_file(source)]
    others = [source for source in sources if source not in set(local)]
    frames = []
    if local:
        paths = pa.table({"path": local, "content": pa.nulls(len(local), pa.binary())})
        frames.append(spark.createDataFrame(paths, schema="path STRING, content BINARY"))
    if others:
        frames.append(spark.read.format("binaryFile").load(others).select("path", "content"))
    if not frames:
        return None
    return frames[0] if len(frames) == 1 else frames[0].unionAll(frames[1])


def _local_file(source: str) -> bool:
    return is_local(source) and not any(c in source for c in "*?[") and os.path.isfile(_local_path(source))


def file_bytes(path: str, content: bytes | None) -> bytes:
    """A file's bytes: ``content``, or (null) read from the local file ``path`` (in a task)."""
    if content is not None:
        return content
    with open(_local_path(path), "rb") as file:
        return file.read()


def list_files(spark: SparkSession, sources: Sequence[str]) -> dict[str, FileStamp]:
    """Every archive file of ``sources`` and its stamp (a local file's resolved before: a file)."""
    out: dict[str, FileStamp] = {}
    for source in sources:
        if is_local(source):
            try:
                stat = os.stat(_local_path(source))
            except OSError:
                continue  # deleted since resolved: retention
            out[file_key(source)] = FileStamp(stat.st_size, stat.st_mtime)
            continue
        fs, path = hadoop_path(spark, source)
        for status in fs.globStatus(path) or []:
            found = fs.listStatus(status.getPath()) if status.isDirectory() else [status]
            for item in found:
                name = item.getPath().getName()
                if item.isFile() and (
                    not status.isDirectory() or (name.startswith("archive-") and name.endswith(".jsonl"))
                ):
                    out[str(item.getPath().toString())] = FileStamp(
                        int(item.getLen()), item.getModificationTime() / 1000.0
                    )
    return out


def read_text(spark: SparkSession, uri: str) -> str | None:
    """A small text file's content (None if there is none): a local one directly, else through Hadoop."""
    if is_local(uri):
        try:
            return Path(file_key(uri)).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
    fs, path = hadoop_path(spark, uri)
    if not fs.exists(path):
        return None
    stream = fs.open(path)
    try:
        jvm: Any = spark.sparkContext._jvm
        data = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return bytes(data).decode("utf-8", errors="replace")


def write_text(spark: SparkSession, uri: str, text: str) -> None:
    """Write a small text file: atomically on a local disk, else through Spark's Hadoop client."""
    if is_local(uri):
        path = Path(_local_path(uri))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return
    fs, target = hadoop_path(spark, uri)
    stream = fs.create(target, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


# ``reading.EVENT_FIELDS`` as Spark's DDL: the carried events' Parquet table.
EVENTS_DDL: Final = (
    "ev STRING, code STRING, topic STRING, `group` STRING, t DOUBLE, create_time DOUBLE, "
    "deliver_at DOUBLE, size BIGINT, attempt INT, run STRING, lsn BIGINT, consumer STRING"
)


def write_events(spark: SparkSession, events: pa.Table, uri: str) -> None:
    """Write events (``reading.EVENT_FIELDS``) as a Parquet table at ``uri`` (replaced): on a
    local disk by this process (one file, then ``_SUCCESS``, as Spark marks a table written),
    else by Spark."""
    if is_local(uri):
        root = Path(file_key(uri))
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        pq.write_table(events.cast(reading.EVENT_FIELDS), root / "part-00000.parquet")
        (root / "_SUCCESS").touch()
        return
    frame = spark.createDataFrame(events.cast(reading.EVENT_FIELDS), schema=EVENTS_DDL)
    frame.coalesce(1).write.mode("overwrite").parquet(uri)


def read_local_table(
    uri: str, schema: pa.Schema, columns: Sequence[str] | None = None, days: Sequence[str] | None = None
) -> pa.Table | None:
    """A table the job wrote on a local disk (partitioned by ``day``, ``schema``'s last
    column), read by this process (None if there is none): ``columns`` of it (all for
    None), of ``days`` (all for None). A column a file lacks (written before the column
    existed) reads as null, as Spark reads it."""
    root = Path(file_key(uri))
    if not root.is_dir():
        return None
    partitioning = ds.partitioning(pa.schema([schema.field("day")]), flavor="hive")
    dataset = ds.dataset(root, schema=schema, format="parquet", partitioning=partitioning)
    only = None if days is None else ds.field("day").isin(list(days))
    return dataset.to_table(columns=None if columns is None else list(columns), filter=only)


def remove_children(spark: SparkSession, base: str, keep: str | None) -> None:
    """Remove everything in the folder ``base`` but ``keep``."""
    if is_local(base):
        root = Path(file_key(base))
        for child in root.iterdir() if root.is_dir() else []:
            if child.name != keep:
                shutil.rmtree(child, ignore_errors=True)
        return
    fs, path = hadoop_path(spark, base)
    if fs.exists(path):
        for status in fs.listStatus(path):
            if status.getPath().getName() != keep:
                fs.delete(status.getPath(), True)
