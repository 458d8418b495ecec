"""``kapok analytics``: check the inputs, start Spark once, run the job (again every ``--watch``).

Progress goes to stderr, one line a step. What can be checked without Spark is
checked first (inputs, pyspark, Java), so those errors cost no JVM start-up. With
``--watch`` the session stays up between runs and the inputs are resolved again
each time (the archive gains files); a run that fails after the first is reported
and the next one tried, so the console keeps the last good ``summary.json``. A run
that fails because the JVM died ends the command, ``--watch`` or not, with how it
died: every later call would fail too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from kapok.analytics.inputs import default_output, resolve_inputs
from kapok.analytics.session import (
    build_session,
    driver_heap,
    jvm_death,
    quiet_py4j,
    require_runtime,
    stop_session,
)
from kapok.errors import AnalyticsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["run_command"]


def progress(text: str) -> None:
    print(f"kapok analytics: {text}", file=sys.stderr, flush=True)


def wait(seconds: float) -> None:
    """The pause between ``--watch`` runs (a seam: tests replace it, not ``time.sleep``)."""
    time.sleep(seconds)


def run_command(args: argparse.Namespace) -> int:
    inputs = resolve_inputs(args.input)
    output: str = args.output or default_output(inputs)
    require_runtime()
    session, owned = _session(args.master, conf_pairs(args.conf or []))
    death: AnalyticsError | None = None
    read_files = False  # whether a run read a file: only then is the class cache's dump kept
    try:
        heap, run = driver_heap(session), 0
        while True:
            # Checked before a later run too: one with nothing new calls no JVM.
            if run and (death := jvm_death(session, heap)) is not None:
                raise death
            try:
                read_files = _run_once(session, args, output) or read_files
            except Exception as exc:
                # A dead JVM fails the run in whichever call came next (a Py4J error, a
                # refused connection): say that instead, and stop.
                if (death := jvm_death(session, heap)) is not None:
                    raise death from exc
                if run == 0 or not isinstance(exc, AnalyticsError):  # these end the command
                    raise
                progress(f"error: {exc.message}")
            run += 1
            if args.watch is None:
                return 0
            progress(f"next run in {args.watch:g} s (Ctrl-C stops)")
            wait(args.watch)
    finally:
        if owned and death is None:  # a dead JVM has nothing to stop
            stop_session(session, read_files=read_files)


def conf_pairs(items: list[str]) -> dict[str, str]:
    """``--conf key=value`` items as settings (``ValueError`` for one without a key or ``=``)."""
    conf: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf takes key=value, got {item!r}")
        conf[key.strip()] = value
    return conf


def _session(master: str | None, conf: dict[str, str]) -> tuple[SparkSession, bool]:
    """The process's running session (a caller that embeds the job), else a new one we own.

    Without ``--master``, the master is spark-submit's when it started this process, else
    ``local[*]``.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    if master is None and not submitted():
        master = "local[*]"
    progress(f"starting Spark ({master or 'as spark-submit set it'})")
    quiet_py4j()
    return build_session(master, conf=conf, class_cache=True), True


def submitted() -> bool:
    """Whether spark-submit started this process (its JVM is already there)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def input_names(specs: list[str]) -> list[str]:
    """The ``--input`` set as the ledger compares it: local names absolute, in order."""
    return sorted(
        {spec if "://" in spec and not spec.startswith("file:") else _absolute(spec) for spec in specs}
    )


def _absolute(spec: str) -> str:
    return os.path.abspath(os.path.expanduser(spec.removeprefix("file://")))


def _run_once(session: SparkSession, args: argparse.Namespace, output: str) -> bool:
    """One run of the job (or none, when nothing is new); whether it read any file."""
    from kapok.analytics import transforms as tf
    from kapok.analytics.incremental import run_incremental
    from kapok.analytics.job import run_job

    inputs = resolve_inputs(args.input)
    started = time.monotonic()
    now = time.time()
    local = f"{inputs.local_files} files, {inputs.local_bytes / 2**20:.1f} MiB"
    remote = len(inputs.sources) - inputs.local_files
    progress(f"reading {local}" + (f" and {remote} other inputs" if remote else ""))
    if args.since is None:  # an incremental run, or a full one (the ledger says which)
        settings = {"window": args.window, "inputs": input_names(args.input)}
        full = bool(args.full)
        result = run_incremental(
            session, inputs.sources, output, settings=settings, full=full, now=now, progress=progress
        )
    else:  # a window: its days recomputed from everything read; the ledger is left as it is
        result = run_job(
            session,
            inputs.sources,
            output,
            since_t=now - args.since,
            now=now,
            progress=progress,
            window=args.window,
        )
    took = time.monotonic() - started
    if result is None:  # nothing new
        return False
    windows_table, groups_table = tf.table_names(args.window)
    tables = ", ".join(
        f"{name}/" for name in (windows_table, "daily", groups_table, tf.consumers_table(args.window))
    )
    progress(
        f"{result.topics} topics, {result.topic_hours} topic-windows → {output} "
        f"(summary.json, {tables}) in {took:.1f} s"
    )
    return bool(result.file_times)  # files read: the job's tasks ran
