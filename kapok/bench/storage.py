"""Snapshot and recovery benchmark: ``python -m kapok.bench.storage --messages 1000000``.

What it does, in one process:

1. opens an empty ``DiskStore`` on ``--dir`` (a fresh temporary directory by
   default) with a fresh ``Broker`` (``Config.default().mq``), exactly as a
   node starts;
2. populates that broker directly (journal off: the WAL stays empty, so
   the snapshot is the whole state): ``--messages`` messages of
   ``--payload`` bytes over ``--topics`` p2p topics, published in batches
   of 1000; then half of every topic is delivered to a consumer and every
   fifth delivery is acked, so the snapshot holds ready, in-flight and
   consumed (retained) messages;
3. writes a snapshot with ``DiskStore.snapshot()`` (the code path of the
   periodic snapshot), then closes that store (its shutdown snapshot is
   written too but not measured) and drops the broker;
4. recovers: a new ``Broker`` and a new ``DiskStore`` on the same directory,
   ``await store.open(broker, now)``, and checks that the recovered broker
   holds the same messages.

It prints a table (or JSON with ``--json``) of the message count, the
snapshot's write time, size and bytes per message, the recovery time and
the process's resident memory at each step. Progress goes to stderr. The
exit code is 1 when recovery did not give back what was written.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kapok.bench.proc import peak_rss_bytes, rss_bytes
from kapok.config import Config
from kapok.core.broker import Broker, Draft
from kapok.core.model import Status
from kapok.storage.disk import DiskStore

__all__ = ["main", "run"]

BATCH = 1000
ACK_EVERY = 5  # ack every fifth delivered message
MAX_PREFETCH = 1_000_000  # the broker's limit per consumer


def _own_rss() -> int:
    """This process's RSS (its archiver child not included: the figure is the broker's state)."""
    return rss_bytes(children=False) or peak_rss_bytes()


def _progress(text: str, quiet: bool) -> None:
    if not quiet:
        print(f"bench: {text}", file=sys.stderr, flush=True)


def _census(broker: Broker) -> dict[str, int]:
    """How many messages, and how many per-group entries in each status."""
    counts = {"messages": len(broker.messages), "live": 0}
    for msg in broker.messages.values():
        if msg.live:
            counts["live"] += 1
        for entry in msg.all_entries():
            status = entry.status
            # In flight before a restart is ready after it: compare them as one.
            key = "ready" if status in (Status.READY, Status.INFLIGHT) else status.value
            counts[key] = counts.get(key, 0) + 1
    return counts


def _populate(broker: Broker, n: int, payload: int, topics: int, quiet: bool) -> dict[str, int]:
    names = [f"bench.{i}" for i in range(topics)]
    filler = b"x" * payload
    step = max(n // 10, 1)
    published = 0
    while published < n:
        size = min(BATCH, n - published)
        now = time.time()
        # A distinct payload object per message, as real traffic has (and recovery makes).
        drafts = [
            Draft(names[(published + i) % topics], (b"%010d" % (published + i) + filler)[:payload])
            for i in range(size)
        ]
        broker.publish(drafts, now)
        if (published + size) // step != published // step:
            _progress(f"published {published + size:,}/{n:,}", quiet)
        published += size
    delivered = acked = 0
    for name in names:
        remaining = broker.topics[name].live_count // 2
        while remaining > 0:
            prefetch = min(remaining, MAX_PREFETCH)
            consumer = broker.subscribe(name, now=time.time(), prefetch=prefetch)
            pushed = broker.take_pushes().get(consumer.id, [])
            codes = [entry.msg.code for entry in pushed[::ACK_EVERY]]
            # No credit for more once the acks free some: the rest stays in flight.
            broker.set_prefetch(consumer.id, max(len(pushed) - len(codes), 1), time.time())
            for i in range(0, len(codes), BATCH):
                broker.ack(consumer.id, codes[i : i + BATCH], time.time())
            assert not broker.take_pushes()
            delivered += len(pushed)
            acked += len(codes)
            remaining -= len(pushed)
            if not pushed:
                break
    _progress(f"delivered {delivered:,} and acked {acked:,}", quiet)
    return {"delivered": delivered, "acked": acked}


async def run(
    n: int, payload: int, directory: Path, *, topics: int = 4, quiet: bool = False
) -> dict[str, Any]:
    """The benchmark; returns its figures (see the module docstring)."""
    cfg = Config.default()
    storage = dataclasses.replace(
        cfg.storage,
        dir=str(directory),
        archive=False,
        snapshot_interval_s=1e9,  # no periodic snapshot in the middle of the measurement
    )
    figures: dict[str, Any] = {
        "messages": n,
        "payload_bytes": payload,
        "topics": topics,
        "dir": str(directory),
    }

    broker = Broker(cfg.mq.settings(), journal=False)
    store = DiskStore(storage)
    await store.open(broker, time.time())
    started = time.perf_counter()
    figures.update(_populate(broker, n, payload, topics, quiet))
    figures["populate_s"] = time.perf_counter() - started
    figures["rss_populated_bytes"] = _own_rss()
    before = _census(broker)
    figures["live_messages"] = before["live"]

    _progress("writing the snapshot", quiet)
    started = time.perf_counter()
    await store.snapshot()
    figures["snapshot_wall_s"] = time.perf_counter() - started
    figures["snapshot_s"] = store.last_snapshot_s
    figures["snapshot_bytes"] = store.last_snapshot_bytes
    figures["bytes_per_message"] = store.last_snapshot_bytes / n if n else 0.0
    _progress("closing the store (its shutdown snapshot is not measured)", quiet)
    await store.aclose()
    del broker, store
    gc.collect()
    figures["rss_before_recovery_bytes"] = _own_rss()

    _progress("recovering", quiet)
    recovered = Broker(cfg.mq.settings(), journal=True)
    store = DiskStore(storage)
    started = time.perf_counter()
    await store.open(recovered, time.time())
    figures["recovery_wall_s"] = time.perf_counter() - started
    figures["recovery_s"] = store.recovery_s
    figures["rss_recovered_bytes"] = _own_rss()
    figures["peak_rss_bytes"] = peak_rss_bytes()
    after = _census(recovered)
    figures["recovered_messages"] = after["messages"]
    figures["recovered_live_messages"] = after["live"]
    figures["recovered_ok"] = after == before
    if after != before:
        figures["census_before"] = before
        figures["census_after"] = after
    recovered.take_changes()
    recovered.take_pushes()
    await store.aclose()
    return figures


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def format_table(f: dict[str, Any]) -> str:
    rows = [
        ("messages", f"{f['messages']:,}"),
        ("payload bytes", f"{f['payload_bytes']:,}"),
        ("live / delivered / acked", f"{f['live_messages']:,} / {f['delivered']:,} / {f['acked']:,}"),
        ("populate s", f"{f['populate_s']:.3f}"),
        ("snapshot write s", f"{f['snapshot_s']:.3f}"),
        ("snapshot bytes", f"{f['snapshot_bytes']:,}"),
        ("bytes/message", f"{f['bytes_per_message']:.1f}"),
        ("recovery s", f"{f['recovery_s']:.3f}"),
        (
            "recovered messages",
            f"{f['recovered_messages']:,} ({'same state' if f['recovered_ok'] else 'MISMATCH'})",
        ),
        ("RSS after populate", _mib(f["rss_populated_bytes"])),
        ("RSS before recovery", _mib(f["rss_before_recovery_bytes"])),
        ("RSS after recovery", _mib(f["rss_recovered_bytes"])),
        ("peak RSS", _mib(f["peak_rss_bytes"])),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value:>24}" for name, value in rows)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kapok.bench.storage",
        description="Measure snapshot size and time, and recovery time and memory, for N messages.",
    )
    parser.add_argument("--messages", type=_positive, default=1_000_000, help="messages to store (1000000)")
    parser.add_argument("--payload", type=_positive, default=100, help="payload bytes per message (100)")
    parser.add_argument("--topics", type=_positive, default=4, help="topics to spread them over (4)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="data directory, empty or new (a temporary one)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    temporary = args.dir is None
    directory: Path = Path(tempfile.mkdtemp(prefix="kapok-bench-")) if temporary else args.dir
    if not temporary and directory.exists() and any(directory.iterdir()):
        print(f"bench: error: {directory} is not empty", file=sys.stderr)
        return 2
    try:
        figures = asyncio.run(
            run(args.messages, args.payload, directory, topics=args.topics, quiet=args.quiet)
        )
    finally:
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(figures, indent=2) if args.json else format_table(figures))
    if not figures["recovered_ok"]:
        print("bench: error: the recovered state differs from the state written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
