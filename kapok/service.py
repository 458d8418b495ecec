"""The broker service: the thin driver around the pure ``Broker``.

It owns what the core must not: the clock, the store, the timer that calls
``tick``, the sockets' sinks, and long-poll waiters. Every operation follows
the same shape: call the core with ``now``, then ``_settle()`` the outputs:
pushes go to their connections' outboxes (one frame per consumer per
event), change records go to the store, long-polls are woken, and the
timer is re-armed for the core's next deadline. Handlers of every protocol
call these methods, so all protocols share one set of rules.

The state it keeps and its outputs (``_settle``, the timer, ``durable``: what an answer
waits for) are ``ServiceState``'s, in ``kapok.service_state``; the lifecycle, the operations
and the long polls' waits are ``BrokerService``'s, here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence

from kapok.cluster.node import format_addr, split_addr
from kapok.core.broker import Broker, Draft, Settle
from kapok.core.changes import REQUEUED
from kapok.core.consumers import Consumer
from kapok.core.model import Entry
from kapok.errors import (
    BadRequestError,
    BrokerError,
    NotFoundError,
    ReplicationUnavailableError,
    StorageFullError,
)
from kapok.service_state import ServiceState, Sink
from kapok.storage import Store

__all__ = ["BrokerService"]


class BrokerService(ServiceState):
    """What every protocol and the node call: the lifecycle, the operations, the long polls."""

    # ------------------------------------------------------------ lifecycle

    async def start(self, *, mirror: bool = False) -> None:
        """Recover the store; a ``mirror`` stays as replayed until replication decides."""
        await self.store.open(self.broker, self.now(), mirror=mirror)
        self._settle()

    async def reopen(self, store: Store, *, mirror: bool) -> None:
        """Replace the store and the broker's state with what ``store`` recovers (replication:
        a node that starts following, or has received a full transfer). The caller has
        closed every client connection and the old store is closed here."""
        self._cancel_timer()
        self._sinks.clear()
        self._waiters.clear()
        with contextlib.suppress(Exception):
            await self.store.aclose(snapshot=False)
        self.broker = Broker(self.config.mq.settings(), self.broker.node_id, journal=store.wants_changes)
        self._published, self._undurable, self._undurable_from, self._seq_seen = 0, None, 0, 0
        self._last_write = None
        self.store = store
        await store.open(self.broker, self.now(), mirror=mirror)

    def resumed(self) -> None:
        """The mirrored state went live (replication promoted this node): start its timer."""
        self._settle()

    async def aclose(self) -> None:
        self._cancel_timer()
        await self.store.aclose()

    @property
    def http_url(self) -> str:
        host = f"[{self.http_host}]" if ":" in self.http_host else self.http_host
        scheme = "https" if self.config.server.tls_cert else "http"
        return f"{scheme}://{host}:{self.http_port}"

    @property
    def advertised_url(self) -> str:
        """The URL other nodes reach this one at (gossip carries it, a slave's hello gives
        it): ``server.public_url`` when set (the node is behind a proxy or load balancer);
        otherwise the bound address, except that a wildcard ``server.host`` (0.0.0.0, ::)
        is no address, so the gossip address's host stands in, which others reach us at by
        definition."""
        if self.config.server.public_url:
            return self.config.server.public_url.rstrip("/")
        if self.http_host not in ("0.0.0.0", "::", ""):
            return self.http_url
        cluster = self.config.cluster
        host = split_addr(cluster.advertise or cluster.bind)[0]
        scheme = "https" if self.config.server.tls_cert else "http"
        return f"{scheme}://{format_addr(host, self.http_port)}"

    # ------------------------------------------------------------ operations

    def publish(self, drafts: Sequence[Draft]) -> tuple[list[str], asyncio.Future[None] | None]:
        """Store a batch; returns the codes and what to await before confirming them."""
        try:
            if self.gate is not None:
                self.gate(True)
            self._check_space()
        except (ReplicationUnavailableError, StorageFullError):
            # A batch sent again (after a failover, or after its confirmation was lost), all
            # of it already here: answer its codes, there is nothing to store.
            known = self.broker.admission.known_codes(list(drafts), self.now())
            if known is None:
                raise
            self.broker.stats.duplicates += len(known)
            return known, None
        codes = self.broker.publish(drafts, self.now())
        return codes, self._settle()

    def _check_space(self) -> None:
        """Refuse new messages while the store's disk is full, before anything is applied
        (what consumers do is still stored: see ``kapok.storage.space``)."""
        full = self.store.full()
        if full is not None:
            raise StorageFullError(f"storage full: {full}; new messages are refused until space is freed")

    def write_now(self) -> None:
        """The caller has published all a socket read brought: have the store write it now,
        if cheap, so that its confirmations can go out on this turn (``Store.write_now``)."""
        self.store.write_now()

    def check_active(self) -> None:
        """Raise when this node takes no clients now (see ``gate``)."""
        if self.gate is not None:
            self.gate(False)

    def subscribe(self, sink: Sink, topic: str, **options: object) -> Consumer:
        self.check_active()
        consumer = self.broker.subscribe(topic, now=self.now(), **options)  # type: ignore[arg-type]
        self._sinks[consumer.id] = sink
        self._settle()
        return consumer

    def unsubscribe(self, consumer_id: int) -> None:
        self._sinks.pop(consumer_id, None)
        self.broker.unsubscribe(consumer_id, self.now())
        self._settle()

    def ack(self, consumer_id: int, codes: Iterable[str]) -> list[str]:
        unknown = self.broker.ack(consumer_id, codes, self.now())
        self._settle()
        return unknown

    def nack(self, consumer_id: int, codes: Iterable[str], requeue: bool) -> list[str]:
        unknown = self.broker.nack(consumer_id, codes, requeue, self.now())
        self._settle()
        return unknown

    def touch(self, consumer_id: int, codes: Iterable[str]) -> list[str]:
        unknown = self.broker.touch(consumer_id, codes, self.now())
        self._settle()
        return unknown

    def set_prefetch(self, consumer_id: int, prefetch: int) -> int:
        """Returns the prefetch the consumer got (``mq.max_prefetch`` at most)."""
        got = self.broker.set_prefetch(consumer_id, prefetch, self.now())
        self._settle()
        return got

    def set_room(self, consumer_id: int, room: int) -> None:
        """What the consumer's connection can queue now, in bytes (its outbox drained)."""
        self.broker.set_room(consumer_id, room, self.now())
        self._settle()

    def settle_in_group(self, topic: str, group: str | None, codes: Iterable[str], how: Settle) -> list[str]:
        self.check_active()
        unknown = self.broker.settle_in_group(topic, group, codes, how, self.now())
        self._settle()
        return unknown

    def settle_leases(
        self, topic: str, group: str | None, codes: Iterable[str], claim: str, how: Settle
    ) -> tuple[int, list[str]]:
        """``settle_in_group`` of ``codes`` and of every entry in flight under ``claim`` (when
        given), in one journal batch; returns how many were settled, and the unknown codes."""
        self.check_active()
        out = self.broker.settle_leases(topic, group, codes, claim, how, self.now())
        self._settle()
        return out

    def delete(self, code: str) -> bool:
        self.check_active()
        found = self.broker.delete(code, self.now())
        self._settle()
        return found

    def requeue_dead_letter(self, code: str) -> tuple[str, asyncio.Future[None] | None]:
        """Publish a dead letter again to the topic it died in (its ``original_topic``
        header) and settle it in its DLQ, in one journal batch; returns the new message's
        code and what to await before confirming. The republished message starts afresh
        (attempts 0) with the dead letter's payload, key, priority and producer."""
        if self.gate is not None:
            self.gate(True)
        self._check_space()
        msg = self.broker.messages.get(code)
        if msg is None:
            raise NotFoundError("no message with that code")
        origin = (msg.headers or {}).get("original_topic")
        if not msg.topic.endswith(".dlq") or not origin:
            raise BadRequestError(f"message {code} is not a dead letter (not in a .dlq topic)")
        if not msg.live:
            raise BrokerError(f"dead letter {code} is already settled")
        now = self.now()
        draft = Draft(origin, msg.data, msg.key, msg.priority, producer_id=msg.producer_id)
        (new_code,) = self.broker.publish([draft], now)  # raises (queue_full...) before anything changes
        self.broker.finish(code, REQUEUED, now)  # its end is archived as ``requeued``, not an ack
        return new_code, self._settle()

    async def pull(
        self,
        topic: str,
        group: str | None,
        max_n: int,
        lease_s: float,
        wait_s: float,
        claim: str = "",
        start: str = "",
        consumer: str = "",
    ) -> list[Entry]:
        """Lease up to ``max_n`` messages, waiting up to ``wait_s`` for the first to arrive;
        under a ``claim`` still in flight, its entries at once; ``start``: where a new group
        begins; ``consumer``: who pulls (``Broker.pull``)."""
        self.check_active()
        give_up = self.now() + wait_s
        while True:
            entries = self.broker.pull(topic, group, max_n, lease_s, self.now(), claim, start, consumer)
            self._settle()
            if entries or self.now() >= give_up:
                return entries
            grp = self.broker.pull_group(topic, group, self.now())
            event = self._waiters.setdefault(grp, asyncio.Event())
            event.clear()
            grp.waiters += 1
            try:
                woken = await self._wait(event, give_up)
            finally:
                grp.waiters -= 1
                if not grp.waiters:
                    self._waiters.pop(grp, None)
            if not woken:
                return []

    async def _wait(self, event: asyncio.Event, until: float) -> bool:
        """Wait for ``event`` until the clock reaches ``until``; True if the event came first."""
        time_up: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def expire() -> None:
            if not time_up.done():
                time_up.set_result(None)

        timer = self.clock.call_at(until, expire)
        waiting = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait((waiting, time_up), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            time_up.cancel()
        # Not ``event.is_set()``: another waiter of the group may have cleared it already.
        woken = waiting.done()
        waiting.cancel()
        return woken
