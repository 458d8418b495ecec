"""The write-ahead log's files: numbered segments, written, fsynced, opened and retired.

``SegmentFiles`` is the I/O half of ``kapok.storage.wal.WriteAheadLog``: the log decides
what is written when (group commit, the archive, a full disk), and this writes it. A segment
file ``wal-<first LSN>.log`` holds consecutive records as frames (``kapok.storage.records``).

Two threads of its own: the writer (``writer``) takes the writes that must not run on the
event loop (an fsync awaited by acks, a new segment, a large batch) in order; the sync
thread (``syncer``) takes the fsyncs nothing waits for (the interval policy's, a retired
segment's, the directory's), so a slow fsync never holds up a write. ``may_write_inline``
says when a write is small enough to be made on the loop itself.

A write that finds the disk full (ENOSPC, EDQUOT) is cut off the file again, so that the
segment keeps ending on a whole frame, and raises ``DiskFull`` with how many batches of
the write went out before it.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kapok.storage.records import frame_header

__all__ = [
    "INLINE_WRITE_BYTES",
    "DiskFull",
    "Encoded",
    "Segment",
    "SegmentFiles",
    "free_bytes",
    "list_segments",
    "segment_path",
]

PREFIX, SUFFIX = "wal-", ".log"
# Unless acks wait for an fsync (policy always), a write of at most this many bytes into the
# open segment is made on the event loop: copying a few KB into the page cache costs
# microseconds, less than the two thread hand-offs it saves (at a paced 2,000 msg/s the
# node's CPU fell by a quarter). Not while the sync thread has an fsync to do (interval: the
# periodic one, a retired segment's, the directory's): a write may then wait for its journal
# commit (measured: p99.9 1.4 ms, max 6 ms), which must stall the writer thread, not the
# loop; with that rule, p99.9 0.3-0.6 ms, as with policy never.
# Larger writes, and any that opens a segment, go to the writer thread.
INLINE_WRITE_BYTES = 64 * 1024
NO_SPACE: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


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


def free_bytes(directory: Path) -> int:
    """What an unprivileged writer may still write on the file system of ``directory``.
    Blocking (it may wait for a slow or network file system): call it on a worker thread."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


@dataclass(slots=True)
class Encoded:
    """One batch of records, encoded: a frame's payload, to be written at ``first_lsn``."""

    first_lsn: int
    count: int
    payload: bytes
    new_segment: bool  # start a new segment file before writing it
    replica: bool = False  # a slave's copy of its master's batch
    header: bytes = b""  # length and CRC, computed where it is written
    offered: bool = False  # handed to the slave's link already


class DiskFull(Exception):
    """A frame found no space: the first ``written`` batches of the write went out before
    it, and the file was cut back to the end of the last whole frame."""

    def __init__(self, written: int, error: OSError) -> None:
        super().__init__(str(error))
        self.written = written
        self.error = error


class SegmentFiles:
    def __init__(
        self, directory: Path, *, policy: str, segment_max_bytes: int, fsync: Callable[[int], None] = os.fsync
    ) -> None:
        self.directory = directory
        self.policy = policy
        self.segment_max_bytes = segment_max_bytes
        self._fsync = fsync
        self.fsyncs = 0
        self.bytes_written = 0
        self.file: int | None = None  # fd of the open segment
        self.file_size = 0
        self.dirty = False  # written since its last fsync
        self.background_jobs = 0  # fsyncs queued or running on the sync thread (under _lock)
        self._lock = threading.Lock()  # guards file and dirty between the two threads
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kapok-wal")
        self.syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kapok-wal-sync")

    def may_write_inline(self, batches: list[Encoded]) -> bool:
        """Whether ``batches`` may be written on the event loop (see ``INLINE_WRITE_BYTES``)."""
        if self.policy == "always" or self.background_jobs:
            return False
        if self.file is None or self.file_size >= self.segment_max_bytes:
            return False
        size = 0
        for batch in batches:
            if batch.new_segment:
                return False
            size += len(batch.payload)
        return size <= INLINE_WRITE_BYTES

    def write(self, batches: list[Encoded], sync: bool) -> None:
        """Write ``batches`` in order, each one frame, and fsync them if ``sync``: on the
        writer thread, or on the loop when ``may_write_inline`` said so."""
        for i, batch in enumerate(batches):
            if self.file is None or batch.new_segment or self.file_size >= self.segment_max_bytes:
                path = segment_path(self.directory, batch.first_lsn)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                except OSError as exc:  # no room for the file: nothing changed
                    if exc.errno not in NO_SPACE:
                        raise
                    raise DiskFull(i, exc) from None
                self._open_segment(fd)
                batch.new_segment = False  # open now: a retry after a full disk goes on in it
            assert self.file is not None
            # Header and payload in one writev: no copy of a possibly large payload.
            payload = batch.payload
            header = frame_header(payload)
            size = len(header) + len(payload)
            try:
                written = os.writev(self.file, (header, payload))
                if written < size:  # short write: the rest the plain way
                    rest = memoryview(header + payload)[written:]
                    while rest:
                        rest = rest[os.write(self.file, rest) :]
            except OSError as exc:
                if exc.errno not in NO_SPACE:
                    raise
                os.ftruncate(self.file, self.file_size)  # no torn frame stays behind
                raise DiskFull(i, exc) from None
            batch.header = header
            self.file_size += size
            self.bytes_written += size
            self.dirty = True
        if sync:
            self._sync()

    def _sync(self) -> None:
        """fsync the open segment now, on the writer thread (policy ``always``)."""
        if self.file is not None and self.dirty:
            self.dirty = False
            self._fsync(self.file)
            self.fsyncs += 1

    def in_background(self, job: Callable[..., None], *args: object) -> Future[None]:
        """Run ``job`` on the sync thread, counted in ``background_jobs`` until it is done."""
        with self._lock:
            self.background_jobs += 1

        def run() -> None:
            try:
                job(*args)
            finally:
                with self._lock:
                    self.background_jobs -= 1

        return self.syncer.submit(run)

    def background_sync(self) -> None:
        """fsync a duplicate of the open segment's fd, on the sync thread, while writes go on."""
        with self._lock:
            if self.file is None or not self.dirty:
                return
            fd = os.dup(self.file)
            self.dirty = False
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

    def _open_segment(self, fd: int) -> None:
        """Make ``fd`` (a new segment, just opened) the open segment."""
        with self._lock:
            old, dirty = self.file, self.dirty
            self.file, self.dirty = fd, False
        self.file_size = os.fstat(fd).st_size
        # The retired segment and the new directory entry must reach the disk as
        # the policy says: now (always), soon on the sync thread (interval), or when
        # the OS likes (never).
        if self.policy == "always":
            if old is not None:
                self._sync_and_close(old, dirty)
            self._sync_dir()
        elif self.policy == "interval":
            if old is not None:
                self.in_background(self._sync_and_close, old, dirty)
            self.in_background(self._sync_dir)
        elif old is not None:
            os.close(old)

    def _close_file(self) -> None:
        with self._lock:
            fd, dirty = self.file, self.dirty
            self.file, self.dirty = None, False
        if fd is not None:
            # Whatever the policy: a clean stop leaves the log durable (one fsync).
            self._sync_and_close(fd, dirty)

    async def aclose(self) -> None:
        """Close the open segment (fsynced) and join both threads, off the loop."""
        await asyncio.get_running_loop().run_in_executor(self.writer, self._close_file)
        for pool in (self.writer, self.syncer):  # joined off the loop: a last fsync may be slow
            await asyncio.to_thread(pool.shutdown, wait=True)

    async def drop_before(self, lsn: int) -> int:
        """Delete segments that hold only records before ``lsn``; returns how many."""

        def drop() -> int:
            segments = list_segments(self.directory)
            doomed = [s for s, nxt in itertools.pairwise(segments) if nxt.first_lsn <= lsn]
            for segment in doomed:
                segment.path.unlink(missing_ok=True)
            return len(doomed)

        return await asyncio.get_running_loop().run_in_executor(self.writer, drop)
