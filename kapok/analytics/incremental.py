"""Incremental runs of the job: the ledger's I/O, around ``run_job`` (rules: ``kapok.analytics.ledger``).

A run lists the input files with their sizes and mtimes (local files from the file
system, URIs through Spark's Hadoop client), reads the ledger beside the output, scans
the new files for their first and last event time (``job.scan_files``), and runs the
job restricted to the days those touch. With nothing new, no job runs. The ledger is written last.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kapok.analytics import ledger as lg
from kapok.analytics.files import (
    archive_files,
    file_key,
    list_files,
    read_text,
    remove_children,
    write_events,
    write_text,
)
from kapok.analytics.ledger import Carried, FileSpan, FileStamp, Ledger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kapok.analytics.job import JobResult, Resume

__all__ = ["read_ledger", "run_incremental", "scan_files"]


def scan_files(spark: SparkSession, files: Mapping[str, FileStamp]) -> dict[str, FileSpan]:
    """Each file's first and last event time: one pass over the files given (``job.scan_files``)."""
    from kapok.analytics import job

    scans = job.scan_files(archive_files(spark, list(files)))
    times = {file_key(name): (scan.first_t, scan.last_t) for name, scan in scans.items()}
    return {path: FileSpan(stamp, *times.get(path, (None, None))) for path, stamp in files.items()}


def read_ledger(spark: SparkSession, output: str) -> tuple[Ledger | None, str]:
    """The ledger beside ``output`` (None if there is none), and why it did not read."""
    text = read_text(spark, output.rstrip("/") + "/" + lg.LEDGER_FILE)
    if text is None:
        return None, ""
    try:
        return lg.decode(text), ""
    except lg.LedgerError as exc:
        return None, str(exc)


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
    then what it carries and the new ledger; None when nothing is new (no job ran)."""
    from kapok.analytics.job import run_job

    current = list_files(spark, sources)
    before, unreadable = read_ledger(spark, output)
    plan = lg.plan(before, current, settings, full=full, unreadable=unreadable)
    window = str(settings.get("window", "hour"))
    if plan.full:  # the job's own first pass gives every file's times: no scan
        progress(f"a full run: {plan.reason}")
        result = run_job(
            spark, sorted(current), output, now=now, progress=progress, window=window, carry=True
        )
        times = {file_key(name): span for name, span in result.file_times.items()}
        scanned = {path: FileSpan(stamp, *times.get(path, (None, None))) for path, stamp in current.items()}
    elif not plan.new:
        progress(f"nothing new in the {len(current)} file(s) read before: the tables stay as they are")
        assert before is not None  # a plan that is not full has a ledger
        ledger = lg.merge(before, current, {}, settings, before.carried)  # gone files leave it
        write_text(spark, output.rstrip("/") + "/" + lg.LEDGER_FILE, lg.encode(ledger))
        return None
    else:
        assert before is not None
        scanned = scan_files(spark, {path: current[path] for path in plan.new})
        touched = lg.touched_days(before, scanned)
        known = lg.merge(before, current, scanned, settings).files
        last_t = max((span.last_t for span in known.values() if span.last_t is not None), default=None)
        resumed = lg.resumed_days(before.carried, touched, last_t)
        resume = None if resumed is None else _resume(spark, output, before.carried)
        days = sorted(touched) if resume is None or resumed is None else resumed
        files = sorted(current) if resume is None else sorted(plan.new)
        progress(
            f"an incremental run: {len(plan.new)} new or grown file(s) of {len(current)}, "
            f"{len(days)} day(s) to recompute ({', '.join(days) or 'none'}), from {len(files)} file(s)"
            + ("" if resume is None else f" and what the run before carried from {days[0]}")
        )
        # From what the run before carried, only the new files are read. Without it (or
        # with a new file older than it) every file is: a message's life crosses days and
        # files (a backlog is a running sum over all of it), but only the touched days
        # are counted and written.
        result = run_job(
            spark,
            files,
            output,
            days=days,
            now=now,
            progress=progress,
            window=window,
            resume=resume,
            carry=True,
        )
    carried = None if result.carried is None else _write_carried(spark, output, result.carried, now)
    write_text(
        spark,
        output.rstrip("/") + "/" + lg.LEDGER_FILE,
        lg.encode(lg.merge(before, current, scanned, settings, carried)),
    )
    # What earlier runs carried: the ledger no longer names it.
    remove_children(spark, f"{output.rstrip('/')}/{lg.CARRY_DIR}", None if carried is None else carried.name)
    return result


def _resume(spark: SparkSession, output: str, carried: Carried | None) -> Resume | None:
    """What the run before carried, if its table is still there."""
    from kapok.analytics.job import Resume

    if carried is None:
        return None
    uri = f"{output.rstrip('/')}/{lg.CARRY_DIR}/{carried.name}"
    if read_text(spark, uri + "/_SUCCESS") is None:  # removed by hand, or a copy of the output
        return None
    starts = {topic: dict(groups) for topic, groups in carried.starts.items()}
    return Resume(carried.t, uri, starts, carried.recent)


def _write_carried(spark: SparkSession, output: str, resume: Resume, now: float) -> Carried:
    """Write what a run carries under a new name (the ledger, written next, names it)."""
    name = f"run-{int(now * 1000)}"
    assert not isinstance(resume.events, str)  # a run gives the table
    write_events(spark, resume.events, f"{output.rstrip('/')}/{lg.CARRY_DIR}/{name}")
    return Carried(resume.t, name, resume.starts, resume.recent)
