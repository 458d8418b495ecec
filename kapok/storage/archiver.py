"""The archiver: a process of its own that turns the WAL's frames into the archive.

Building the archive's JSON lines costs about as much CPU as the rest of storing a
message, and in the node's process every microsecond of it is taken from the event
loop (the GIL). So the node hands the archive the bytes it already has: the WAL
frames it just wrote (``kapok.storage.records``), copied down a pipe to a child
process, which decodes them and appends the events with ``Archive``. The node pays
one pipe write per batch of frames; the records the archive reads are exactly the
ones the WAL holds, in log order. Each batch is headed by a small frame of its own
(``position_frame``) with the LSN of its first record, so every event carries its
record's LSN (``kapok.storage.events``: what makes an event unique).

* ``ArchiveFeed`` is the node's end (asyncio). ``feed`` never blocks; ``drain``
  waits while the child is more than ``HIGH_WATER`` bytes behind (the WAL's
  flusher awaits it: bounded memory, and analytics never delay an ack because
  the flusher calls it after the acks). If the child dies, the frames fed until
  it is restarted are lost to the archive (counted, one log line), never to the
  broker; it is restarted, at most once per ``RESTART_S``. ``aclose`` ends the
  pipe and waits for the child to write everything out. The child's log records
  come back as JSON lines on its standard error and are logged by the node
  (``kapok.logs.relog``): one log, one format, one rotation for both processes.
* ``main`` is the child (``python -m kapok.storage.archiver SETTINGS``). It reads
  until end of file, so it also finishes cleanly when the node is killed: the
  kernel closes the pipe. It ignores SIGINT and SIGTERM (a terminal's Ctrl-C
  reaches the whole process group) and closes a file that is due (rotation,
  retention) every ``MAINTAIN_S`` even when nothing arrives.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import select
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from kapok.errors import StorageError
from kapok.logs import relog, setup_child
from kapok.storage.archive import MIB, Archive
from kapok.storage.records import HEADER, FrameReader, frame

if TYPE_CHECKING:  # the child never imports asyncio (7 MB of its RSS); ArchiveFeed's methods do
    import asyncio

__all__ = ["ArchiveFeed", "ArchiveSettings", "main", "position_frame", "positioned"]

log = logging.getLogger("kapok.storage")

HIGH_WATER = 8 * MIB  # bytes the child may lag behind before ``drain`` waits
RESTART_S = 5.0
CLOSE_TIMEOUT_S = 60.0
MAINTAIN_S = 10.0
READ_BYTES = 128 * 1024  # a read's frames are decoded at once: 1 MiB reads held ~7 MB more at peak
# The pipe carries the WAL's frames as written, each feed headed by a frame of this kind
# (a kind the WAL never writes) holding the LSN of the feed's first record, little-endian.
POSITION_TYPE = 254
_LSN = struct.Struct("<Q")
# The archiver runs at a lower priority than the node: on a busy machine the node and its
# clients come first, and the archiver catches up in the gaps (HIGH_WATER bounds the lag).
NICE = 10


@dataclass(frozen=True, slots=True)
class ArchiveSettings:
    directory: str
    rotate_bytes: int
    max_bytes: int
    max_age_s: float
    log_level: str = "INFO"


class ArchiveFeed:
    def __init__(self, settings: ArchiveSettings) -> None:
        self.settings = settings
        self._proc: asyncio.subprocess.Process | None = None
        self._pipe: asyncio.StreamWriter | None = None  # the child's stdin
        self._restarting: asyncio.Task[None] | None = None
        self._log_reader: asyncio.Task[None] | None = None  # relays the child's log lines
        self._started_at = -RESTART_S
        self.bytes_fed = 0
        self.frames_lost = 0  # frames fed while no child was there to take them
        self.restarts = 0

    async def start(self) -> None:
        import asyncio

        self._started_at = time.monotonic()
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kapok.storage.archiver", orjson.dumps(asdict(self.settings)).decode(),
            stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._pipe = self._proc.stdin
        assert self._pipe is not None and self._proc.stderr is not None
        self._pipe.transport.set_write_buffer_limits(high=HIGH_WATER)
        self._log_reader = asyncio.get_running_loop().create_task(_relay_log(self._proc.stderr))

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def started(self) -> bool:
        return self._proc is not None

    @property
    def alive(self) -> bool:
        proc, pipe = self._proc, self._pipe
        return proc is not None and proc.returncode is None and pipe is not None and not pipe.is_closing()

    def feed(self, parts: list[bytes], count: int, first_lsn: int | None = None) -> None:
        """Queue ``count`` WAL frames (their exact bytes, in pieces) for the archive;
        ``first_lsn`` is the LSN of their first record (their records are consecutive)."""
        if not self.alive:
            self._lost(count)
            return
        assert self._pipe is not None
        if first_lsn is not None:
            self._pipe.write(position_frame(first_lsn))
        self._pipe.writelines(parts)
        self.bytes_fed += sum(map(len, parts))

    def _lost(self, count: int) -> None:
        self.frames_lost += count
        if self._restarting is None:  # a new outage: say so once, and bring the child back
            log.error("the archiver process is gone; archive events are lost until it is restarted")
            import asyncio

            self._restarting = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        import asyncio

        try:
            await asyncio.sleep(max(self._started_at + RESTART_S - time.monotonic(), 0.0))
            await self.start()
        except OSError as exc:
            log.error("cannot restart the archiver: %s", exc)
        else:
            self.restarts += 1
            log.warning("archiver restarted; %d WAL frames were not archived so far", self.frames_lost)
        finally:
            self._restarting = None

    def behind(self) -> bool:
        """Whether ``drain`` would wait now: the child is more than ``HIGH_WATER`` behind."""
        pipe = self._pipe
        return self.alive and pipe is not None and pipe.transport.get_write_buffer_size() > HIGH_WATER

    async def drain(self) -> None:
        """Wait while the child is far behind (returns at once when it is not, or is gone)."""
        if self.alive:
            assert self._pipe is not None
            with contextlib.suppress(ConnectionError):
                await self._pipe.drain()

    async def aclose(self) -> None:
        import asyncio

        from kapok.tasks import cancel_and_wait

        if self._restarting is not None:
            await cancel_and_wait(self._restarting)
        proc, pipe, self._proc, self._pipe = self._proc, self._pipe, None, None
        if proc is None:
            return
        if pipe is not None:
            pipe.close()
            with contextlib.suppress(ConnectionError):
                await pipe.wait_closed()
        try:
            await asyncio.wait_for(proc.wait(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.error("the archiver did not finish within %.0f s; killed", CLOSE_TIMEOUT_S)
            proc.kill()
            await proc.wait()
        if self._log_reader is not None:  # it ends with the child's standard error
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._log_reader, CLOSE_TIMEOUT_S)
            self._log_reader = None
        log.info("archiver finished (exit code %s, %d bytes fed)", proc.returncode, self.bytes_fed)


async def _relay_log(stream: asyncio.StreamReader) -> None:
    """Log what the child writes to its standard error, line by line, until it closes."""
    while True:
        try:
            line = await stream.readline()
        except ValueError:  # a line past the reader's limit: not a record of ours
            line = b"(an over-long line of the archiver's standard error was dropped)"
        if not line:
            return
        relog(line.decode("utf-8", "replace"), log.name + ".archiver")


# ---------------------------------------------------------------------------------------
# The child


def position_frame(lsn: int) -> bytes:
    """The frame that precedes a feed's WAL frames on the pipe: the LSN of their first record."""
    return frame(bytes((POSITION_TYPE,)) + _LSN.pack(lsn))


def positioned(frames: bytes, lsn: int | None) -> Iterator[tuple[int | None, bytes]]:
    """``frames`` (whole frames) cut at its position frames: each run of WAL frames with the
    LSN of its first record (``lsn`` for a run before the first position frame: a feed's
    frames may arrive in several reads). A position frame that ends ``frames`` (its feed's
    frames come in the next read) gives ``(its LSN, b"")``: that LSN is the next read's."""
    pos = start = 0
    header = HEADER.size
    while pos < len(frames):
        (length, _) = HEADER.unpack_from(frames, pos)
        end = pos + header + length
        if length == 1 + _LSN.size and frames[pos + header] == POSITION_TYPE:
            if start < pos:
                yield lsn, frames[start:pos]
            (lsn,) = _LSN.unpack_from(frames, pos + header + 1)
            start = end
        pos = end
    if start < len(frames):
        yield lsn, frames[start:]
    elif start:  # the last frame was a position frame
        yield lsn, b""


def complete_frames(buf: bytes | bytearray) -> int:
    """Length of the longest prefix of ``buf`` made of whole frames (the rest is still coming)."""
    pos, size, header = 0, len(buf), HEADER.size
    while size - pos >= header:
        (length, _) = HEADER.unpack_from(buf, pos)
        if size - pos - header < length:
            break
        pos += header + length
    return pos


def run(settings: ArchiveSettings, fd: int) -> None:
    """Archive the frames read from ``fd`` until end of file."""
    archive = Archive(
        Path(settings.directory),
        rotate_bytes=settings.rotate_bytes,
        max_bytes=settings.max_bytes,
        max_age_s=settings.max_age_s,
    )
    pending = bytearray()  # read, not yet a whole frame (a big batch arrives in many reads)
    next_lsn: int | None = None  # of the next record, once a position frame said it
    next_maintenance = time.monotonic() + MAINTAIN_S
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], max(next_maintenance - time.monotonic(), 0.0))
            if ready:
                chunk = os.read(fd, READ_BYTES)
                if not chunk:
                    break
                pending += chunk
                whole = complete_frames(pending)
                if whole:
                    with memoryview(pending) as view:  # one copy, not a bytearray slice copied again
                        frames = bytes(view[:whole])
                    del pending[:whole]
                    next_lsn = _archive(archive, frames, next_lsn)
            if time.monotonic() >= next_maintenance:
                next_maintenance = time.monotonic() + MAINTAIN_S
                _guarded(archive.maintain)
        if pending:
            log.error("archiver: the node's stream ended inside a frame; %d bytes dropped", len(pending))
    finally:
        archive.close()


def _archive(archive: Archive, frames: bytes, next_lsn: int | None) -> int | None:
    """Archive ``frames`` (whole frames), the first record's LSN ``next_lsn`` unless a
    position frame says otherwise; returns the LSN of the record that follows them."""
    for first_lsn, part in positioned(frames, next_lsn):
        if not part:  # a position frame last in this read: the frames it numbers come next
            next_lsn = first_lsn
            continue
        reader = FrameReader(part)
        rows = list(reader.rows())
        if reader.problem is not None:  # only a bug gets here: the bytes come straight from the WAL
            log.error("archiver: %s; the rest of this batch is skipped", reader.problem)
        _guarded(functools.partial(archive.write, rows, first_lsn))
        next_lsn = None if first_lsn is None or reader.problem is not None else first_lsn + len(rows)
    return next_lsn


def _guarded(step: Callable[[], None]) -> None:
    try:
        step()
    except StorageError as exc:  # a full or broken disk: log it, keep reading
        log.error("%s", exc.message)


def main(argv: list[str]) -> int:
    settings = ArchiveSettings(**orjson.loads(argv[0]))
    setup_child(settings.log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Rows and events are freed by reference counting (they form no cycles); the cycle
    # collector would only walk them, again and again: a third of the CPU at full load.
    gc.disable()
    os.nice(NICE)
    run(settings, sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
