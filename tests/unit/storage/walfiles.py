"""Helpers of the WAL tests: records to log, and what a log directory holds."""

from __future__ import annotations

from pathlib import Path

from kapok.core.changes import Change, GroupCreated
from kapok.storage.records import FrameReader
from kapok.storage.wal import list_segments


def make_records(n: int, start: int = 0) -> list[Change]:
    return [GroupCreated("t", f"g{i}", float(i)) for i in range(start, start + n)]


def read_log(directory: Path) -> list[Change]:
    """Every record of the log; each segment must end on a whole frame."""
    found: list[Change] = []
    for segment in list_segments(directory):
        reader = FrameReader(segment.path.read_bytes())
        found.extend(reader)
        assert reader.problem is None, (segment.path.name, reader.problem)
    return found
