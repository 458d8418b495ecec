"""A slave's full state transfer, and the records it sets aside when its log diverged.

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
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import orjson

from kapok.config import Config
from kapok.core import changes as ch
from kapok.storage.disk import DiskStore, begin_transfer
from kapok.storage.records import encode_end

__all__ = ["receive_transfer", "record_json", "write_diverged"]

log = logging.getLogger("kapok.replication")


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
