"""The analytics job's benchmark: ``python -m kapok.analytics.bench --events 1000000``.

A benchmark, not a test: it prints figures and asserts nothing about speed.

1. Writes an archive of ``--events`` lifecycle events into a storage dir's
   ``archive/`` (``--dir``, else a temporary directory), shaped like a busy node's:
   ``--topics`` topics over ``--days`` days, each message published, delivered and
   acked, 5 % of them retried and delivered again, 1 % dead-lettered, in files of at
   most 64 MiB (the archive's rotation size). Not timed as part of the job.
2. Runs ``kapok analytics --input DIR`` as a child process, exactly as a user would
   (Spark's start-up included), and samples the resident memory of the child's whole
   process tree (the Python driver, the JVM, Python workers) every 0.1 s from /proc.
3. Prints the wall time, the tree's CPU seconds and peak RSS, the throughput and the
   machine's load average before the run (``--json`` for JSON): on a shared machine
   the wall time follows the load, the CPU seconds much less.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kapok.jsonlines import dumps_lines

__all__ = ["JobRun", "main", "run_job", "tree_usage", "write_archive"]

FILE_BYTES: Final = 64 * 2**20
SAMPLE_S: Final = 0.1
START: Final = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def _message_events(rng: random.Random, i: int, topics: int, span_s: float) -> list[dict[str, Any]]:
    topic = f"topic-{i % topics}"
    code = f"{i:032x}"
    t = START + rng.random() * span_s
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


def write_archive(archive: Path, events: int, *, topics: int = 20, days: float = 7.0, seed: int = 15) -> int:
    """Write ``events`` events into ``archive``; returns the bytes written."""
    archive.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    written = total = file_no = 0
    out = None
    i = 0
    try:
        while written < events:
            chunk: list[dict[str, Any]] = []
            while written + len(chunk) < events and len(chunk) < 50_000:
                chunk.extend(_message_events(rng, i, topics, days * 86400.0))
                i += 1
            chunk = chunk[: events - written]  # exactly ``events``: the last message may be cut short
            data = dumps_lines(chunk, "ev") + b"\n"
            if out is None or out.tell() + len(data) > FILE_BYTES:
                if out is not None:
                    out.close()
                out = (archive / f"archive-20260101T000000-{file_no}.jsonl").open("wb")
                file_no += 1
            out.write(data)
            written += len(chunk)
            total += len(data)
    finally:
        if out is not None:
            out.close()
    return total


def tree_usage(root: int) -> tuple[int, float]:
    """Resident bytes and CPU seconds (user + system) of ``root`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    usage: dict[int, tuple[int, float]] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)  # ppid
        usage[pid] = (
            int(fields[21]) * page,
            (int(fields[11]) + int(fields[12])) / tick,
        )  # rss; utime + stime
    rss, cpu, todo = 0, 0.0, [root]
    while todo:
        pid = todo.pop()
        pid_rss, pid_cpu = usage.get(pid, (0, 0.0))
        rss, cpu = rss + pid_rss, cpu + pid_cpu
        todo.extend(children.get(pid, []))
    return rss, cpu


@dataclass(frozen=True, slots=True)
class JobRun:
    wall_s: float
    peak_rss_bytes: int
    cpu_s: float  # of the whole tree, as last sampled (a lower bound: the last 0.1 s is missed)


def run_job(store: Path, output: Path, master: str) -> JobRun:
    """Run ``kapok analytics`` on ``store`` as a child process, sampling its process tree."""
    args = [sys.executable, "-m", "kapok", "analytics", "--input", str(store), "--output", str(output)]
    started = time.monotonic()
    child = subprocess.Popen([*args, "--master", master], stderr=subprocess.PIPE, text=True)
    peak, cpu = 0, 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, cpu
        while not done.wait(SAMPLE_S):
            rss, used = tree_usage(child.pid)
            peak, cpu = max(peak, rss), max(cpu, used)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = child.communicate()
    took = time.monotonic() - started
    done.set()
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"bench: kapok analytics failed ({child.returncode}):\n{err}")
    return JobRun(took, peak, cpu)


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
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="kapok-analytics-bench-"))
    try:
        _progress(f"writing {args.events:,} events into {workdir / 'archive'}")
        started = time.monotonic()
        size = write_archive(workdir / "archive", args.events, topics=args.topics, days=args.days)
        generated = time.monotonic() - started
        _progress(f"{size / 2**20:.1f} MiB in {generated:.1f} s; running kapok analytics")
        load_before = os.getloadavg()[0]
        job = run_job(workdir, workdir / "analytics", args.master)
    finally:
        if args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    figures = {
        "events": args.events,
        "input_mib": round(size / 2**20, 1),
        "job_s": round(job.wall_s, 2),
        "events_per_s": round(args.events / job.wall_s),
        "cpu_s": round(job.cpu_s, 1),
        "peak_rss_mib": round(job.peak_rss_bytes / 2**20),
        "load_avg_1m": round(load_before, 2),
        "master": args.master,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(figures))
    else:
        width = max(map(len, figures))
        print("\n".join(f"{name:<{width}}  {value}" for name, value in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
