"""``kapok analytics``: check the inputs, start Spark once, run the job (again every ``--watch``).

Progress goes to stderr, one line a step. What can be checked without Spark is
checked first (inputs, pyspark, Java), so those errors cost no JVM start-up. With
``--watch`` the session stays up between runs and the inputs are resolved again
each time (the archive gains files); a run that fails after the first is reported
and the next one tried, so the console keeps the last good ``summary.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from kapok.analytics.inputs import default_output, resolve_inputs
from kapok.analytics.session import build_session, require_runtime
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
    session, owned = _session(args.master)
    try:
        run = 0
        while True:
            try:
                _run_once(session, args, output)
            except AnalyticsError as exc:
                if not run:  # the first run's errors end the command
                    raise
                progress(f"error: {exc.message}")
            run += 1
            if args.watch is None:
                return 0
            progress(f"next run in {args.watch:g} s (Ctrl-C stops)")
            wait(args.watch)
    finally:
        if owned:
            session.stop()


def _session(master: str) -> tuple[SparkSession, bool]:
    """The process's running session (a caller that embeds the job), else a new one we own."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    progress(f"starting Spark ({master})")
    return build_session(master), True


def _run_once(session: SparkSession, args: argparse.Namespace, output: str) -> None:
    from kapok.analytics.job import run_job

    inputs = resolve_inputs(args.input)
    started = time.monotonic()
    now = time.time()
    local = f"{inputs.local_files} files, {inputs.local_bytes / 2**20:.1f} MiB"
    remote = len(inputs.sources) - inputs.local_files
    progress(f"reading {local}" + (f" and {remote} other inputs" if remote else ""))
    since_t = None if args.since is None else now - args.since
    window = getattr(args, "window", None) or "hour"
    result = run_job(
        session, inputs.sources, output, since_t=since_t, now=now, progress=progress, window=window
    )
    took = time.monotonic() - started
    progress(
        f"{result.topics} topics, {result.topic_hours} topic-hours → {output} "
        f"(summary.json, hourly/, daily/) in {took:.1f} s"
    )
