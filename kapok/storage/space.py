"""Free space under ``storage.dir``: whether the store takes new messages now.

Theory of operation. The store is *full* while either

* the last probe found less than ``storage.min_free_bytes`` free (a ``statvfs`` of the
  directory on a worker thread every ``PROBE_INTERVAL_S``; 0 turns the probe's verdict off),
  or
* a write of the WAL waits for space: it found none (ENOSPC), see ``kapok.storage.wal``.

While full, new messages are refused before the broker applies anything
(``BrokerService.publish`` raises ``StorageFullError``), so what the log still has to
write is small: the records of consumers (acks, nacks, leases), which go to the reserve
the threshold keeps or, with no space at all, queue in memory behind the waiting write
(acks never wait for the log). So consumers drain the backlog while producers are told
to go elsewhere. Full ends by itself once a probe sees enough space again and no write
waits: no restart.

A mirror (a slave following its master) takes no client writes, so the reserve does not
apply to it until it is promoted (``serving``); its WAL's wait is the slave's own
business (``kapok.replication.follower``).

One ERROR line when the reserve runs out (the WAL says it itself when a write finds no
space), one WARNING line when new messages are accepted again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Final

from kapok.storage.segments import free_bytes
from kapok.storage.wal import WriteAheadLog
from kapok.tasks import cancel_and_wait

__all__ = ["PROBE_INTERVAL_S", "SpaceWatch"]

log = logging.getLogger("kapok.storage")

# How often the free space is looked at: a statvfs costs microseconds, and a producer
# refused for a full disk learns within this much that space is back.
PROBE_INTERVAL_S: Final = 2.0


class SpaceWatch:
    """The full-or-not state of one store's directory (see the module's docstring)."""

    def __init__(
        self,
        directory: Path,
        min_free_bytes: int,
        wal: WriteAheadLog,
        *,
        probe: Callable[[Path], int] = free_bytes,
        interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self.directory = directory
        self.min_free_bytes = min_free_bytes
        self.interval_s = interval_s
        self.serving = False  # the reserve applies: this node takes client writes
        self.free: int | None = None  # bytes free at the last probe (None: not probed yet)
        self.periods = 0  # times the store became full (as seen by the probe)
        self._wal = wal
        self._probe = probe
        self._low = False  # the last probe found less than min_free_bytes
        self._was_full = False
        self._task: asyncio.Task[None] | None = None
        self._failed_probe = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.probe()

    async def probe(self) -> None:
        """Look at the free space now; log when the store becomes full or stops being so."""
        loop = asyncio.get_running_loop()
        try:
            self.free = await loop.run_in_executor(None, self._probe, self.directory)
        except OSError as exc:  # the verdict stays as it was; said once
            if not self._failed_probe:
                log.warning("cannot tell the free space of %s: %s", self.directory, exc.strerror or exc)
            self._failed_probe = True
        else:
            self._failed_probe = False
            self._low = self.free < self.min_free_bytes
        self.update()

    def reason(self) -> str | None:
        """Why new messages are refused now (naming the directory and its free space), or
        None when they are taken."""
        wal = self._wal
        if wal.full:
            free = "free space unknown" if wal.full_free is None else f"{wal.full_free} bytes free"
            return f"the write-ahead log in {wal.directory} found no space and waits for it ({free})"
        if self.serving and self._low:
            return (
                f"{self.directory} has {self._free_text()}, "
                f"below storage.min_free_bytes ({self.min_free_bytes})"
            )
        return None

    def _free_text(self) -> str:
        return "free space unknown" if self.free is None else f"{self.free} bytes free"

    def update(self) -> None:
        """Log a change of state (the probe calls it; so may anyone who learns of one)."""
        reason = self.reason()
        full = reason is not None
        if full == self._was_full:
            return
        self._was_full = full
        self._wal.full_reported = full
        if full:
            self.periods += 1
            if not self._wal.full:  # else the WAL said so already, in a line of its own
                log.error(
                    "storage full: %s; new messages are refused (507 storage_full) until space "
                    "is freed; consumers, acks and reads go on", reason,
                )  # fmt: skip
        else:
            log.warning("storage has space again (%s): new messages are accepted", self._free_text())
