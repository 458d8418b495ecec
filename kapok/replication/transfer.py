"""A slave's full state transfer, both ends, and the records it sets aside when its log diverged.

The master streams its state (``send_transfer``) while it keeps serving: the walk of the
state (``kapok.core.replay.state_records``) runs on the event loop, since the broker
lives there, but in slices of at most ``SLICE_S`` of loop time (and ``SLICE_RECORDS``
records, ``SLICE_BYTES`` of message data); each slice is encoded on a worker thread
(records are frozen values built on the loop; the one mutable thing they hold, a
message's headers, is never changed once published) and sent, and the loop serves
whatever waited in between. A slow slave holds the walk back instead of filling the
master's memory: aiohttp's ``send_bytes`` waits for the transport to drain once its
buffer is past the high-water mark, so at most about one slice is buffered. (Sent in one
go, the walk held the loop for the whole state: 0.7 to 2 s for 200,000 queued messages,
in which the master answered nothing, not even gossip, and its witness declared it dead;
tests/e2e/test_transfer_stall.py.)

Slicing makes the snapshot fuzzier, not wrong: it is taken from the LSN the WAL was cut
at, every change made while it is walked is logged after that LSN, and replaying the log
from there on top of it is idempotent (``kapok.core.replay``), so the slave ends with
the master's state whatever the broker did between two slices.

The streamed snapshot is written beside the store (``kapok.storage.disk.begin_transfer``),
which stays as it is until the snapshot is whole: a transfer cut short leaves the node its
old state, never an empty one. Then the store is reopened on it (as a mirror).

When a master comes back after its slave took over, whatever its log holds past the
point both logs share never reached the new master: in sync mode those writes were never
confirmed to a producer, in async mode they are the replication loss. They are written to
``<storage.dir>/diverged/`` as JSON lines, one record a line, messages with their
payloads, so an operator can look at them and publish again what matters.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from kapok.config import Config
from kapok.core import changes as ch
from kapok.protocol.sync import SNAPSHOT
from kapok.storage.disk import DiskStore, begin_transfer
from kapok.storage.records import encode_end, encode_payload, frame_header

__all__ = [
    "SLICE_BYTES",
    "SLICE_RECORDS",
    "SLICE_S",
    "receive_transfer",
    "record_json",
    "send_transfer",
    "write_diverged",
]

log = logging.getLogger("kapok.replication")

# One slice of the state walk, and one snapshot frame: whichever limit comes first.
SLICE_S: Final = 0.005  # event-loop time the walk may take at once
SLICE_RECORDS: Final = 5000
SLICE_BYTES: Final = 1024 * 1024  # message data; a frame holds at most this plus one message
_CLOCK_EVERY: Final = 32  # records between two looks at the clock (a record takes a few µs)


class Link(Protocol):
    """What ``send_transfer`` needs of the sync link (``kapok.replication.link.SyncLink``)."""

    async def send_binary(self, data: bytes) -> None: ...

    async def send_control(self, op: str, **fields: Any) -> None: ...


async def send_transfer(link: Link, records: Iterator[ch.Change], lsn: int) -> tuple[int, int]:
    """Send ``records`` (a live walk: ``state_records``) as ``S`` frames, one a slice, then
    ``snapshot_end`` at ``lsn``; returns how many records and bytes went out."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    count = size = slices = 0
    while batch := _take_slice(records, SLICE_S, SLICE_RECORDS, SLICE_BYTES):
        data = await loop.run_in_executor(None, _snapshot_frame, batch)  # the loop serves meanwhile
        await link.send_binary(data)  # waits while the transport is past its high-water mark
        count += len(batch)
        size += len(data)
        slices += 1
    await link.send_control("snapshot_end", lsn=lsn)
    log.info(
        "full transfer sent: %d records, %d bytes in %d slices, %.3f s",
        count, size, slices, time.perf_counter() - started,
    )  # fmt: skip
    return count, size


def _take_slice(
    records: Iterator[ch.Change],
    budget_s: float,
    most: int,
    most_bytes: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[ch.Change]:
    """The next records of the walk, taken on the event loop: at most ``most`` of them,
    about ``budget_s`` of work and ``most_bytes`` of message data (one message more)."""
    out: list[ch.Change] = []
    add = out.append
    deadline = clock() + budget_s
    data = 0
    published = ch.Published
    for record in records:
        add(record)
        if type(record) is published:
            data += len(record.data)
        n = len(out)
        if n >= most or data >= most_bytes or (n % _CLOCK_EVERY == 0 and clock() >= deadline):
            break
    return out


def _snapshot_frame(records: list[ch.Change]) -> bytes:
    """An ``S`` frame of ``records`` (a worker thread's work: the CRC of a large buffer
    releases the GIL, and the loop should not wait to take it back)."""
    payload = encode_payload(records)
    return b"".join((SNAPSHOT, frame_header(payload), payload))


class Service(Protocol):
    config: Config
    store: Any

    async def reopen(self, store: DiskStore, *, mirror: bool) -> None: ...


async def receive_transfer(
    service: Service,
    lsn: int,
    shared: int,
    chunks: Callable[[], Awaitable[bytes | None]],
    directory: Path,
    epoch: int,
    *,
    lost: bool,
) -> int:
    """Write the snapshot ``chunks`` stream (``None`` ends it) at ``lsn``, set aside the local
    records past ``shared`` (``lost``: async replication, else never confirmed), and reopen
    the store on the transfer. Returns how many records were set aside."""
    loop = asyncio.get_running_loop()
    writer = await loop.run_in_executor(None, begin_transfer, service.config.storage, lsn)
    size = 0
    try:
        while (chunk := await chunks()) is not None:
            size += len(chunk)
            if chunk:
                await loop.run_in_executor(None, writer.write, chunk)
        await loop.run_in_executor(None, writer.write, encode_end())
        await loop.run_in_executor(None, writer.commit)
    except BaseException:
        with contextlib.suppress(OSError):
            writer.abort()
        raise
    store: DiskStore = service.store
    count = 0
    if shared < store.wal.next_lsn:
        await store.wal.flush()
        path = directory / "diverged" / f"diverged-epoch{epoch}-lsn{shared}.jsonl"
        count, published = await loop.run_in_executor(None, write_diverged, store.replay_from(shared), path)
        log.error(
            "%d records past LSN %d never reached the new master (%d published messages: %s); "
            "written to %s", count, shared, published, "lost" if lost else "never confirmed", path,
        )  # fmt: skip
    log.info("full transfer received: %d bytes of state at LSN %d", size, lsn)
    await service.reopen(DiskStore(service.config.storage), mirror=True)  # installs it
    return count


_TYPES = {
    ch.Published: "published",
    ch.GroupCreated: "group_created",
    ch.Delivered: "delivered",
    ch.Requeued: "requeued",
    ch.Settled: "settled",
    ch.MessageDeleted: "deleted",
    ch.Deduped: "deduped",
    ch.Checkpoint: "checkpoint",
}


def record_json(record: ch.Change) -> dict[str, Any]:
    row: dict[str, Any] = {"type": _TYPES[type(record)]}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if field.name == "data":
            try:
                row["data"] = value.decode()
            except UnicodeDecodeError:
                row["data"] = base64.b64encode(value).decode()
                row["encoding"] = "base64"
        else:
            row[field.name] = list(value) if isinstance(value, tuple) else value
    return row


def write_diverged(records: Iterable[ch.Change], path: Path) -> tuple[int, int]:
    """Write ``records`` to ``path``; returns how many, and how many were publishes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = published = 0
    with path.open("wb") as out:
        for record in records:
            row = record_json(record)
            published += row["type"] == "published"
            out.write(orjson.dumps(row) + b"\n")
            count += 1
    return count, published
