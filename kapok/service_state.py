"""The broker service's state and its outputs: ``ServiceState``, the base of ``BrokerService``.

``ServiceState`` holds what the service (``kapok.service``) works on: the configuration,
the clock, the store, the pure ``Broker``, the connections' sinks, the long polls' events
and the timer. ``_settle`` hands the broker's outputs on after every call: change records to
the store, pushes to their connections (held back until the messages they carry are
durable), woken long polls, and the timer re-armed for the core's next deadline, which
calls ``tick``. ``durable`` says what an answer that must outlive a crash waits for.
"""

from __future__ import annotations

import asyncio
import logging
import math
import zlib
from collections.abc import Callable
from typing import Protocol

from kapok.clock import Clock, SystemClock, Timer
from kapok.config import Config
from kapok.core.broker import Broker
from kapok.core.consumers import Consumer
from kapok.core.model import Entry
from kapok.core.topics import Group
from kapok.errors import UnavailableError
from kapok.storage import MemoryStore, Store

__all__ = ["ServiceState", "Sink"]

log = logging.getLogger("kapok.server")

# The timer fires at least this often, so that housekeeping without a
# deadline of its own (the dedup window) still runs on an idle node.
MAX_TIMER_S = 1.0


class Sink(Protocol):
    """Where a connection receives what the broker delivers to one of its consumers."""

    def push(self, consumer: Consumer, entries: list[Entry], after: asyncio.Future[None] | None) -> None:
        """Send ``entries`` once ``after`` (when given) is done: the WAL write that makes
        their messages durable."""
        ...


class ServiceState:
    """The service's state and its outputs; ``BrokerService`` adds the operations."""

    def __init__(self, config: Config, *, store: Store | None = None, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.store: Store = store or MemoryStore()
        self.node_name = config.server.node_name
        # Where clients reach this node; the runner sets the real port after
        # binding (port 0 picks a free one).
        self.http_host = config.server.host
        self.http_port = config.server.port
        node_id = zlib.crc32(self.node_name.encode())
        self.broker = Broker(config.mq.settings(), node_id, journal=self.store.wants_changes)
        self.started_at = self.clock.time()
        # Set by replication (``kapok.replication.node``): ``gate(publish)`` raises when this
        # node must refuse a client now (a passive slave, a fenced master, a sync master
        # without its slave); ``confirm`` makes a publish's confirmation wait for the slave.
        self.gate: Callable[[bool], None] | None = None
        self.confirm: Callable[[asyncio.Future[None] | None], asyncio.Future[None] | None] | None = None
        self._sinks: dict[int, Sink] = {}
        self._published = 0  # broker.stats.published when last seen by _settle
        self._undurable: asyncio.Future[None] | None = None  # the WAL write of the latest publishes
        self._undurable_from = 0  # the first message (seq) that may wait for it
        self._seq_seen = 0  # broker.next_seq when last seen by _settle
        self._last_write: asyncio.Future[None] | None = None  # the store's latest append (see durable)
        self._waiters: dict[Group, asyncio.Event] = {}
        self._timer: Timer | None = None
        self._timer_at = math.inf

    def now(self) -> float:
        return self.clock.time()

    # ------------------------------------------------------------ outputs

    def _settle(self) -> asyncio.Future[None] | None:
        """Hand the broker's outputs on: change records to the store, pushes to their
        connections, woken long polls; returns what a write's confirmation waits for (its
        records durable, and with sync replication on its slave too)."""
        broker = self.broker
        waiter = None
        if broker.journal:
            changes = broker.take_changes()
            if changes:
                waiter = self._last_write = self.store.append(changes)
            if broker.stats.published != self._published:
                # Messages were stored: no consumer may see them before they are confirmed (a
                # crash before that would make them messages the node, or its slave taking
                # over, never had). Confirmations complete in order, so waiting for the
                # latest covers every earlier one.
                self._published = broker.stats.published
                local = waiter
                if self.confirm is not None:
                    waiter = self.confirm(local)
                if self._undurable is None or self._undurable.done():
                    self._undurable_from = self._seq_seen  # the first message this write holds
                self._undurable = waiter if waiter is local or waiter is None else _delivered_after(waiter)
            self._seq_seen = broker.next_seq
        pushes = broker.take_pushes()
        if pushes:
            consumers = broker.consumers
            after = self._undurable
            if after is not None and after.done():
                after = self._undurable = None
            # On a full disk that write may wait long for space: only the deliveries of the
            # messages it holds wait with it, not those of messages durable long ago (the
            # consumers drain the backlog meanwhile). Looked at only then: it costs a check
            # per delivered message.
            sort = after is not None and self.store.full() is not None
            for cid, entries in pushes.items():
                sink = self._sinks.get(cid)
                consumer = consumers.get(cid)
                if sink is not None and consumer is not None:
                    sink.push(consumer, entries, after if not sort or self._waits(entries) else None)
        if self._waiters:
            for group in broker.take_woken():
                event = self._waiters.get(group)
                if event is not None:
                    event.set()
        self._arm_timer()
        return waiter

    def _waits(self, entries: list[Entry]) -> bool:
        """Whether a delivery of ``entries`` must wait for the latest publishes' write."""
        first = self._undurable_from
        return any(entry.msg.seq >= first for entry in entries)

    def durable(self) -> asyncio.Future[None] | None:
        """What to await before answering a request whose effect must outlive a crash and a
        takeover (a claim's lease or its ack: ``kapok.core.claims``): every record journaled
        so far written by the store (writes complete in order) and, with sync replication,
        confirmed by the slave. None: nothing to wait for.

        As for deliveries (``_delivered_after``), a slave that does not confirm in time
        holds nothing back once the local write is done; and while the pair takes no
        confirmed write at all (a sync master whose slave is gone: ``gate``), there is no
        slave to wait for: a claim is then as durable as the master alone makes it."""
        local = self._last_write
        if local is not None and local.done() and not local.cancelled() and local.exception() is None:
            local = None
        if self.confirm is None:
            return local
        if self.gate is not None:
            try:
                self.gate(True)
            except UnavailableError:
                return local
        confirmed = self.confirm(local)
        return None if confirmed is None else _delivered_after(confirmed)

    # ------------------------------------------------------------ the timer

    def _arm_timer(self) -> None:
        now = self.now()
        due = self.broker.next_deadline()
        target = min(due if due is not None else math.inf, now + MAX_TIMER_S)
        if target >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = target
        self._timer = self.clock.call_at(target, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        try:
            self.broker.tick(self.now())
        except Exception:  # a bug must not stop the node's clock
            log.exception("broker tick failed")
        self._settle()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf


def _delivered_after(confirmed: asyncio.Future[None]) -> asyncio.Future[None]:
    """When the pushes of messages awaiting ``confirmed`` may go: once it is done, even when
    the slave did not confirm in time (the messages are stored here: holding them back for
    good would be worse); never when the node's own storage failed."""
    out: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done(f: asyncio.Future[None]) -> None:
        exc = None if f.cancelled() else f.exception()
        if exc is None or isinstance(exc, UnavailableError):
            out.set_result(None)
        else:
            out.set_exception(exc)

    confirmed.add_done_callback(done)
    return out
