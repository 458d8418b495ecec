"""Helpers of the WAL tests: records to log, what a log directory holds, a disk that fills up."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from kapok.core.changes import Change, GroupCreated
from kapok.storage.records import FrameReader
from kapok.storage.segments import list_segments
from kapok.storage.wal import WriteAheadLog


def make_records(n: int, start: int = 0) -> list[Change]:
    return [GroupCreated("t", f"g{i}", float(i)) for i in range(start, start + n)]


def small_wal(directory: Path, policy: str, segment_max_bytes: int = 1 << 22) -> WriteAheadLog:
    """A log of the storage tests: 10 ms fsync interval, 4 MiB segments unless told."""
    return WriteAheadLog(directory, policy=policy, interval_ms=10, segment_max_bytes=segment_max_bytes)


def read_log(directory: Path) -> list[Change]:
    """Every record of the log; each segment must end on a whole frame."""
    found: list[Change] = []
    for segment in list_segments(directory):
        reader = FrameReader(segment.path.read_bytes())
        found.extend(reader)
        assert reader.problem is None, (segment.path.name, reader.problem)
    return found


class FillingDisk:
    """A disk that can fill up: while ``full``, a writev writes half of what it is given
    (a short write), the next write raises ENOSPC, and so does creating a file."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.refused = 0
        self._writev, self._write, self._open = os.writev, os.write, os.open
        monkeypatch.setattr("kapok.storage.segments.os.writev", self.writev)
        monkeypatch.setattr("kapok.storage.segments.os.write", self.write)
        monkeypatch.setattr("kapok.storage.segments.os.open", self.open)

    def _no_space(self) -> OSError:
        self.refused += 1
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def writev(self, fd: int, buffers: list[bytes]) -> int:
        if not self.full:
            return self._writev(fd, buffers)
        data = b"".join(buffers)
        return self._write(fd, data[: len(data) // 2])

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.full:
            raise self._no_space()
        return self._write(fd, data)

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        if self.full and flags & os.O_CREAT:
            raise self._no_space()
        return self._open(path, flags, mode)
