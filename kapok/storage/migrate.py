"""``kapok import-kapokmq DIR``: move a KapokMQ node's messages into Kapok's storage.

The node must not be running (the data directory lock says so if it is).
The import recovers the node's current state, adds every KapokMQ message
it does not hold yet (same MessageCode, so importing twice adds nothing),
journals them, and writes a snapshot: the next ``kapok serve`` delivers the
pending ones and shows the consumed ones in the console.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from kapok.config import Config
from kapok.core.broker import Broker
from kapok.core.changes import Published, Settled
from kapok.core.replay import apply
from kapok.storage.disk import DiskStore
from kapok.storage.kapokmq_import import kapokmq_records, read_kapokmq_dir

__all__ = ["ImportSummary", "import_kapokmq"]


@dataclass(frozen=True, slots=True)
class ImportSummary:
    found: int
    imported: int
    already_present: int
    past_retention: int  # consumed longer ago than retain_consumed_s: not imported
    wal_lines_skipped: int
    problems: tuple[str, ...]

    def __str__(self) -> str:
        text = (
            f"imported {self.imported} of {self.found} KapokMQ messages "
            f"({self.already_present} already present, {self.past_retention} consumed before the retention "
            f"window, {self.wal_lines_skipped} WAL lines skipped)"
        )
        return "\n".join([text, *(f"  note: {p}" for p in self.problems)])


async def import_kapokmq(config: Config, source: Path) -> ImportSummary:
    result = read_kapokmq_dir(source)
    broker = Broker(config.mq.settings(), zlib.crc32(config.server.node_name.encode()), journal=True)
    store = DiskStore(config.storage)
    await store.open(broker, time.time())
    try:
        broker.take_changes()  # recovery's own records are already durable
        now = time.time()
        records = kapokmq_records(result.messages, first_seq=broker.next_seq)
        # Consumed messages already past their topic's retention would be purged at
        # once (and imported again next time): leave them out and say so.
        stale = {
            r.code
            for r in records
            if isinstance(r, Settled) and r.at + config.mq.topic(r.topic).retain_consumed_s <= now
        }
        fresh = {
            r.code
            for r in records
            if isinstance(r, Published) and r.code not in broker.messages and r.code not in stale
        }
        records = [r for r in records if getattr(r, "code", None) in fresh]
        for record in records:
            apply(broker, record)
        durable = store.append(records) if records else None
        if durable is not None:
            await durable
    finally:
        await store.aclose()  # the final snapshot holds the imported messages
    return ImportSummary(
        found=len(result.messages),
        imported=len(fresh),
        already_present=len(result.messages) - len(fresh) - len(stale),
        past_retention=len(stale),
        wal_lines_skipped=result.wal_skipped,
        problems=tuple(result.problems),
    )
