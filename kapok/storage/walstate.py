"""The write-ahead log's state and its two feeds: ``WalState``, the base of ``WriteAheadLog``.

``WalState`` holds what the log (``kapok.storage.wal``) works on: the batches queued and the
futures that wait for them, the segment files, the counters, the state of a wait for space.
It also feeds the two readers of what the log writes: a slave's link gets each batch as soon
as it is encoded, before it is written (``ReplicaSink``); the archive gets the frames once
they are written, gathered in log order and handed over every ``ARCHIVE_DELAY_S`` or once
``ARCHIVE_BATCH_BYTES`` wait (``ArchiveSink``). When and how the log writes, a full disk
included, is ``WriteAheadLog``'s.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kapok.core.changes import Change
from kapok.errors import StorageError
from kapok.storage.segments import Encoded, SegmentFiles

__all__ = ["ARCHIVE_BATCH_BYTES", "ARCHIVE_DELAY_S", "ArchiveSink", "Batch", "ReplicaSink", "WalState"]

# Written frames are handed to the archive in batches, at most this often or once this
# many bytes have gathered: one wake-up of the archiver per batch, not one per WAL write.
ARCHIVE_DELAY_S = 0.025
ARCHIVE_BATCH_BYTES = 1024 * 1024


class ReplicaSink(Protocol):
    """Where a master's encoded batches go as soon as they are encoded (the replication
    backlog): the same payloads the WAL writes, so a slave writes and applies exactly
    what the master logged, under the same LSNs."""

    def offer(self, first_lsn: int, count: int, payload: bytes) -> None:
        """Take one batch of ``count`` records; never blocks."""
        ...


class ArchiveSink(Protocol):
    """Where written frames go (``kapok.storage.archiver.ArchiveFeed``)."""

    def feed(self, parts: list[bytes], count: int, first_lsn: int) -> None:
        """Take ``count`` frames exactly as written, in pieces (no copy is made to join
        them: a burst's batch can be tens of MB), their records consecutive from LSN
        ``first_lsn``; never blocks."""
        ...

    async def drain(self) -> None:
        """Wait while the sink is far behind."""
        ...

    def behind(self) -> bool:
        """Whether ``drain`` would wait now."""
        ...


@dataclass(slots=True)
class Batch:
    first_lsn: int
    changes: list[Change]
    new_segment: bool  # start a new segment file before writing this batch
    payload: bytes | None = None  # already encoded (a slave's copy of its master's batch)
    count: int = 0  # records in ``payload``
    replica: bool = False  # a slave's copy of its master's batch
    offered: bool = False  # handed to the slave's link already (a write the flusher takes over)


class WalState:
    """The log's state, its counters and its feeds; ``WriteAheadLog`` adds the writing."""

    def __init__(
        self,
        directory: Path,
        *,
        policy: str,
        interval_ms: int,
        segment_max_bytes: int,
        fsync: Callable[[int], None] = os.fsync,
        archive: ArchiveSink | None = None,  # gets the written frames, in order, in batches
    ) -> None:
        self.directory = directory
        self.policy = policy
        self.interval_s = interval_ms / 1000
        self.files = SegmentFiles(directory, policy=policy, segment_max_bytes=segment_max_bytes, fsync=fsync)
        self.next_lsn = 0
        self.records_written = 0
        self._batches: list[Batch] = []
        self._archive = archive
        self.replica: ReplicaSink | None = None  # set while this node is a master with a slave
        # Every append until the flusher takes the batches shares ``_pending``;
        # ``_inflight`` is the one of the batches being written.
        self._pending: asyncio.Future[None] | None = None
        self._inflight: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup = asyncio.Event()
        self._wake_due = False  # a call to _wake is scheduled
        self._cut_next = True
        self._archive_queue: list[bytes] = []  # frames written, not yet handed to the archive
        self._archive_bytes = 0
        self._archive_lsn = self._archive_next_lsn = 0  # of the queue's first record, and past its last
        self._archive_timer: asyncio.TimerHandle | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.failed: StorageError | None = None
        self.disk_full = 0  # times a write found the disk full (and waited for space)
        self.full_since: float | None = None  # loop time the current wait began
        # Set while the store has reported its disk full already (``kapok.storage.space``):
        # a write that then finds no space at all says so as a WARNING, not a second ERROR.
        self.full_reported = False
        self.full_free: int | None = None  # bytes free when the current wait began (None: unknown)
        self._full_tries = 0
        self._full_lsn = 0  # the first record that waits for space
        self._space = asyncio.Event()  # set unless a write waits for space
        self._space.set()
        self._closing = asyncio.Event()

    @property
    def fsyncs(self) -> int:
        return self.files.fsyncs

    @property
    def bytes_written(self) -> int:
        return self.files.bytes_written

    # ------------------------------------------------------------ feeds

    def attach_archive(self, archive: ArchiveSink) -> None:
        """Hand the frames written from now on to ``archive`` too."""
        self._archive = archive

    def _offer(self, encoded: list[Encoded]) -> None:
        """Hand the batches to the slave's link before they are written: its copy overlaps the write."""
        if self.replica is not None:
            for e in encoded:
                if not e.offered:
                    self.replica.offer(e.first_lsn, e.count, e.payload)

    async def _hand_to_archive(self, written: list[Encoded]) -> None:
        # After the acks, not before them: the archive is an analytics feed, so it must
        # delay neither confirmations nor the next write. Frames gather here (in log
        # order) and go out every ARCHIVE_DELAY_S or once ARCHIVE_BATCH_BYTES wait; the
        # flusher waits only while the archiver is far behind (backpressure, bounded
        # memory). Queued first, so a cancelled wait loses nothing.
        self._queue_for_archive(written)
        assert self._archive is not None
        await self._archive.drain()

    def _queue_for_archive(self, written: list[Encoded]) -> None:
        for batch in written:
            if self._archive_queue and batch.first_lsn != self._archive_next_lsn:
                self._submit_archive()  # a feed's records are consecutive (their LSNs follow)
            queue = self._archive_queue
            if not queue:
                self._archive_lsn = batch.first_lsn
            self._archive_next_lsn = batch.first_lsn + batch.count
            queue += (batch.header, batch.payload)
            self._archive_bytes += len(batch.header) + len(batch.payload)
        if self._archive_bytes >= ARCHIVE_BATCH_BYTES:
            self._submit_archive()
        elif self._archive_queue and self._archive_timer is None:
            assert self._loop is not None
            self._archive_timer = self._loop.call_later(ARCHIVE_DELAY_S, self._submit_archive)

    def _submit_archive(self) -> None:
        """Hand every queued frame to the archive now (on the event loop)."""
        if self._archive_timer is not None:
            self._archive_timer.cancel()
            self._archive_timer = None
        if self._archive_queue and self._archive is not None:
            frames, self._archive_queue, self._archive_bytes = self._archive_queue, [], 0
            self._archive.feed(frames, len(frames) // 2, self._archive_lsn)
