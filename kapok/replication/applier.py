"""A slave's mirror, applied lazily: in idle time, in bounded slices, and completely on demand.

The follower (``kapok.replication.follower``) journals each records batch of its master
(the WAL writes the very bytes, one frame) and acks it once durable; decoding it and
applying its records to the mirror (``kapok.core.replay.Mirror``) is what cost a slave
most of its CPU, on the cores its master serves on, so it is done here, later
(``kapok.replication.unapplied`` holds the rules and the bound):

* in idle time: once the link has been quiet for ``QUIET_S`` (or while the load is light:
  ``LIGHT_RECORDS``), the task applies what is queued in slices of at most ``SLICE_S`` of
  loop time, yielding to the loop between slices, so a frame that arrives meanwhile is
  read, journaled and acked at once;
* over the bound: ``journaled`` applies the oldest batches itself, before the follower
  reads the next frame (the link's backpressure then slows the master's sending);
* completely, before anything needs the whole state: ``catch_up`` before the node leads
  (takeover, hand-over received, promote: ``kapok.replication.node``), before the slave's
  store cuts a snapshot (``DiskStore.before_snapshot``: a snapshot says it holds every
  record before the LSN it is cut at), and before the console shows a slave's state.

Who reads the applied prefix as it is: ``/metrics``, ``/health``, gossip's load figure and
the HTTP API's counts on a slave (``kapok_replication_unapplied_records`` says how far
behind they are), and the mirror's pruning (retention of what is applied). A slave sends
no full transfer: only a leader does, and a leader caught up before it led.

A batch that cannot be decoded (a master's bug: the link is TCP and the batch the master's
own encoding) is skipped and logged; ``failed`` then says why, and the node no longer
counts as in sync, so it never takes over on its own. Its WAL holds the batch: the next
start's recovery cuts the log there and the slave fetches the rest again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kapok.clock import loop_time, wait_set
from kapok.core.replay import Mirror
from kapok.errors import KapokError
from kapok.replication.session import Append
from kapok.replication.unapplied import Unapplied
from kapok.storage.records import decode_payload
from kapok.tasks import cancel_and_wait

__all__ = ["LIGHT_RECORDS", "MAX_BYTES", "MAX_RECORDS", "QUIET_S", "SLICE_S", "Applier", "UnappliedCollector"]

log = logging.getLogger("kapok.replication")

# The bound of what is journaled and not applied. In records: what a leader-to-be may have
# to apply before it serves (about 2.3 µs a record on the build machine: 250,000 ≈ 0.6 s;
# after a crash the link's silence of failover_timeout_s is idle time, in which it is
# applied before the takeover is decided). In bytes: the payloads held meanwhile (the WAL
# holds the same bytes objects until written; 250,000 records of 100-byte messages ≈ 35 MB).
MAX_RECORDS = 250_000
MAX_BYTES = 64 << 20
# The link has been quiet this long: its master is idle, and so, most likely, are the cores
# they share (a pair on one machine, or masters and slaves crossed over a few machines).
QUIET_S = 0.1
# Fewer records than this in two windows of QUIET_S (under 5,000-10,000 a second) is a
# light load: applied as it comes (a few ms of CPU a second), not kept up to the bound.
LIGHT_RECORDS = 1000
SLICE_S = 0.005  # loop time one slice may take before the loop serves others
PRUNE_EVERY_S = 1.0  # retention runs out on an idle mirror too


class Applier:
    def __init__(
        self,
        mirror: Mirror,
        applied: int,
        now: Callable[[], float],
        *,
        max_records: int = MAX_RECORDS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.mirror = mirror
        self.queue = Unapplied(
            applied, max_records=max_records, max_bytes=max_bytes, quiet_s=QUIET_S,
            light_records=LIGHT_RECORDS,
        )  # fmt: skip
        self.now = now  # the service's clock: retention is on it
        self.failed: str | None = None  # why a batch could not be applied (the mirror lacks it): the first
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        """Stop applying in idle time; ``catch_up`` still works (the last snapshot uses it)."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def stop(self) -> None:
        """``aclose`` for an applier whose mirror was replaced: cancel, nobody waits."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    @property
    def records(self) -> int:
        return self.queue.records

    def journaled(self, batch: Append) -> None:
        """A batch went to the WAL: queue it, and apply the oldest now when over the bound."""
        queue = self.queue
        was_empty = not queue
        queue.add(batch, loop_time())
        if queue.full:
            while queue.full:
                self._apply(queue.take())
        elif was_empty:
            self._wake.set()  # the task sets its quiet timer

    async def catch_up(self) -> None:
        """Apply everything journaled, yielding between slices. Returns in the loop turn of
        its last slice: whoever goes on without awaiting sees the whole log applied."""
        while self.queue:
            self._slice()
            if self.queue:
                await asyncio.sleep(0)

    def _slice(self) -> None:
        queue = self.queue
        deadline = time.perf_counter() + SLICE_S
        while queue and time.perf_counter() < deadline:
            self._apply(queue.take())
        if self.mirror.over_retention:
            self.mirror.prune(self.now())

    def _apply(self, batch: Append | None) -> None:
        if batch is None:
            return
        try:
            records = decode_payload(batch.payload)
            if len(records) != batch.count:
                raise KapokError(f"a batch said {batch.count} records and held {len(records)}")
        except KapokError as exc:
            if self.failed is None:
                log.error(
                    "records %d to %d from the master cannot be applied (%s): the mirror lacks them; "
                    "this slave no longer takes over on its own, and a restart fetches them again",
                    batch.first_lsn, batch.end - 1, exc.message,
                )  # fmt: skip
                self.failed = exc.message  # the first cause; the others are its consequence
            return
        self.mirror.apply_all(records)

    async def _run(self) -> None:
        pruned = loop_time()
        while True:
            now = loop_time()
            if self.queue.due(now):
                self._slice()
                await asyncio.sleep(0)
                continue
            if now - pruned >= PRUNE_EVERY_S:
                pruned = now
                self.mirror.prune(self.now())
            wait = self.queue.quiet_at() - now if self.queue else PRUNE_EVERY_S
            self._wake.clear()
            await wait_set(self._wake, max(wait, 0.0))


class UnappliedCollector(Collector):
    """``kapok_replication_unapplied_*``: what a slave has journaled and not applied yet."""

    def __init__(self, current: Callable[[], Applier | None]) -> None:
        self.current = current

    def collect(self) -> Iterator[Metric]:
        applier = self.current()
        records, size = (applier.queue.records, applier.queue.bytes) if applier is not None else (0, 0)
        yield GaugeMetricFamily(
            "kapok_replication_unapplied_records",
            "Records this slave has journaled (and acked) but not yet applied to its mirror",
            value=records,
        )
        yield GaugeMetricFamily(
            "kapok_replication_unapplied_bytes", "Payload bytes of those records, held in memory", value=size
        )
