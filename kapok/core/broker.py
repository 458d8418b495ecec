"""The broker's rules as one pure state machine.

Theory of operation. ``Broker`` holds every topic, group, message and
consumer of one node. Callers (the server's drivers, the tests, the WAL
replay, a replication slave) feed it events with the current time ``now``
(unix seconds) and read back what to do:

* ``take_pushes()``: per consumer id, the entries to send, in order. One
  event usually produces many pushes; the driver sends them as one frame.
* ``take_changes()``: the change records (``kapok.core.changes``) to make
  durable, when journaling is on.
* ``take_woken()``: groups with long-poll waiters that got ready entries.
* ``next_deadline()``: when ``tick(now)`` must next be called.

Two components sit beside the state table: ``Admission`` decides whether
a publish batch may be stored (validation, duplicates, quotas, rate limit),
and ``Timers`` holds every due time (delayed releases, TTLs, ack deadlines,
retention) without ever scanning, so a tick costs only the work that is
due. Recovery and replication rebuild state through the ``restore_*``,
``resume`` and ``retire`` seams (``kapok.core.replay``).

The class is built in layers, one module each, every layer using only
those below it: ``kapok.core.state`` (the state table and delivery),
``kapok.core.lifecycle`` (store, requeue, dead-letter, settle, complete),
``kapok.core.leases`` (pull mode) and ``kapok.core.restore`` (the seams
above); this module adds what clients ask for (publish, subscribe, ack,
the console's operations) and ``tick``.

The hot path is publish -> deliver -> ack of plain messages, a few
microseconds each: per-batch work (code prefix, topic lookups, counters,
the deadline of a consumer's deliveries) is hoisted out of the
per-message loops, which is why some of them read less plainly than the
rest.

Invariants (checked by the stateful test): a message is in flight to at
most one consumer of a group; a consumer never holds more than its
prefetch; a delayed entry is never delivered before ``deliver_at``; after
``max_deliveries`` deliveries an entry is dead-lettered to ``<topic>.dlq``;
nothing is forgotten until it is final (consumed, dead, expired, dropped).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kapok.core import changes as ch
from kapok.core.codes import code_prefix
from kapok.core.consumers import NO_ROOM_LIMIT, Consumer
from kapok.core.leases import PullMode, Settle
from kapok.core.model import Draft, Entry, Message, Status
from kapok.core.restore import Recovery
from kapok.core.routing import compile_pattern
from kapok.core.state import Stats, check_name, small_route
from kapok.core.topics import DEFAULT_GROUP, Group, Topic
from kapok.core.waiting import Waiting
from kapok.errors import SubscriptionError

__all__ = ["Broker", "Draft", "Settle", "Stats", "check_name", "small_route"]


class Broker(PullMode, Recovery):
    """A node's broker: the operations its drivers call (see the module's docstring)."""

    # ------------------------------------------------------------ publish

    def publish(self, drafts: Iterable[Draft], now: float) -> list[str]:
        """Accept a batch atomically: ``Admission`` checks every draft before any is stored."""
        drafts = drafts if isinstance(drafts, list) else list(drafts)
        admitted = self.admission.admit(drafts, self.topic, now, self.backlog_bytes)
        prefix = code_prefix(int(now * 1000), self.node_id)
        topics = self.topics
        store = self._store
        slots = admitted.slots
        if slots is None:  # the common batch: no dedup ids, store every draft
            out = [store(topics[d.topic], d, d.headers, now, prefix) for d in drafts]
        else:
            out = []
            remembered = []
            for d, slot in zip(drafts, slots, strict=True):
                if slot is None:
                    code = store(topics[d.topic], d, d.headers, now, prefix)
                    if d.dedup_id:
                        remembered.append(((d.topic, d.dedup_id), code))
                else:
                    self.stats.duplicates += 1
                    code = out[slot] if isinstance(slot, int) else slot
                out.append(code)
            self.admission.dedup.add_many(remembered, now)
        for name, count in admitted.per_topic.items():
            topic = topics[name]
            topic.published += count
            self._enforce_limits(topic, now)
        self._dispatch(now)
        return out

    def _enforce_limits(self, topic: Topic, now: float) -> None:
        cfg = topic.cfg
        if cfg.overflow != "drop_oldest":
            return
        while (cfg.max_length and topic.live_count > cfg.max_length) or (
            cfg.max_bytes and topic.live_bytes > cfg.max_bytes
        ):
            oldest = topic.oldest_live()
            if oldest is None:
                break
            self._end_message(oldest, Status.DROPPED, "overflow", now)
        topic.compact_order()

    # ------------------------------------------------------------ consumers

    def subscribe(
        self,
        topic_name: str,
        *,
        now: float,
        group: str | None = None,
        key: str | None = None,
        prefetch: int | None = None,
        auto_ack: bool = False,
        weight: int = 1,
        name: str = "",
        room: int = NO_ROOM_LIMIT,
    ) -> Consumer:
        """Add a consumer; ``group=None`` joins the p2p default group or, on a
        pub/sub topic, a private group that lives as long as the subscription."""
        topic = self.topic(topic_name)
        prefetch = self._capped(self.settings.prefetch if prefetch is None else prefetch)
        if not 1 <= weight <= 1000:
            raise SubscriptionError(f"weight must be 1 to 1000, got {weight}")
        pattern = compile_pattern(key)
        cid = self._next_consumer
        self._next_consumer += 1
        if group is not None:
            check_name("group", group)
            if group.startswith("~"):
                raise SubscriptionError("group names starting with '~' are reserved")
            grp = self._group(topic, group, durable=True, now=now)
        elif topic.cfg.push_type == 1 or topic.is_dlq:
            grp = self._group(topic, DEFAULT_GROUP, durable=True, now=now)
        else:
            grp = self._group(topic, f"~{cid}", durable=False, now=now)
        timeout = 0.0 if auto_ack else topic.cfg.ack_timeout_s
        consumer = Consumer(cid, grp, name, pattern, prefetch, auto_ack, weight, timeout, since=now)
        consumer.room = room
        self.consumers[cid] = consumer
        grp.consumers.append(consumer)
        grp.consumers_changed()
        self._dirty.add(grp)
        self._dispatch(now)
        return consumer

    def unsubscribe(self, consumer_id: int, now: float) -> None:
        """Remove a consumer; what it held goes back to the front of the queue, in order."""
        consumer = self.consumers.pop(consumer_id, None)
        if consumer is None:
            return
        group = consumer.group
        group.consumers.remove(consumer)
        held = list(consumer.held.values())
        consumer.held.clear()
        if not group.durable and not group.consumers:
            for entry in held:
                group.push_ready(entry)
            self._drop_group(group, now)
            return
        for entry in reversed(held):
            self._requeue(entry, "disconnect", now)
        group.consumers_changed()
        self._dispatch(now)

    def _drop_group(self, group: Group, now: float) -> None:
        """Forget an anonymous subscriber's private group and its copies of messages."""
        topic = group.topic
        del topic.groups[group.name]
        topic.groups_changed()
        self._dirty.discard(group)
        pending: list[Entry] = [e.resolve() if type(e) is Waiting else e for q in group.queues() for e in q]
        pending.extend(group.parked)
        if topic.delayed_count:
            pending.extend(
                e
                for m in self.timers.delayed_messages()
                if m.topic == topic.name and (e := m.entry(group.name))
            )
        for entry in pending:
            msg = entry.msg
            if msg.remove_entry(group.name) is None:
                continue
            if entry.status is Status.DELAYED:
                topic.delayed_count -= 1
            if not entry.status.final:
                entry.status = Status.DROPPED
                if msg.settled():
                    self._complete(msg, topic, now)

    def set_prefetch(self, consumer_id: int, prefetch: int, now: float) -> int:
        """Change a consumer's credit; returns the prefetch it got (at most ``max_prefetch``)."""
        prefetch = self._capped(prefetch)
        consumer = self._consumer(consumer_id)
        consumer.prefetch = prefetch
        self._dirty.add(consumer.group)
        self._dispatch(now)
        return prefetch

    def _capped(self, prefetch: int) -> int:
        if not 1 <= prefetch <= 1_000_000:
            raise SubscriptionError(f"prefetch must be 1 to 1000000, got {prefetch}")
        return min(prefetch, self.settings.max_prefetch)

    def set_room(self, consumer_id: int, room: int, now: float) -> None:
        """What the consumer's send queue can take now, in bytes (its driver says so as
        the queue drains); each delivery uses its payload + ``PUSH_OVERHEAD_BYTES``."""
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            return
        starved = consumer.room <= 0
        consumer.room = room
        if starved and room > 0:
            self._dirty.add(consumer.group)
            self._dispatch(now)

    # ------------------------------------------------------------ acks

    def ack(self, consumer_id: int, codes: Iterable[str], now: float) -> list[str]:
        """Settle held messages as consumed; returns the codes this consumer did not hold."""
        consumer = self._consumer(consumer_id)
        unknown: list[str] = []
        held = consumer.held
        finish = self._finish
        consumed = Status.CONSUMED
        before = len(held)
        for code in codes:
            entry = held.pop(code, None)
            if entry is None:
                unknown.append(code)
            else:
                finish(entry, consumed, "ack", now)
        acked = before - len(held)
        consumer.acked += acked
        self.stats.acked += acked
        if consumer.ack_timeout_s:
            self.timers.deadlines.prune(consumer.ack_timeout_s)
        self._dirty.add(consumer.group)
        self._dispatch(now)
        return unknown

    def nack(self, consumer_id: int, codes: Iterable[str], requeue: bool, now: float) -> list[str]:
        """Give messages back: to the queue (``requeue``) or straight to the dead-letter topic."""
        consumer = self._consumer(consumer_id)
        unknown: list[str] = []
        for code in codes:
            entry = consumer.held.pop(code, None)
            if entry is None:
                unknown.append(code)
                continue
            self.stats.nacked += 1
            if requeue:
                self._requeue(entry, "nack", now)
            else:
                self._dead_letter(entry, "rejected", now)
        self._dirty.add(consumer.group)
        self._dispatch(now)
        return unknown

    def touch(self, consumer_id: int, codes: Iterable[str], now: float) -> list[str]:
        """Push the ack deadline of held messages one ack timeout into the future."""
        consumer = self._consumer(consumer_id)
        unknown: list[str] = []
        for code in codes:
            entry = consumer.held.get(code)
            if entry is None:
                unknown.append(code)
            elif consumer.ack_timeout_s:
                entry.deadline = now + consumer.ack_timeout_s
                self.timers.deadlines.add(entry.deadline, consumer.ack_timeout_s, entry)
        return unknown

    # ------------------------------------------------------------ console operations

    def delete(self, code: str, now: float) -> bool:
        msg = self.messages.pop(code)
        if msg is None:
            return False
        if msg.live:
            self._end_message(msg, Status.DROPPED, ch.DELETED, now)
        # A retained copy leaves the retention queue lazily (see tick).
        self.stats.deleted += 1
        if self.journal:
            self._changes.append(ch.MessageDeleted(code, now, msg.topic))
        self._dispatch(now)
        return True

    def finish(self, code: str, reason: str, now: float) -> bool:
        """Settle every open entry of a live message as consumed, wherever it is (queued,
        delayed or in flight); the console's requeue from a DLQ settles the dead letter it
        published again (reason ``changes.REQUEUED``: archived as ``requeued``, not as an
        ack). False: no live message with that code."""
        msg = self.messages.get(code)
        if msg is None or not msg.live:
            return False
        self._end_message(msg, Status.CONSUMED, reason, now)
        self._dispatch(now)
        return True

    # ------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        """Do everything that is due at ``now``: releases, timeouts, expiry, retention."""
        timers = self.timers
        for msg in timers.pop_released(now):
            topic = self.topics[msg.topic]
            for entry in msg.all_entries():
                if entry.status is Status.DELAYED:
                    topic.delayed_count -= 1
                    entry.group.push_ready(entry)
                    self._dirty.add(entry.group)
        timed_out = timers.pop_timed_out(now)
        for entry in timed_out:
            consumer = entry.consumer
            assert consumer is not None  # pop_due returns only entries still in flight
            consumer.held.pop(entry.msg.code, None)
            entry.last_consumer_id = consumer.id
            entry.consumer = None
            claims = entry.group.claims
            if claims is not None:
                self._unclaim(claims, entry)
        # Requeued to the front, so walk backwards to keep delivery order.
        for entry in reversed(timed_out):
            self.stats.timeouts += 1
            self._requeue(entry, "timeout", now)
        for msg in timers.pop_expired(now):
            if msg.live:
                self._end_message(msg, Status.EXPIRED, "ttl", now)
        discard = self.messages.discard
        for msg in timers.pop_forgotten(now):
            discard(msg)  # unless deleted meanwhile
            msg.forget()
        self.admission.dedup.expire(now)
        self._dispatch(now)

    def dispatch(self, now: float) -> None:
        """Deliver what became deliverable (after ``resume``)."""
        self._dispatch(now)

    # ------------------------------------------------------------ views

    def iter_messages(self) -> Iterator[Message]:
        return self.messages.values()
