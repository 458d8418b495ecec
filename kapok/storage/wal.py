"""The write-ahead log: numbered segment files of framed change records.

Theory of operation. ``append`` queues records and returns a future that
every append until the next hand-off shares; one flusher task encodes all
the records that accumulated meanwhile into one frame per segment (one JSON
encoding on the event loop; the CRC on the writer thread) and hands them to a
single writer thread (small writes that no fsync waits for are made on the
loop itself: ``INLINE_WRITE_BYTES``; the files and their threads are
``kapok.storage.segments``), which writes them and (with ``fsync: always``) fsyncs
once for all of them: group commit, one fsync per loop turn's worth of
records or more, never one per message. The future completes only after
that, so a producer's ack always follows the write that makes its message
durable; only then are the written frames queued for the archive
(``kapok.storage.archiver``: the same bytes, to a process of its own), which
gets everything queued every ``ARCHIVE_DELAY_S`` (or once
``ARCHIVE_BATCH_BYTES`` wait), so that analytics never delay an ack and the
archiver wakes seldom; ``aclose`` hands over what is still queued.

``write_now`` lets a caller that has appended all a socket read brought write
them at once, on its own turn, when the flusher would have written them inline
anyway: the appends' future is done before it returns, so a producer's ack
goes out on the turn its frame arrived (a round trip of one message: one loop
turn instead of three). Group commit stays what it was for the rest.
Policies:

* ``always``: acks wait for write + fsync (survives power loss);
* ``interval``: acks wait for the write (survives a process crash); a timer
  fsyncs every ``fsync_interval_ms``;
* ``never``: acks wait for the write; the OS decides when data reaches disk.

Each record has a log sequence number (LSN): its position in the log. A
segment file ``wal-<first LSN>.log`` holds consecutive records; a new one
starts when a segment reaches ``segment_max_bytes`` or when a snapshot asks
for a clean cut (``cut()``), so that whole segments can be deleted once a
snapshot covers them.

A full disk. A frame that finds no space (ENOSPC, EDQUOT; also a segment that cannot be
created) is cut off the file again (the segment keeps ending on a whole frame) and waits:
the flusher tries it again, more and more slowly (up to ``FULL_RETRY_S``), until it is
written; its future (a producer's ack, or a slave's) waits with it, and records appended
meanwhile queue in memory behind it, in order. ``full`` / ``wait_for_space`` tell whoever
feeds the log to take nothing big meanwhile: a slave takes nothing more from its master,
and the store refuses new messages (``kapok.storage.space``), so what queues is the small
records of consumers (acks never wait for the log). Nothing waiting was acknowledged, so
the wait costs no data, only the memory of what queues. Any other write error still fails
the log for good: the broker has applied the records already and cannot take them back.
One ERROR line when the disk fills, one line when the log writes again, and ``disk_full``
counts the times; ``aclose`` gives up the wait (what was never written was never
acknowledged).

The log's state, and its feeds to a slave's link (each batch as soon as it is encoded) and
to the archive (the written frames, in batches), are ``WalState``'s, in
``kapok.storage.walstate``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from kapok.clock import wait_set
from kapok.core.changes import Change
from kapok.errors import StorageError
from kapok.storage.records import encode_payload
from kapok.storage.segments import DiskFull, Encoded, free_bytes
from kapok.storage.walstate import Batch, WalState
from kapok.tasks import cancel_and_wait

__all__ = ["WriteAheadLog"]

log = logging.getLogger("kapok.storage")

# A write that found the disk full is tried again after the first delay, doubling up to
# the cap: a freed disk is seen within a second, and a full one costs a few writes.
FULL_RETRY_S: Final = (0.05, 1.0)


class WriteAheadLog(WalState):
    """The log's rules: appends, the writes, a full disk; its state and feeds are ``WalState``'s."""

    # ------------------------------------------------------------ lifecycle

    def start(self, next_lsn: int) -> None:
        """Begin appending at ``next_lsn`` (in a new segment file)."""
        self.next_lsn = next_lsn
        self._cut_next = True
        loop = self._loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._flusher()))
        if self.policy == "interval":
            self._tasks.append(loop.create_task(self._interval_syncer()))

    def stop_waiting(self) -> None:
        """The node is stopping: a write that waits for space gives up now, so that nothing
        of the stop (a request's handler, a hand-over) waits for it. Its appends fail (they
        were never acknowledged), and so do later ones, without raising."""
        self._closing.set()

    async def aclose(self) -> None:
        self._closing.set()  # a write waiting for space gives up: it was never acknowledged
        await self.flush()
        for task in self._tasks:
            await cancel_and_wait(task)
        self._submit_archive()  # whatever is still queued: a clean shutdown archives it all
        await self.files.aclose()

    # ------------------------------------------------------------ appending

    def append(self, changes: Sequence[Change]) -> asyncio.Future[None]:
        """Queue records; the future completes once they are durable under the policy."""
        if self.failed is not None:
            return self._refused()
        if not self._batches or self._cut_next or self._batches[-1].payload is not None:
            self._batches.append(Batch(self.next_lsn, [], self._cut_next))
            self._cut_next = False
        self._batches[-1].changes.extend(changes)
        return self._queued(len(changes))

    def append_encoded(self, payload: bytes, count: int) -> asyncio.Future[None]:
        """Queue one batch that is already encoded (``count`` records, as another node's
        WAL wrote it): it is written as one frame of its own, at the next LSNs."""
        if self.failed is not None:
            return self._refused()
        self._batches.append(Batch(self.next_lsn, [], self._cut_next, payload, count, replica=True))
        self._cut_next = False
        return self._queued(count)

    def _refused(self) -> asyncio.Future[None]:
        """An append to a failed log: raises, unless the log gave up a wait for space as the
        node stops, when its future fails instead (the connections' last acks and requeues
        are not worth a traceback each)."""
        assert self.failed is not None
        if not self._closing.is_set():
            raise self.failed
        assert self._loop is not None
        future: asyncio.Future[None] = self._loop.create_future()
        future.set_exception(self.failed)
        future.exception()  # retrieved: no "never retrieved" line
        return future

    @property
    def full(self) -> bool:
        """A write waits for space on a full disk (see the module's docstring)."""
        return self.full_since is not None

    async def wait_for_space(self) -> None:
        """Return once no write waits for space (at once when none does, or the log failed)."""
        await self._space.wait()

    def _queued(self, count: int) -> asyncio.Future[None]:
        """Count ``count`` records just queued; the future every append shares until the
        flusher takes them."""
        self.next_lsn += count
        self.records_written += count
        future = self._pending
        if future is None:
            assert self._loop is not None, "append before start"
            future = self._pending = self._loop.create_future()
            if self.policy == "always":
                self._wakeup.set()  # never written on the loop: the flusher's, at once
            elif not self._wake_due:
                # The flusher is woken on the next turn, not now: a caller that has the
                # records written on this turn (``write_now``) spares it a task switch.
                self._wake_due = True
                self._loop.call_soon(self._wake)
        return future

    def _wake(self) -> None:
        self._wake_due = False
        if self._batches:
            self._wakeup.set()

    def cut(self) -> int:
        """Make the next record start a new segment; returns that record's LSN."""
        self._cut_next = True
        return self.next_lsn

    def write_now(self) -> bool:
        """Write what is queued here, on the loop, when the flusher would have written it
        inline (no fsync awaited, see ``INLINE_WRITE_BYTES``), nothing is being written
        before it, and the archive is not behind. Their future is complete on return
        (True); otherwise the flusher writes them as ever (False)."""
        batches = self._batches
        if not batches or self._inflight is not None or self.failed is not None:
            return False
        if any(b.replica for b in batches):
            return False  # a slave's copies: its ack goes out from the flusher, as ever
        if self._archive is not None and self._archive.behind():
            return False  # the flusher waits for it: the archive's lag stays bounded
        encoded = [_encode(b) for b in batches]
        if not self.files.may_write_inline(encoded):
            # For the flusher, as they are: encoded once, not again.
            self._batches = [
                Batch(e.first_lsn, [], e.new_segment, e.payload, e.count, e.replica) for e in encoded
            ]
            return False
        self._batches = []
        waiter, self._pending = self._pending, None
        self._offer(encoded)
        try:
            self.files.write(encoded, False)
        except DiskFull as full:
            # No space: the flusher takes the rest over, waits for space and writes it (the
            # slave's link has it already); the appends' future waits with it.
            written, rest = encoded[: full.written], encoded[full.written :]
            self._batches = [
                Batch(e.first_lsn, [], e.new_segment, e.payload, e.count, e.replica, offered=True)
                for e in rest
            ]
            self._pending = waiter
            self._wakeup.set()
            if self._archive is not None and written:
                self._queue_for_archive(written)
            return False
        except OSError as exc:
            self._fail(exc, waiter)
            return False
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._archive is not None:
            self._queue_for_archive(encoded)
        return True

    async def flush(self) -> None:
        """Wait until everything appended so far is durable (or failed)."""
        waiting = [f for f in (self._inflight, self._pending) if f is not None]
        if waiting:
            await asyncio.wait(waiting)

    async def _flusher(self) -> None:
        loop = asyncio.get_running_loop()
        sync = self.policy == "always"
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._batches:
                batches, self._batches = self._batches, []
                waiter, self._pending = self._pending, None
                self._inflight = waiter
                try:
                    encoded = [_encode(b) for b in batches]
                    self._offer(encoded)
                    rest = encoded
                    while True:
                        try:
                            if self.files.may_write_inline(rest):
                                self.files.write(rest, sync)
                            else:
                                await loop.run_in_executor(self.files.writer, self.files.write, rest, sync)
                            break
                        except DiskFull as full:
                            rest = rest[full.written :]
                            await self._wait_for_space(full, rest[0].first_lsn)
                    if self.full_since is not None:
                        self._space_again()
                except OSError as exc:
                    self._fail(exc, waiter)
                    return
                self._inflight = None
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                if self._archive is not None:
                    await self._hand_to_archive(encoded)

    def _fail(self, exc: OSError, waiter: asyncio.Future[None] | None) -> None:
        self.failed = StorageError(f"the write-ahead log failed: {exc}")
        if self.full_since is not None and self._closing.is_set():
            log.warning(
                "closed with the disk full: records from LSN %d on were not written (none was confirmed)",
                self._full_lsn,
            )
        else:
            log.error("%s; the node no longer accepts writes", self.failed.message)
        for future in (waiter, self._pending):
            if future is not None and not future.done():
                future.set_exception(self.failed)
                future.exception()  # retrieved: an unawaited failure is not an extra log line
        self._inflight = None
        self._space.set()  # whoever waits for space learns of the failure instead

    async def _wait_for_space(self, full: DiskFull, lsn: int) -> None:
        """A write found the disk full: wait a while before it is tried again; the OSError
        when the log is closing."""
        loop = asyncio.get_running_loop()
        if self.full_since is None:
            self.full_since = loop.time()
            self.disk_full += 1
            self._space.clear()
            try:
                self.full_free = await loop.run_in_executor(self.files.writer, free_bytes, self.directory)
                free = f"{self.full_free} bytes free"
            except OSError as exc:
                self.full_free, free = None, f"free space unknown: {exc.strerror or exc}"
            log.log(
                logging.WARNING if self.full_reported else logging.ERROR,
                "disk full: the write-ahead log cannot write LSN %d in %s (%s, %s); no record past it "
                "is acknowledged until space is freed, and it is tried again until then",
                lsn, self.directory, full.error.strerror or full.error, free,
            )  # fmt: skip
        self._full_lsn = lsn
        first, cap = FULL_RETRY_S
        delay = min(cap, first * 2**self._full_tries)
        self._full_tries += 1
        if await wait_set(self._closing, delay):
            raise full.error

    def _space_again(self) -> None:
        assert self.full_since is not None and self._loop is not None
        waited = self._loop.time() - self.full_since
        log.warning("the write-ahead log writes again after %.1f s of a full disk", waited)
        self.full_since = None
        self._full_tries = 0
        self._space.set()

    async def _interval_syncer(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if self.files.dirty:
                await asyncio.wrap_future(self.files.in_background(self.files.background_sync))

    # ------------------------------------------------------------ maintenance

    async def drop_before(self, lsn: int) -> int:
        """Delete segments that hold only records before ``lsn``; returns how many."""
        return await self.files.drop_before(lsn)


def _encode(batch: Batch) -> Encoded:
    b, payload = batch, batch.payload
    if payload is not None:
        return Encoded(b.first_lsn, b.count, payload, b.new_segment, b.replica, offered=b.offered)
    return Encoded(batch.first_lsn, len(batch.changes), encode_payload(batch.changes), batch.new_segment)
