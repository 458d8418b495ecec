"""Snapshot files: written whole to a temp file, fsynced, renamed into place.

A snapshot ``snapshot-<LSN>.snap`` holds the broker's state as framed
change records (``kapok.storage.records``) ending with an END frame, where
``<LSN>`` is the first WAL record not covered by it. The rename is atomic,
so a crash at any instant leaves the previous snapshot or the new one
valid, never a half-written file under a snapshot's name.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kapok.storage.records import FrameReader

__all__ = ["FoundSnapshot", "SnapshotWriter", "find_newest", "list_snapshots", "map_file"]

PREFIX, SUFFIX = "snapshot-", ".snap"
KEEP = 2  # snapshots kept: the newest and the one before it


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """``(lsn, path)`` of every finished snapshot file, oldest first."""
    found = []
    for path in directory.glob(f"{PREFIX}*{SUFFIX}"):
        digits = path.name[len(PREFIX) : -len(SUFFIX)]
        if digits.isdigit():
            found.append((int(digits), path))
    return sorted(found)


def map_file(path: Path) -> mmap.mmap | bytes:
    """The file's bytes without reading them into memory (pages stay reclaimable)."""
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


@dataclass(frozen=True, slots=True)
class FoundSnapshot:
    lsn: int  # 0 when there is no snapshot
    data: mmap.mmap | bytes  # its frames, already checked (lengths, CRCs, END marker)
    skipped: list[str]  # snapshots that were not valid, and why

    def reader(self) -> FrameReader:
        return FrameReader(self.data)


def find_newest(directory: Path) -> FoundSnapshot:
    """The newest valid snapshot (complete, every CRC right), or an empty one."""
    skipped: list[str] = []
    for lsn, path in reversed(list_snapshots(directory)):
        data = map_file(path)
        check = FrameReader(data).check()
        if check.problem is None and check.ended:
            for leftover in directory.glob(f"{PREFIX}*{SUFFIX}.tmp"):
                leftover.unlink(missing_ok=True)  # a snapshot that a crash interrupted
            return FoundSnapshot(lsn, data, skipped)
        skipped.append(f"{path.name}: {check.problem or 'no end marker'}")
        # Out of the way, so it never counts as one of the snapshots kept.
        path.rename(path.with_suffix(".damaged"))
    for leftover in directory.glob(f"{PREFIX}*{SUFFIX}.tmp"):
        leftover.unlink(missing_ok=True)  # a snapshot that a crash interrupted
    return FoundSnapshot(0, b"", skipped)


class SnapshotWriter:
    """Writes one snapshot from chunks of frames; blocking calls, run on a worker thread."""

    def __init__(self, directory: Path, lsn: int, fsync: Callable[[int], None] = os.fsync) -> None:
        self.directory = directory
        self.lsn = lsn
        self.final = directory / f"{PREFIX}{lsn:020d}{SUFFIX}"
        self.temp = directory / f"{PREFIX}{lsn:020d}{SUFFIX}.tmp"
        self._fsync = fsync
        self._fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size = 0

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._fd, view) :]
        self.size += len(chunk)

    def commit(self) -> int:
        """Make the snapshot durable and visible, delete the older ones; returns the oldest kept LSN."""
        self._fsync(self._fd)
        os.close(self._fd)
        os.replace(self.temp, self.final)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            self._fsync(dir_fd)
        finally:
            os.close(dir_fd)
        # Keep the previous snapshot too (and the WAL since it, see DiskStore.snapshot):
        # should the new file ever prove unreadable, recovery falls back to the old one.
        snapshots = list_snapshots(self.directory)
        for _, path in snapshots[:-KEEP]:
            path.unlink(missing_ok=True)
        return snapshots[-KEEP:][0][0]

    def abort(self) -> None:
        os.close(self._fd)
        self.temp.unlink(missing_ok=True)
