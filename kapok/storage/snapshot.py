"""Snapshot files: written whole to a temp file, fsynced, renamed into place.

A snapshot ``snapshot-<LSN>.snap`` holds the broker's state as framed
change records (``kapok.storage.records``) ending with an END frame, where
``<LSN>`` is the first WAL record not covered by it. The rename is atomic,
so a crash at any instant leaves the previous snapshot or the new one
valid, never a half-written file under a snapshot's name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kapok.core.changes import Change
from kapok.storage.records import decode_frames

__all__ = ["LoadedSnapshot", "SnapshotWriter", "list_snapshots", "load_newest"]

PREFIX, SUFFIX = "snapshot-", ".snap"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """``(lsn, path)`` of every finished snapshot file, oldest first."""
    found = []
    for path in directory.glob(f"{PREFIX}*{SUFFIX}"):
        digits = path.name[len(PREFIX) : -len(SUFFIX)]
        if digits.isdigit():
            found.append((int(digits), path))
    return sorted(found)


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    lsn: int
    path: Path | None
    records: list[Change]
    skipped: list[str]  # snapshots that were not valid, and why


def load_newest(directory: Path) -> LoadedSnapshot:
    """The newest valid snapshot (complete, every CRC right), or an empty one."""
    skipped: list[str] = []
    for lsn, path in reversed(list_snapshots(directory)):
        decoded = decode_frames(path.read_bytes())
        if decoded.problem is None and decoded.ended:
            return LoadedSnapshot(lsn, path, decoded.records, skipped)
        skipped.append(f"{path.name}: {decoded.problem or 'no end marker'}")
    return LoadedSnapshot(0, None, [], skipped)


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

    def commit(self) -> None:
        """Make the snapshot durable and visible, then delete the older ones."""
        self._fsync(self._fd)
        os.close(self._fd)
        os.replace(self.temp, self.final)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            self._fsync(dir_fd)
        finally:
            os.close(dir_fd)
        for lsn, path in list_snapshots(self.directory):
            if lsn < self.lsn:
                path.unlink(missing_ok=True)

    def abort(self) -> None:
        os.close(self._fd)
        self.temp.unlink(missing_ok=True)
