"""The analytics job's benchmark: ``python -m kapok.analytics.bench --events 1000000``.

A benchmark, not a test: it prints figures and asserts nothing about speed.

1. Writes an archive of ``--events`` lifecycle events into a storage dir's
   ``archive/`` (``--dir``, else a temporary directory), shaped like a busy node's:
   ``--topics`` topics over ``--days`` days, each message published, delivered and
   acked, 5 % of them retried and delivered again, 1 % dead-lettered, in time order in
   files of at most 64 MiB (the archive's rotation size: each file a stretch of
   time). Not timed as part of the job.
2. Runs ``kapok analytics --input DIR`` as a child process, exactly as a user would
   (Spark's start-up included, with the class cache mapped,
   ``kapok.analytics.classcache``: without one yet, a run over 10,000 events, not
   measured, first dumps it, as a user's first run that reads files does), and
   samples the resident memory of the child's whole process tree (the Python driver,
   the JVM, Python workers) every 0.1 s from /proc (``kapok.analytics.proctree``).
3. Prints the wall time, the tree's CPU seconds and peak RSS, the throughput and the
   machine's load average before the run (``--json`` for JSON): on a shared machine
   the wall time follows the load, the CPU seconds much less. The JVM's CPU seconds are
   also split by what its threads do (``jvm_threads``): Spark's tasks, the JIT
   compilers, the garbage collector, and the rest (the driver's planning and code
   generation).

``--incremental N`` then adds N new events (new files, in the last hour of the span) and
runs the job again: an incremental run, which reads the last day's files and what the
full run carried of the days before, and recomputes the last day only. ``--watch N``
instead starts ``kapok analytics --watch`` (one session kept), waits for its first run,
adds N new events and times them into figures: from the files written to the end of the
run that read them. ``--events 0`` measures the fixed cost (an empty archive); the cost
per million events is (CPU at N − the fixed cost) / N × 10⁶.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kapok.analytics.proctree import SAMPLE_S, Sampler
from kapok.jsonlines import dumps_lines

__all__ = ["JobRun", "main", "run_job", "run_watch", "write_archive"]

FILE_BYTES: Final = 64 * 2**20
EVENTS_PER_MESSAGE: Final = 3.1  # published, delivered, acked; 5 % retried and delivered again
START: Final = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def _message_events(
    rng: random.Random, i: int, topics: int, t: float, start: float = START
) -> list[dict[str, Any]]:
    topic = f"topic-{i % topics}"
    code = f"{int(start):08x}{i:024x}"
    base = {"code": code, "topic": topic, "group": "default"}
    events: list[dict[str, Any]] = [
        {"ev": "published", "code": code, "topic": topic, "t": t, "create_time": t, "deliver_at": t,
         "size": 100 + i % 900, "producer": f"producer-{i % 50}", "priority": 0, "key": ""},
        {"ev": "delivered", **base, "t": t + 0.002, "attempt": 1},
    ]  # fmt: skip
    done = t + rng.lognormvariate(-4.0, 1.0)  # median ≈ 18 ms
    roll = rng.random()
    if roll < 0.05:
        events.append({"ev": "retried", **base, "t": done, "reason": "nack"})
        events.append({"ev": "delivered", **base, "t": done + 0.001, "attempt": 2})
        done += rng.lognormvariate(-4.0, 1.0)
    if roll < 0.01:
        events.append({"ev": "dead_lettered", **base, "t": done, "reason": "rejected"})
    else:
        events.append({"ev": "acked", **base, "t": done})
    return events


def write_archive(
    archive: Path,
    events: int,
    *,
    topics: int = 20,
    days: float = 7.0,
    seed: int = 15,
    start: float = START,
    name: str = "20260101T000000",
) -> int:
    """Write ``events`` events over ``days`` from ``start`` into ``archive`` (files
    ``archive-<name>-<n>.jsonl``); returns the bytes written."""
    archive.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    written = total = file_no = 0
    # Messages in time order, as an archiver writes them (each file a stretch of time):
    # about 3.1 events a message.
    step_s = days * 86400.0 / max(1.0, events / EVENTS_PER_MESSAGE)
    out = None
    i = 0
    try:
        while written < events:
            chunk: list[dict[str, Any]] = []
            while written + len(chunk) < events and len(chunk) < 50_000:
                chunk.extend(_message_events(rng, i, topics, start + (i + rng.random()) * step_s, start))
                i += 1
            chunk = chunk[: events - written]  # exactly ``events``: the last message may be cut short
            data = dumps_lines(chunk, "ev") + b"\n"
            if out is None or out.tell() + len(data) > FILE_BYTES:
                if out is not None:
                    out.close()
                out = (archive / f"archive-{name}-{file_no}.jsonl").open("wb")
                file_no += 1
            out.write(data)
            written += len(chunk)
            total += len(data)
    finally:
        if out is not None:
            out.close()
    return total


@dataclass(frozen=True, slots=True)
class JobRun:
    wall_s: float
    peak_rss_bytes: int
    cpu_s: float  # of the whole tree, as last sampled (a lower bound: the last 0.1 s is missed)
    jvm_s: dict[str, float]  # the JVM's share of it by thread role (``jvm_threads``), as last sampled


def _command(store: Path, output: Path, master: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kapok", "analytics", "--input", str(store), "--output", str(output),
            "--master", master, *extra]  # fmt: skip


def run_job(store: Path, output: Path, master: str, *extra: str) -> JobRun:
    """Run ``kapok analytics`` on ``store`` as a child process, sampling its process tree."""
    started = time.monotonic()
    child = subprocess.Popen(_command(store, output, master, *extra), stderr=subprocess.PIPE, text=True)
    sampler = Sampler(child.pid)
    _, err = child.communicate()
    took = time.monotonic() - started
    sampler.stop()
    if child.returncode != 0:
        raise SystemExit(f"bench: kapok analytics failed ({child.returncode}):\n{err}")
    return JobRun(took, sampler.peak, sampler.cpu, sampler.jvm)


def run_watch(store: Path, output: Path, master: str, add: Callable[[], int], *extra: str) -> JobRun:
    """``kapok analytics --watch``: after its first run, ``add()`` new events (it returns the
    number of new files); the time and CPU from then to the end of the run(s) that read them
    all (the session kept between)."""
    child = subprocess.Popen(
        _command(store, output, master, "--watch", "0.5", *extra),
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert child.stderr is not None
    sampler = Sampler(child.pid)
    try:
        for line in child.stderr:  # the first run
            if line.startswith("kapok analytics: next run in"):
                break
        else:
            raise SystemExit(f"bench: kapok analytics --watch ended ({child.wait()})")
        cpu_before, jvm_before = sampler.cpu, sampler.jvm
        started = time.monotonic()
        files, seen = add(), 0
        for line in child.stderr:
            if found := re.search(r"an incremental run: (\d+) new", line):
                seen += int(found[1])
            if "→" in line and seen >= files:  # the run that read the last of them
                break
        else:
            raise SystemExit(f"bench: kapok analytics --watch ended ({child.wait()})")
        took = time.monotonic() - started
        time.sleep(2 * SAMPLE_S)  # one more sample of the tree
        jvm = {role: sampler.jvm[role] - jvm_before[role] for role in jvm_before}
        return JobRun(took, sampler.peak, sampler.cpu - cpu_before, jvm)
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        sampler.stop()


def _figures(name: str, events: int, job: JobRun, load: float) -> dict[str, Any]:
    return {
        "run": name,
        "events": events,
        "job_s": round(job.wall_s, 2),
        "events_per_s": round(events / job.wall_s),
        "cpu_s": round(job.cpu_s, 1),
        **{f"jvm_{role}_cpu_s": round(seconds, 1) for role, seconds in job.jvm_s.items()},
        "peak_rss_mib": round(job.peak_rss_bytes / 2**20),
        "load_avg_1m": round(load, 2),
    }


def _class_cache(master: str, conf: Sequence[str], extra: Sequence[str]) -> None:
    """Dump the class cache first if a local run has none yet (not measured): a user's
    runs after the first one that read files map it (``kapok.analytics.classcache``)."""
    from kapok.analytics.command import conf_pairs
    from kapok.analytics.session import local_class_cache

    options = conf_pairs(list(conf)).get("spark.driver.extraJavaOptions", "")
    cache = local_class_cache(options) if master.startswith("local") else None
    if cache is None or cache.archive.is_file():
        return
    _progress("no class cache yet: one run over 10,000 events dumps it (not measured)")
    with tempfile.TemporaryDirectory(prefix="kapok-analytics-bench-") as workdir:
        write_archive(Path(workdir) / "archive", 10_000, days=1.0)
        run_job(Path(workdir), Path(workdir) / "analytics", master, *extra)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kapok.analytics.bench", description="Time the analytics job."
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="archived events (default 1000000)")
    parser.add_argument("--topics", type=int, default=20, help="topics (default 20)")
    parser.add_argument("--days", type=float, default=7.0, help="days the events span (default 7)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument(
        "--dir", type=Path, help="storage dir for the archive (default: a temporary one, removed)"
    )
    more = parser.add_mutually_exclusive_group()
    more.add_argument("--incremental", type=int, metavar="N", help="then N new events: an incremental run")
    more.add_argument(
        "--watch",
        type=int,
        metavar="N",
        help="instead: --watch (one session), then N new events into figures",
    )
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    extra = [arg for item in args.conf for arg in ("--conf", item)]
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="kapok-analytics-bench-"))
    store, output = workdir, workdir / "analytics"
    span_end = START + args.days * 86400.0

    def add_new(n: int) -> int:  # new files of the span's last hour, each whole at once; how many
        staging = workdir / "staging"
        write_archive(staging, n, topics=args.topics, days=1 / 24, seed=16,
                      start=span_end - 3600, name="20991231T000000")  # fmt: skip
        files = sorted(staging.glob("*.jsonl"))
        for path in files:
            os.replace(path, store / "archive" / path.name)
        return len(files)

    runs: list[dict[str, Any]] = []
    _class_cache(args.master, args.conf, extra)
    try:
        _progress(f"writing {args.events:,} events into {workdir / 'archive'}")
        started = time.monotonic()
        size = write_archive(workdir / "archive", args.events, topics=args.topics, days=args.days)
        generated = time.monotonic() - started
        _progress(f"{size / 2**20:.1f} MiB in {generated:.1f} s; running kapok analytics")
        if args.watch is not None:
            load = os.getloadavg()[0]
            job = run_watch(store, output, args.master, lambda: add_new(args.watch), *extra)
            runs.append(_figures("watch", args.watch, job, load))
        else:
            load = os.getloadavg()[0]
            runs.append(_figures("full", args.events, run_job(store, output, args.master, *extra), load))
            if args.incremental is not None:
                add_new(args.incremental)
                load = os.getloadavg()[0]
                job = run_job(store, output, args.master, *extra)
                runs.append(_figures("incremental", args.incremental, job, load))
    finally:
        if args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    common = {
        "input_mib": round(size / 2**20, 1),
        "master": args.master,
        "cpus": os.cpu_count(),
        "conf": args.conf,
    }
    if args.json:
        print(json.dumps([{**run, **common} for run in runs]))
    else:
        for run in runs:
            figures = {**run, **common}
            width = max(map(len, figures))
            print("\n".join(f"{name:<{width}}  {value}" for name, value in figures.items()), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
