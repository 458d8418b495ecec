"""The write-ahead log: numbered segment files of framed change records.

Theory of operation. ``append`` encodes records on the event loop into an
in-memory batch and returns a future; one flusher task hands every batch
that accumulated meanwhile to a single writer thread, which writes them and
(with ``fsync: always``) fsyncs once for all of them: group commit, one
fsync per loop turn's worth of records or more, never one per message. The
futures complete only after that, so a producer's ack always follows the
write that makes its message durable. Policies:

* ``always``: acks wait for write + fsync (survives power loss);
* ``interval``: acks wait for the write (survives a process crash); a timer
  fsyncs every ``fsync_interval_ms``;
* ``never``: acks wait for the write; the OS decides when data reaches disk.

Each record has a log sequence number (LSN): its position in the log. A
segment file ``wal-<first LSN>.log`` holds consecutive records; a new one
starts when a segment reaches ``segment_max_bytes`` or when a snapshot asks
for a clean cut (``cut()``), so that whole segments can be deleted once a
snapshot covers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kapok.core.changes import Change
from kapok.errors import StorageError
from kapok.storage.records import encode_batch

__all__ = ["Segment", "WriteAheadLog", "list_segments"]

log = logging.getLogger("kapok.storage")

PREFIX, SUFFIX = "wal-", ".log"


@dataclass(frozen=True, slots=True)
class Segment:
    first_lsn: int
    path: Path


def list_segments(directory: Path) -> list[Segment]:
    found = []
    for path in directory.glob(f"{PREFIX}*{SUFFIX}"):
        digits = path.name[len(PREFIX) : -len(SUFFIX)]
        if digits.isdigit():
            found.append(Segment(int(digits), path))
    return sorted(found, key=lambda s: s.first_lsn)


def segment_path(directory: Path, first_lsn: int) -> Path:
    return directory / f"{PREFIX}{first_lsn:020d}{SUFFIX}"


@dataclass(slots=True)
class _Batch:
    first_lsn: int
    data: bytearray
    new_segment: bool  # start a new segment file before writing this batch


class WriteAheadLog:
    def __init__(
        self,
        directory: Path,
        *,
        policy: str,
        interval_ms: int,
        segment_max_bytes: int,
        fsync: Callable[[int], None] = os.fsync,
        on_written: Callable[[Sequence[Change]], None] | None = None,  # runs on the writer thread
    ) -> None:
        self.directory = directory
        self.policy = policy
        self.interval_s = interval_ms / 1000
        self.segment_max_bytes = segment_max_bytes
        self._fsync = fsync
        self.next_lsn = 0
        self.records_written = 0
        self.fsyncs = 0
        self.bytes_written = 0
        self._batches: list[_Batch] = []
        self._changes: list[Change] = []  # for ``on_written`` (the archive), in order
        self._on_written = on_written
        self._waiters: list[asyncio.Future[None]] = []
        self._wakeup = asyncio.Event()
        self._cut_next = True
        self._file: int | None = None  # fd of the open segment
        self._file_size = 0
        self._dirty = False
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kapok-wal")
        # Background fsyncs (interval policy, retired segments) run on their own thread,
        # so a slow fsync never holds up writes and the acks waiting for them.
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kapok-wal-sync")
        self._file_lock = threading.Lock()  # guards _file and _dirty between the two threads
        self._tasks: list[asyncio.Task[None]] = []
        self.failed: StorageError | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self, next_lsn: int) -> None:
        """Begin appending at ``next_lsn`` (in a new segment file)."""
        self.next_lsn = next_lsn
        self._cut_next = True
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._flusher()))
        if self.policy == "interval":
            self._tasks.append(loop.create_task(self._interval_syncer()))

    async def aclose(self) -> None:
        await self.flush()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close_file)
        self._thread.shutdown(wait=True)
        self._syncer.shutdown(wait=True)

    # ------------------------------------------------------------ appending

    def append(self, changes: Sequence[Change]) -> asyncio.Future[None]:
        """Queue records; the future completes once they are durable under the policy."""
        if self.failed is not None:
            raise self.failed
        if not self._batches or self._cut_next:
            self._batches.append(_Batch(self.next_lsn, bytearray(), self._cut_next))
            self._cut_next = False
        self._batches[-1].data += encode_batch(changes)
        self.next_lsn += len(changes)
        self.records_written += len(changes)
        if self._on_written is not None:
            self._changes.extend(changes)
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self._wakeup.set()
        return future

    def cut(self) -> int:
        """Make the next record start a new segment; returns that record's LSN."""
        self._cut_next = True
        return self.next_lsn

    async def flush(self) -> None:
        """Wait until everything appended so far is durable."""
        if self._waiters:
            await asyncio.gather(*self._waiters, return_exceptions=True)

    async def _flusher(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._batches:
                batches, self._batches = self._batches, []
                waiters, self._waiters = self._waiters, []
                changes, self._changes = self._changes, []
                try:
                    sync = self.policy == "always"
                    await loop.run_in_executor(self._thread, self._write, batches, sync, changes)
                except OSError as exc:
                    self.failed = StorageError(f"the write-ahead log failed: {exc}")
                    log.error("%s; the node no longer accepts writes", self.failed.message)
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(self.failed)
                    return
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    async def _interval_syncer(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval_s)
            if self._dirty:
                await loop.run_in_executor(self._syncer, self._background_sync)

    # ------------------------------------------------------------ writer thread

    def _write(self, batches: list[_Batch], sync: bool, changes: Sequence[Change]) -> None:
        for batch in batches:
            if self._file is None or batch.new_segment or self._file_size >= self.segment_max_bytes:
                self._open_segment(batch.first_lsn)
            assert self._file is not None
            view = memoryview(batch.data)
            while view:
                written = os.write(self._file, view)
                view = view[written:]
            self._file_size += len(batch.data)
            self.bytes_written += len(batch.data)
            self._dirty = True
        if sync:
            self._sync()
        if self._on_written is not None and changes:
            try:
                self._on_written(changes)  # the archive: on this thread, off the event loop
            except Exception:  # the archive is not worth failing the log for
                log.exception("writing the archive failed")

    def _sync(self) -> None:
        """fsync the open segment now, on the writer thread (policy ``always``)."""
        if self._file is not None and self._dirty:
            self._dirty = False
            self._fsync(self._file)
            self.fsyncs += 1

    def _background_sync(self) -> None:
        """fsync a duplicate of the open segment's fd, on the sync thread, while writes go on."""
        with self._file_lock:
            if self._file is None or not self._dirty:
                return
            fd = os.dup(self._file)
            self._dirty = False
        try:
            self._fsync(fd)
            self.fsyncs += 1
        finally:
            os.close(fd)

    def _sync_and_close(self, fd: int, dirty: bool) -> None:
        try:
            if dirty:
                self._fsync(fd)
                self.fsyncs += 1
        finally:
            os.close(fd)

    def _sync_dir(self) -> None:
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            self._fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _open_segment(self, first_lsn: int) -> None:
        fd = os.open(segment_path(self.directory, first_lsn), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        with self._file_lock:
            old, dirty = self._file, self._dirty
            self._file, self._dirty = fd, False
        self._file_size = os.fstat(fd).st_size
        # The retired segment and the new directory entry must reach the disk as
        # the policy says: now (always), soon on the sync thread (interval), or when
        # the OS likes (never).
        if self.policy == "always":
            if old is not None:
                self._sync_and_close(old, dirty)
            self._sync_dir()
        elif self.policy == "interval":
            if old is not None:
                self._syncer.submit(self._sync_and_close, old, dirty)
            self._syncer.submit(self._sync_dir)
        elif old is not None:
            os.close(old)

    def _close_file(self) -> None:
        with self._file_lock:
            fd, dirty = self._file, self._dirty
            self._file, self._dirty = None, False
        if fd is not None:
            self._sync_and_close(fd, dirty and self.policy != "never")

    # ------------------------------------------------------------ maintenance

    async def drop_before(self, lsn: int) -> int:
        """Delete segments that hold only records before ``lsn``; returns how many."""

        def drop() -> int:
            segments = list_segments(self.directory)
            doomed = [s for s, nxt in itertools.pairwise(segments) if nxt.first_lsn <= lsn]
            for segment in doomed:
                segment.path.unlink(missing_ok=True)
            return len(doomed)

        return await asyncio.get_running_loop().run_in_executor(self._thread, drop)
