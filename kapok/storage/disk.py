"""``DiskStore``: the WAL, periodic snapshots, recovery and the archive, together.

Layout under ``storage.dir``::

    wal/wal-<first LSN>.log        segments of framed change records
    snapshots/snapshot-<LSN>.snap  the two newest snapshots (state before record LSN)
    archive/archive-*.jsonl        lifecycle events for analytics (written by the archiver process)

Recovery loads the newest valid snapshot, replays the WAL from its LSN,
stops at the first torn or corrupt record, or at a gap between two segments
the snapshot does not cover (the log is cut there, the offset logged and
counted; later segments are set aside as ``.orphan``), then requeues
whatever was in flight: a node never serves past a damaged record (a slave
fetches the rest from its master again). A snapshot is taken every
``snapshot_interval_s`` and at clean shutdown, after which WAL segments
the previous snapshot covers are deleted: the two newest snapshots and the
WAL since the older of them stay, so a damaged newest snapshot is survived.

A full disk (``kapok.storage.space``): ``full()`` says why new messages are refused;
snapshots are skipped meanwhile (they need the space the log's reserve keeps, and the
WAL holds everything written), the shutdown snapshot too, in one line. Recovery writes
nothing but the requeues it appends to the log, so a node starts on a full disk and
serves its consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kapok.config import StorageConfig
from kapok.core.broker import Broker
from kapok.core.changes import Change
from kapok.core.replay import apply_all, finish_recovery, state_records
from kapok.errors import StorageError
from kapok.storage.archiver import ArchiveFeed, ArchiveSettings
from kapok.storage.records import FrameReader, encode_batch, encode_end
from kapok.storage.segments import Segment, list_segments
from kapok.storage.snapshot import FoundSnapshot, SnapshotWriter, find_newest, list_snapshots, map_file
from kapok.storage.space import SpaceWatch
from kapok.storage.wal import WriteAheadLog
from kapok.tasks import cancel_and_wait

__all__ = ["DiskStore", "begin_transfer", "install_transfer"]

log = logging.getLogger("kapok.storage")

SNAPSHOT_BATCH = 5000  # records per snapshot frame; the event loop runs between frames


class DiskStore:
    wants_changes = True

    def __init__(self, cfg: StorageConfig, *, fsync: Callable[[int], None] = os.fsync) -> None:
        self.cfg = cfg
        root = Path(cfg.dir)
        self.wal_dir = root / "wal"
        self.snapshot_dir = root / "snapshots"
        self.archive: ArchiveFeed | None = None
        if cfg.archive:
            self.archive = ArchiveFeed(
                ArchiveSettings(
                    str(root / "archive"),
                    rotate_bytes=cfg.archive_rotate_bytes,
                    max_bytes=cfg.archive_max_bytes,
                    max_age_s=cfg.archive_max_age_s,
                    log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
                )
            )
        self.wal = WriteAheadLog(
            self.wal_dir,
            policy=cfg.fsync,
            interval_ms=cfg.fsync_interval_ms,
            segment_max_bytes=cfg.segment_max_bytes,
            fsync=fsync,
        )
        self.space = SpaceWatch(root, cfg.min_free_bytes, self.wal)
        self._fsync = fsync
        self._broker: Broker | None = None
        # Brings the state up to the log's end (a slave applies its master's records lazily:
        # ``kapok.replication.applier``); it returns in the loop turn the snapshot is cut in.
        self.before_snapshot: Callable[[], Awaitable[None]] | None = None
        self._snapshot_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kapok-snapshot")
        self._snapshot_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.corrupt_tails = 0
        self.snapshots = 0
        self.last_snapshot_s = 0.0
        self.last_snapshot_bytes = 0
        self.recovery_s = 0.0
        self.snapshots_skipped = 0
        self._lock_fd: int | None = None
        self._closed = False

    # ------------------------------------------------------------ recovery

    async def open(self, broker: Broker, now: float, *, mirror: bool = False) -> None:
        """Recover into ``broker`` and start the WAL and the snapshots. A ``mirror`` (a slave
        following its master) keeps the replayed state as it is, for more records to be
        applied (``kapok.core.replay.Mirror``), and writes no archive until it is promoted."""
        loop = asyncio.get_running_loop()
        for directory in (self.wal_dir, self.snapshot_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock(self.wal_dir.parent)
        started = time.perf_counter()
        installed = await loop.run_in_executor(None, install_transfer, self.wal_dir.parent)
        if installed is not None:
            log.info("installed a full state transfer at LSN %d in place of the local log", installed)
        self.space.serving = not mirror
        await self.space.probe()  # a start on a full disk says so before it serves anyone
        journal, broker.journal = broker.journal, False
        snapshot = await loop.run_in_executor(None, find_newest, self.snapshot_dir)
        for problem in snapshot.skipped:
            log.error("snapshot not usable, falling back to an older one: %s", problem)
        self.snapshots_skipped = len(snapshot.skipped)
        # Recovery builds the long-lived state, object by object: the cycle collector would
        # walk it over and over (a quarter of the time), yet it can find no garbage in it.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            next_lsn, replayed = await loop.run_in_executor(None, self._replay, broker, snapshot)
        finally:
            if gc_was_on:
                gc.enable()
        broker.journal = journal
        requeued = 0 if mirror else finish_recovery(broker, now)
        self._broker = broker
        if not mirror:
            await self.start_archive()
        self.wal.start(next_lsn)
        self.recovery_s = time.perf_counter() - started
        log.info(
            "recovered %d messages in %.3f s (snapshot at LSN %d, %d WAL records replayed, "
            "%d deliveries requeued)",
            len(broker.messages), self.recovery_s, snapshot.lsn, replayed, requeued,
        )  # fmt: skip
        self._task = loop.create_task(self._snapshot_loop())
        self.space.start()

    def _replay(self, broker: Broker, snapshot: FoundSnapshot) -> tuple[int, int]:
        """Apply the snapshot, then the WAL from its LSN; returns the next LSN and the WAL records applied.

        Runs on a worker thread while the event loop waits for it: nothing else touches the
        broker before recovery is over. Files are mapped, not read, and records are applied
        one by one, so recovery needs no more memory than the state it rebuilds.
        """
        reader = snapshot.reader()
        apply_all(broker, reader)
        if reader.problem is not None:  # checked before, so only a writer bug gets here
            raise StorageError(f"snapshot at LSN {snapshot.lsn} cannot be read: {reader.problem}")
        start_lsn = snapshot.lsn
        segments = list_segments(self.wal_dir)
        next_lsn = start_lsn
        replayed = 0
        read = False  # a segment was read: the next one must go on from its end
        for i, segment in enumerate(segments):
            following = segments[i + 1 :]
            if following and following[0].first_lsn <= start_lsn:
                continue  # wholly covered by the snapshot
            if read and segment.first_lsn > next_lsn:  # records in between are missing: none after counts
                self.corrupt_tails += 1
                log.warning(
                    "WAL %s starts at LSN %d, but the log before it ends at %d; set aside as .orphan",
                    segment.path.name, segment.first_lsn, next_lsn,
                )  # fmt: skip
                for later in segments[i:]:
                    later.path.rename(later.path.with_suffix(".orphan"))
                break
            read = True
            reader = FrameReader(map_file(segment.path))
            records = iter(reader)
            skip = start_lsn - segment.first_lsn  # records the snapshot holds already
            if skip > 0:
                next(itertools.islice(records, skip - 1, None), None)
            replayed += apply_all(broker, records)
            next_lsn = max(next_lsn, segment.first_lsn + reader.count)
            if reader.problem is not None:
                self.corrupt_tails += 1
                log.warning(
                    "WAL %s: %s; keeping the %d records before offset %d",
                    segment.path.name, reader.problem, reader.count, reader.good_end,
                )  # fmt: skip
                os.truncate(segment.path, reader.good_end)
                for later in following:
                    later.path.rename(later.path.with_suffix(".orphan"))
                    log.warning("WAL %s follows a damaged segment; set aside as .orphan", later.path.name)
                break
        return next_lsn, replayed

    async def start_archive(self) -> None:
        """Start serving clients (at start-up, or when a slave is promoted): the archive
        starts, and the free-space reserve applies to new messages."""
        self.space.serving = True
        self.space.update()  # a start on a full disk says so now, naming the path
        if self.archive is not None and not self.archive.started:
            await self.archive.start()
            self.wal.attach_archive(self.archive)

    def replay_from(self, lsn: int) -> Iterator[Change]:
        """The records of the WAL from ``lsn`` to its end (a node that learns it diverged
        sets them aside for the operator). Reads the files: call it on a worker thread."""
        for segment, following in _with_next(list_segments(self.wal_dir)):
            if following is not None and following.first_lsn <= lsn:
                continue
            at = segment.first_lsn
            for record in FrameReader(map_file(segment.path)):
                if at >= lsn:
                    yield record
                at += 1

    # ------------------------------------------------------------ appending

    def append(self, changes: Sequence[Change]) -> asyncio.Future[None] | None:
        return self.wal.append(changes)

    def write_now(self) -> None:
        self.wal.write_now()

    def full(self) -> str | None:
        return self.space.reason()

    def stop_waiting(self) -> None:
        self.wal.stop_waiting()

    # ------------------------------------------------------------ snapshots

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.snapshot_interval_s)
            if self.full() is not None:
                continue  # no room for it; the WAL holds everything written
            try:
                await self.snapshot()
            except OSError as exc:  # a full disk, say: one line, no traceback
                log.error("snapshot failed: %s; the WAL still holds everything", exc)
            except Exception:  # the next interval tries again; the WAL holds everything
                log.exception("snapshot failed; the WAL still holds everything")

    async def snapshot(self) -> None:
        """Write a snapshot of the live state and drop the WAL segments it covers."""
        broker = self._broker
        if broker is None:
            return
        async with self._snapshot_lock:
            loop = asyncio.get_running_loop()
            started = time.perf_counter()
            if self.before_snapshot is not None:
                await self.before_snapshot()  # nothing awaited from here to the cut
            lsn = self.wal.cut()
            writer = await loop.run_in_executor(
                self._snapshot_thread, SnapshotWriter, self.snapshot_dir, lsn, self._fsync
            )
            try:
                pending: list[Change] = []
                for record in state_records(broker, time.time()):
                    pending.append(record)
                    if len(pending) >= SNAPSHOT_BATCH:
                        await loop.run_in_executor(self._snapshot_thread, writer.write, encode_batch(pending))
                        pending.clear()
                tail = (encode_batch(pending) if pending else b"") + encode_end()
                await loop.run_in_executor(self._snapshot_thread, writer.write, tail)
                keep_from = await loop.run_in_executor(self._snapshot_thread, writer.commit)
            except BaseException:
                with contextlib.suppress(OSError):
                    await loop.run_in_executor(self._snapshot_thread, writer.abort)
                raise
            dropped = await self.wal.drop_before(keep_from)
            self.snapshots += 1
            self.last_snapshot_s = time.perf_counter() - started
            self.last_snapshot_bytes = writer.size
            log.info(
                "snapshot at LSN %d: %d bytes in %.3f s; %d WAL segments dropped",
                lsn, writer.size, self.last_snapshot_s, dropped,
            )  # fmt: skip

    # ------------------------------------------------------------ the rest

    def stats(self) -> dict[str, float]:
        wal, archive = self.wal, self.archive
        return {
            "wal_records_total": wal.records_written,
            "wal_bytes_total": wal.bytes_written,
            "wal_fsyncs_total": wal.fsyncs,
            "wal_disk_full_total": wal.disk_full,
            "disk_full": 1 if self.full() is not None else 0,
            "disk_full_periods_total": self.space.periods,
            "disk_free_bytes": self.space.free if self.space.free is not None else -1,
            "recovery_corrupt_tails_total": self.corrupt_tails,
            "recovery_snapshots_skipped_total": self.snapshots_skipped,
            "recovery_seconds": self.recovery_s,
            "snapshots_total": self.snapshots,
            "snapshot_seconds": self.last_snapshot_s,
            "snapshot_bytes": self.last_snapshot_bytes,
            "archive_bytes_fed_total": archive.bytes_fed if archive else 0,
            "archive_frames_lost_total": archive.frames_lost if archive else 0,
            "archive_restarts_total": archive.restarts if archive else 0,
        }

    async def aclose(self, *, snapshot: bool = True) -> None:
        """Stop: a last snapshot (unless told not to: a slave about to replace its state
        skips it), then the WAL, the archive and the directory lock. Closing twice is a no-op."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self.space.aclose()
        full = self.full()
        if full is not None and self._broker is not None and snapshot:
            log.warning("no shutdown snapshot: storage full: %s", full)
        elif self._broker is not None and snapshot:
            try:
                await self.snapshot()
            except OSError as exc:
                log.error("the shutdown snapshot failed: %s; the WAL still holds everything", exc)
            except Exception:
                log.exception("the shutdown snapshot failed; the WAL still holds everything")
        await self.wal.aclose()
        if self.wal.failed is None:
            log.info("WAL closed at LSN %d: flushed and fsynced", self.wal.next_lsn)
        await asyncio.to_thread(self._snapshot_thread.shutdown, wait=True)  # joined off the loop
        if self.archive is not None:
            await self.archive.aclose()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None


def begin_transfer(cfg: StorageConfig, lsn: int) -> SnapshotWriter:
    """The writer of a full state transfer's snapshot at ``lsn``: it goes to ``transfer/``
    beside the store, which stays as it is (and usable) until the snapshot is complete.
    Once committed, the next ``DiskStore.open`` on the directory installs it in place of
    the WAL and the snapshots (``install_transfer``). Blocking: call it on a worker thread."""
    staging = Path(cfg.dir) / "transfer"
    staging.mkdir(parents=True, exist_ok=True)
    for path in staging.iterdir():  # an earlier transfer that did not finish
        path.unlink(missing_ok=True)
    return SnapshotWriter(staging, lsn)


def install_transfer(root: Path) -> int | None:
    """Replace the store's WAL and snapshots by a completed transfer, if one waits in
    ``transfer/``; returns its LSN. Safe to repeat after a crash at any point: the staged
    snapshot is the last thing to move."""
    staging = root / "transfer"
    staged = list_snapshots(staging) if staging.is_dir() else []
    if not staged:
        return None
    lsn, path = staged[-1]
    for directory in (root / "wal", root / "snapshots"):
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            old.unlink(missing_ok=True)
    target = root / "snapshots" / path.name
    os.replace(path, target)
    for directory in (root / "snapshots", root):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for leftover in staging.iterdir():
        leftover.unlink(missing_ok=True)
    staging.rmdir()
    return lsn


def _with_next(segments: list[Segment]) -> Iterator[tuple[Segment, Segment | None]]:
    for i, segment in enumerate(segments):
        yield segment, segments[i + 1] if i + 1 < len(segments) else None


def _lock(directory: Path) -> int:
    """Hold an exclusive lock on the data directory: two nodes on one WAL would corrupt it.

    The kernel drops the lock when the process dies, so a crash never leaves it stale.
    """
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StorageError(f"storage.dir {str(directory)!r} is in use by another Kapok process") from None
    return fd
