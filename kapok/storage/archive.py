"""The analytics archive: every message's lifecycle as rotating JSON-lines files.

The archive is the input of the analytics job, not a durability mechanism: the
WAL and snapshots own recovery. So it is written for cheap, forgiving reads:

* ``kapok.storage.events`` (pure) turns change records into flat lifecycle
  events, one JSON object each: ``{"ev", "code", "topic", "group", "t", ...}``.
* ``Archive`` (I/O) appends them, one ``\\n``-terminated line per event, to
  ``archive-<UTC yyyymmddTHHMMSS>-<n>.jsonl`` files under its directory.
  ``<n>`` grows across files and restarts, so it gives the creation order even
  when the clock steps back. A file is closed once it would grow past
  ``rotate_bytes`` or is ``rotate_s`` old; after each close the oldest closed
  files are deleted while the directory holds more than ``max_bytes`` or
  while they are older than ``max_age_s`` (age counted from the time in the
  name, when the file was started).

Files are only ever appended, and a process always starts a new file, so a
crash (or a failed write, after which the file is abandoned) can damage at
most the *last line of a file*, which then lacks its ``\\n``. Readers must
skip an unterminated last line (``read_archive_file`` does; Spark's JSON
reader with ``mode=DROPMALFORMED`` does too). Nothing is fsynced: the events
still buffered (up to ``buffer_bytes``) or in the OS cache die with the
process or the machine, which is the accepted price of an analytics feed.

``Archive`` is synchronous (and takes a lock, so threads may share one): the
node never calls it; its archiver process does (``kapok.storage.archiver``).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson

from kapok.errors import StorageError
from kapok.storage.events import Event, encode_events

__all__ = [
    "Archive",
    "ArchiveFile",
    "list_archive_files",
    "read_archive_file",
]

log = logging.getLogger("kapok.storage")

MIB: Final = 1024 * 1024
RUN_BYTES: Final = 8  # a run id's random bytes: 64 bits, never shared by two runs in practice
_STAMP: Final = "%Y%m%dT%H%M%S"
_NAME_RE: Final = re.compile(r"archive-(\d{8}T\d{6})-(\d+)\.jsonl")


# ---------------------------------------------------------------------------------------
# Reading (tools, tests)


@dataclass(frozen=True, slots=True)
class ArchiveFile:
    path: Path
    started: float  # unix seconds, from the name (second precision)
    n: int  # creation order
    size: int


def list_archive_files(directory: Path) -> list[ArchiveFile]:
    """The archive files in ``directory``, oldest first; other files are ignored."""
    found: list[ArchiveFile] = []
    with os.scandir(directory) as it:
        for entry in it:
            m = _NAME_RE.fullmatch(entry.name)
            if m is None or not entry.is_file():
                continue
            started = datetime.strptime(m[1], _STAMP).replace(tzinfo=UTC).timestamp()
            found.append(ArchiveFile(Path(entry.path), started, int(m[2]), entry.stat().st_size))
    found.sort(key=lambda f: f.n)
    return found


def read_archive_file(path: Path) -> list[Event]:
    """Every event of one archive file, skipping an unterminated (crash-cut) last line.

    A bad line anywhere else is real corruption, not a torn append, and
    raises ``StorageError``.
    """
    data = path.read_bytes()
    lines = data.split(b"\n")
    lines.pop()  # b"" after the final newline, or the partial line a crash left
    events: list[Event] = []
    for number, line in enumerate(lines, 1):
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise StorageError(f"{path.name} line {number}: not a JSON event ({exc})") from exc
        if not isinstance(event, dict):
            raise StorageError(f"{path.name} line {number}: not a JSON object")
        events.append(event)
    return events


# ---------------------------------------------------------------------------------------
# Writing


class Archive:
    """Appends lifecycle events to rotating JSON-lines files, with size and age retention."""

    def __init__(
        self,
        directory: Path,
        *,
        rotate_bytes: int = 64 * MIB,
        rotate_s: float = 3600.0,
        max_bytes: int = 1024 * MIB,
        max_age_s: float = 7 * 86400.0,
        buffer_bytes: int = 256 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if min(rotate_bytes, max_bytes, buffer_bytes) <= 0 or min(rotate_s, max_age_s) <= 0:
            raise ValueError("archive sizes and periods must be positive")
        self.directory = Path(directory)
        self._rotate_bytes = rotate_bytes
        self._rotate_s = rotate_s
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._buffer_bytes = buffer_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._buf = bytearray()
        self._fd: int | None = None
        self._path: Path | None = None
        self._started = 0.0  # clock time the current file was opened
        self._size = 0  # bytes of the current file, written and buffered
        self._next_n: int | None = None  # found by scanning the directory on first open
        self._closed = False
        # Names this Archive's events, with their LSNs: a new one per process (an LSN may be
        # written again by a node that leads anew after its log diverged: docs/analytics.md).
        self.run = os.urandom(RUN_BYTES).hex()
        self.events_written = 0  # accepted into the buffer (for metrics)
        self.events_lost = 0  # of those, and of batches cut short, dropped by failed writes

    @property
    def current_path(self) -> Path | None:
        """The file being appended to, if one is open."""
        return self._path

    def write(self, rows: Sequence[list[Any]], first_lsn: int | None = None) -> None:
        """Archive the events of the records in ``rows``; raises ``StorageError`` if the disk refuses.

        ``first_lsn``: the WAL LSN of ``rows[0]`` (the rows are consecutive records), if
        known; the events then carry this archive's ``run`` and their record's ``lsn``.

        After a failure the buffered events are lost (counted in
        ``events_lost``) and the next call starts a new file, so the damage
        stays a cut last line.
        """
        chunk, count = encode_events(rows, self.run, first_lsn)
        if not count:
            return
        with self._lock:
            self._check_open()
            now = self._clock()
            accepted = 0
            try:
                if self._fd is not None and now - self._started >= self._rotate_s:
                    self._rotate(now)
                if self._fd is not None and self._size + len(chunk) <= self._rotate_bytes:
                    # The usual case: every line fits the open file, so take them at once.
                    self._buf += chunk
                    self._size += len(chunk)
                    accepted = count
                    if len(self._buf) >= self._buffer_bytes:
                        self._flush()
                    return
                for line in chunk[:-1].split(b"\n"):
                    line += b"\n"
                    if self._fd is not None and self._size and self._size + len(line) > self._rotate_bytes:
                        self._rotate(now)
                    if self._fd is None:
                        self._open(now)
                    self._buf += line
                    self._size += len(line)
                    accepted += 1
                    if len(self._buf) >= self._buffer_bytes:
                        self._flush()
            except StorageError:
                self.events_lost += count - accepted  # _flush counted the buffered ones
                raise
            finally:
                self.events_written += accepted

    def flush(self) -> None:
        """Hand buffered events to the OS (no fsync), so readers and a crash see them."""
        with self._lock:
            self._flush()

    def maintain(self) -> None:
        """Close the current file if it is due and apply retention.

        ``write`` only rotates when events arrive; a driver calls this now and
        then so that an idle archive still closes its file (making it
        readable as complete) and ages out old files.
        """
        with self._lock:
            self._check_open()
            now = self._clock()
            if self._fd is not None and now - self._started >= self._rotate_s:
                self._rotate(now)
            else:
                self._flush()
                self._apply_retention(now)

    def close(self) -> None:
        """Flush and close the current file; later writes raise ``StorageError``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._flush()
            finally:
                self._close_file()

    # -- internals (called with the lock held) ---------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the archive is closed")

    def _open(self, now: float) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if self._next_n is None:
                # A new process always starts a new file: the last one of a
                # previous run may end in a cut line, which must stay last.
                files = list_archive_files(self.directory)
                self._next_n = max((f.n for f in files), default=-1) + 1
                self._apply_retention(now)
            stamp = datetime.fromtimestamp(now, UTC).strftime(_STAMP)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
            while True:  # O_EXCL: never append to a file someone else made
                path = self.directory / f"archive-{stamp}-{self._next_n}.jsonl"
                self._next_n += 1
                try:
                    self._fd = os.open(path, flags, 0o644)
                    break
                except FileExistsError:
                    continue
        except OSError as exc:
            raise StorageError(f"archive: cannot create a file in {self.directory}: {_why(exc)}") from exc
        self._path = path
        self._started = now
        self._size = 0

    def _flush(self) -> None:
        if not self._buf or self._fd is None:
            return
        data = bytes(self._buf)
        self._buf.clear()
        written = 0
        try:
            view = memoryview(data)
            while written < len(data):  # os.write may take less than asked
                written += os.write(self._fd, view[written:])
        except OSError as exc:
            lost = data.count(b"\n", written)
            self.events_lost += lost
            path = self._path
            self._close_file()  # abandon the file: a cut line may only ever be last
            raise StorageError(f"archive: writing {path} failed: {_why(exc)}; {lost} events lost") from exc

    def _rotate(self, now: float) -> None:
        try:
            self._flush()
        finally:
            self._close_file()
        self._apply_retention(now)

    def _close_file(self) -> None:
        fd, self._fd, self._path = self._fd, None, None
        self._size = 0
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:  # the data was written; nothing left to save
                log.warning("archive: closing a file failed: %s", _why(exc))

    def _apply_retention(self, now: float) -> None:
        # Best effort: a file that cannot be deleted costs disk, not events,
        # so it is logged instead of failing the write that triggered it.
        try:
            files = list_archive_files(self.directory)
        except FileNotFoundError:  # made with the first file: nothing written yet
            return
        except OSError as exc:
            log.warning("archive: cannot list %s: %s", self.directory, _why(exc))
            return
        total = sum(f.size for f in files)
        for f in files:
            if f.path == self._path:
                break  # the open file is the newest; never delete it
            if total <= self._max_bytes and now - f.started <= self._max_age_s:
                break
            try:
                f.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("archive: cannot delete %s: %s", f.path.name, _why(exc))
                continue
            total -= f.size


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)
