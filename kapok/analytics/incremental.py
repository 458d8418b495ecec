"""Incremental runs of the job: the ledger's I/O, around ``run_job`` (rules: ``kapok.analytics.ledger``).

A run lists the input files with their sizes and mtimes (local files from the file
system, URIs through Spark's Hadoop client), reads the ledger beside the output, scans
the new files for their first and last event time (``job.scan_files``), and runs the
job restricted to the days those touch. With nothing new, no job runs. The ledger is written last.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from kapok.analytics import ledger as lg
from kapok.analytics.ledger import FileSpan, FileStamp, Ledger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kapok.analytics.job import JobResult

__all__ = ["list_files", "read_ledger", "run_incremental", "scan_files"]


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file:")


def file_key(uri: str) -> str:
    """One name per file, whoever spells it: a local file's absolute path, else the URI."""
    if uri.startswith("file:"):
        return os.path.abspath(unquote(urlsplit(uri).path))
    return os.path.abspath(uri) if _is_local(uri) else uri


def list_files(spark: SparkSession, sources: Sequence[str]) -> dict[str, FileStamp]:
    """Every archive file of ``sources`` and its stamp (a local file's resolved before: a file)."""
    out: dict[str, FileStamp] = {}
    for source in sources:
        if _is_local(source):
            try:
                stat = os.stat(source.removeprefix("file://"))
            except OSError:
                continue  # deleted since resolved: retention
            out[file_key(source)] = FileStamp(stat.st_size, stat.st_mtime)
            continue
        jvm: Any = spark.sparkContext._jvm
        conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
        path = jvm.org.apache.hadoop.fs.Path(source)
        fs = path.getFileSystem(conf)
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


def scan_files(spark: SparkSession, files: Mapping[str, FileStamp]) -> dict[str, FileSpan]:
    """Each file's first and last event time: one pass over the files given (``job.scan_files``)."""
    from kapok.analytics import job

    scans = job.scan_files(job.archive_files(spark, list(files)))
    times = {file_key(name): (scan.first_t, scan.last_t) for name, scan in scans.items()}
    return {path: FileSpan(stamp, *times.get(path, (None, None))) for path, stamp in files.items()}


def read_ledger(spark: SparkSession, output: str) -> tuple[Ledger | None, str]:
    """The ledger beside ``output`` (None if there is none), and why it did not read."""
    text = _read_text(spark, output.rstrip("/") + "/" + lg.LEDGER_FILE)
    if text is None:
        return None, ""
    try:
        return lg.decode(text), ""
    except lg.LedgerError as exc:
        return None, str(exc)


def _read_text(spark: SparkSession, uri: str) -> str | None:
    """A small text file's content (None if there is none): a local one directly, else through Hadoop."""
    if _is_local(uri):
        try:
            return Path(file_key(uri)).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
    jvm: Any = spark.sparkContext._jvm
    conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(conf)
    if not fs.exists(path):
        return None
    stream = fs.open(path)
    try:
        data = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return bytes(data).decode("utf-8", errors="replace")


def run_incremental(
    spark: SparkSession,
    sources: Sequence[str],
    output: str,
    *,
    settings: Mapping[str, Any],
    full: bool,
    now: float,
    progress: Callable[[str], None],
) -> JobResult | None:
    """A run that recomputes the days of what is new since the ledger's run (or every day),
    then the new ledger; None when nothing is new (no job ran)."""
    from kapok.analytics.job import run_job, write_text

    current = list_files(spark, sources)
    before, unreadable = read_ledger(spark, output)
    plan = lg.plan(before, current, settings, full=full, unreadable=unreadable)
    window = str(settings.get("window", "hour"))
    if plan.full:  # the job's own first pass gives every file's times: no scan
        progress(f"a full run: {plan.reason}")
        result = run_job(spark, sorted(current), output, now=now, progress=progress, window=window)
        times = {file_key(name): span for name, span in result.file_times.items()}
        scanned = {path: FileSpan(stamp, *times.get(path, (None, None))) for path, stamp in current.items()}
    elif not plan.new:
        progress(f"nothing new in the {len(current)} file(s) read before: the tables stay as they are")
        result, scanned = None, {}
    else:
        scanned = scan_files(spark, {path: current[path] for path in plan.new})
        days = sorted(lg.touched_days(before, scanned))
        known = lg.merge(before, current, scanned, settings).files
        progress(
            f"an incremental run: {len(plan.new)} new or grown file(s) of {len(current)}, "
            f"{len(days)} day(s) to recompute ({', '.join(days) or 'none'}), "
            f"from {len(lg.files_for_days(known, days))} file(s)"
        )
        # Every file is read: a message's life crosses days and files (a backlog is a running
        # sum over all of it), but only the touched days are counted and written.
        result = run_job(spark, sorted(current), output, days=days, now=now, progress=progress, window=window)
    write_text(
        spark,
        output.rstrip("/") + "/" + lg.LEDGER_FILE,
        lg.encode(lg.merge(before, current, scanned, settings)),
    )
    return result
