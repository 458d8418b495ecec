"""The broker's rules as one pure state machine.

Theory of operation. ``Broker`` holds every topic, group, message and
consumer of one node. Callers (the server's drivers, the tests, later the
WAL replay and the slave) feed it events with the current time ``now``
(unix seconds) and read back what to do:

* ``take_pushes()``: per consumer id, the entries to send, in order. One
  event usually produces many pushes; the driver sends them as one frame.
* ``take_changes()``: the change records (``kapok.core.changes``) to make
  durable, when journaling is on.
* ``take_woken()``: groups with long-poll waiters that got ready entries.
* ``next_deadline()``: when ``tick(now)`` must next be called.

Timers never scan: delayed messages and TTLs sit in sorted lists
(sortedcontainers), retention and ack deadlines in FIFOs per period
(``RetentionQueue``, ``DeadlineQueues``), so a tick costs only the work
that is due.

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

import sys
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from kapok.config import MqConfig
from kapok.core import changes as ch
from kapok.core.frozen import record
from kapok.core.limits import DedupWindow, RateLimiter, RetentionQueue
from kapok.core.model import CodeMaker, Consumer, Entry, Message, Status, code_prefix
from kapok.core.routing import compile_pattern
from kapok.core.timers import DeadlineQueues
from kapok.core.topics import DEFAULT_GROUP, Group, Topic
from kapok.errors import (
    BadRequestError,
    MessageTooLargeError,
    QueueFullError,
    RateLimitedError,
    SubscriptionError,
)

__all__ = ["Broker", "Draft", "Stats"]

MAX_NAME_CHARS = 255
MAX_PRIORITY = 9
_READY, _DELAYED, _INFLIGHT = Status.READY, Status.DELAYED, Status.INFLIGHT


@record  # the server builds one per published message: see kapok.core.frozen
class Draft:
    """A message as a producer asks for it, before the broker accepts it."""

    topic: str
    data: bytes
    key: str = ""
    priority: int = 0
    delay_s: float = 0.0
    deliver_at: float = 0.0  # absolute; wins over delay_s when set
    ttl_s: float = 0.0  # 0 = the topic's default
    producer_id: str = ""
    dedup_id: str = ""


@dataclass(slots=True)
class Stats:
    """Monotonic counters since start (exported as Prometheus counters)."""

    published: int = 0
    duplicates: int = 0
    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    nacked: int = 0
    timeouts: int = 0
    dead_lettered: int = 0
    expired: int = 0
    dropped: int = 0
    deleted: int = 0
    unrouted: int = 0  # published with no group to go to (pub/sub, nobody listening)
    by_topic_published: dict[str, int] = field(default_factory=dict)


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise BadRequestError(f"{kind} must be 1 to {MAX_NAME_CHARS} characters")
    if any(c.isspace() or c == "/" or not c.isprintable() for c in name):
        raise BadRequestError(f"{kind} {name!r} contains a space, a slash or a control character")
    return name


class Broker:
    def __init__(self, cfg: MqConfig, node_id: int = 0, *, journal: bool = False, first_seq: int = 1) -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.journal = journal
        self.stats = Stats()
        self.topics: dict[str, Topic] = {}
        self.consumers: dict[int, Consumer] = {}
        self.messages: dict[str, Message] = {}  # live and retained, by code
        self._seq = first_seq
        self._codes = CodeMaker()
        self._next_consumer = 1
        self._delayed: SortedList = SortedList()  # (deliver_at, seq, msg)
        self._expiring: SortedList = SortedList()  # (expire_at, seq, msg)
        self._retained: RetentionQueue[Message] = RetentionQueue(cfg.retain_consumed_max)
        self._deadlines = DeadlineQueues()
        self._dedup = DedupWindow(cfg.dedup_window_s, cfg.dedup_max_entries)
        self._limiter = RateLimiter(cfg.producer_rate, cfg.producer_burst)
        self._pushes: dict[int, list[Entry]] = {}
        self._changes: list[ch.Change] = []
        self._dirty: set[Group] = set()
        self._woken: set[Group] = set()

    @property
    def next_seq(self) -> int:
        return self._seq

    # ------------------------------------------------------------ outputs

    def take_pushes(self) -> dict[int, list[Entry]]:
        pushes, self._pushes = self._pushes, {}
        return pushes

    def take_changes(self) -> list[ch.Change]:
        changes, self._changes = self._changes, []
        return changes

    def take_woken(self) -> set[Group]:
        woken, self._woken = self._woken, set()
        return woken

    def next_deadline(self) -> float | None:
        heads = [lst[0][0] for lst in (self._delayed, self._expiring) if lst]
        heads.extend(t for t in (self._deadlines.next_due(), self._retained.next_due()) if t is not None)
        return min(heads) if heads else None

    # ------------------------------------------------------------ topics and groups

    def topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            check_name("topic", name)
            topic = self._make_topic(name)
        return topic

    def _make_topic(self, name: str) -> Topic:
        topic = self.topics[name] = Topic(name, self.cfg.topic(name))
        if topic.cfg.push_type == 1 or topic.is_dlq:
            self._group(topic, DEFAULT_GROUP, durable=True, now=0.0)
        return topic

    def _group(self, topic: Topic, name: str, *, durable: bool, now: float) -> Group:
        group = topic.groups.get(name)
        if group is None:
            group = topic.groups[name] = Group(topic, name, durable)
            topic.groups_changed()
            if durable and self.journal:
                self._changes.append(ch.GroupCreated(topic.name, name, now))
        return group

    def _drop_group(self, group: Group, now: float) -> None:
        """Forget an anonymous subscriber's private group and its copies of messages."""
        topic = group.topic
        del topic.groups[group.name]
        topic.groups_changed()
        self._dirty.discard(group)
        pending: list[Entry] = [e for q in group.queues() for e in q]
        pending.extend(group.parked)
        if topic.delayed_count:
            pending.extend(
                e for _, _, m in self._delayed if m.topic == topic.name and (e := m.entry(group.name))
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

    # ------------------------------------------------------------ publish

    def publish(self, drafts: Iterable[Draft], now: float) -> list[str]:
        """Accept a batch atomically: every draft is checked before any is stored."""
        drafts = drafts if isinstance(drafts, list) else list(drafts)
        max_bytes = self.cfg.max_message_bytes
        first_topic = drafts[0].topic if drafts else ""
        one_topic = True
        any_dedup = False
        for d in drafts:
            if len(d.data) > max_bytes:
                raise MessageTooLargeError(
                    f"message of {len(d.data)} bytes is over max_message_bytes ({max_bytes})"
                )
            if not 0 <= d.priority <= MAX_PRIORITY:
                raise BadRequestError(f"priority must be 0 to {MAX_PRIORITY}, got {d.priority}")
            if d.ttl_s < 0:
                raise BadRequestError("ttl_s must not be negative")
            if d.dedup_id:
                any_dedup = True
            if d.topic != first_topic:
                one_topic = False
        # Duplicates are answered with the original code and take no room.
        # Each slot: None (store it), a known code, or the index of an earlier
        # draft of this batch with the same dedup id.
        codes: list[str | int | None] = [None] * len(drafts)
        if any_dedup:
            per_topic = self._drop_duplicates(drafts, codes, now)
        elif one_topic:
            per_topic = {first_topic: len(drafts)} if drafts else {}
        else:
            per_topic = {}
            for d in drafts:
                per_topic[d.topic] = per_topic.get(d.topic, 0) + 1
        for name, count in per_topic.items():
            topic = self.topic(name)
            cfg = topic.cfg
            if not (cfg.max_length or cfg.max_bytes) or cfg.overflow != "reject":
                continue
            size = sum(
                len(d.data) for d, slot in zip(drafts, codes, strict=True) if slot is None and d.topic == name
            )
            too_many = cfg.max_length and topic.live_count + count > cfg.max_length
            too_big = cfg.max_bytes and topic.live_bytes + size > cfg.max_bytes
            if too_many or too_big:
                raise QueueFullError(
                    f"topic {name!r} is full (max_length {cfg.max_length}, max_bytes {cfg.max_bytes})"
                )
        if self._limiter.enabled:
            per_producer: dict[str, int] = {}
            for d in drafts:
                per_producer[d.producer_id] = per_producer.get(d.producer_id, 0) + 1
            for producer, n in per_producer.items():
                if not self._limiter.allow(producer, n, now):
                    raise RateLimitedError(
                        f"producer {producer!r} is over its publish rate of {self.cfg.producer_rate}/s"
                    )
        out: list[str] = []
        prefix = code_prefix(int(now * 1000), self.node_id)
        topics = self.topics
        store = self._store
        if not any_dedup:  # the common batch: store every draft
            out = [store(topics[d.topic], d, None, now, prefix).code for d in drafts]
        else:
            for d, slot in zip(drafts, codes, strict=True):
                if slot is None:
                    code = store(topics[d.topic], d, None, now, prefix).code
                    if d.dedup_id:
                        self._dedup.add(d.topic, d.dedup_id, code, now)
                else:
                    self.stats.duplicates += 1
                    code = out[slot] if isinstance(slot, int) else slot
                out.append(code)
        by_topic = self.stats.by_topic_published
        for name, count in per_topic.items():
            by_topic[name] = by_topic.get(name, 0) + count
            self._enforce_limits(topics[name], now)
        self._dispatch(now)
        return out

    def _drop_duplicates(
        self, drafts: list[Draft], codes: list[str | int | None], now: float
    ) -> dict[str, int]:
        """Fill ``codes`` for the drafts that are duplicates; returns the fresh drafts per topic."""
        per_topic: dict[str, int] = {}
        seen: dict[tuple[str, str], int] = {}
        for i, d in enumerate(drafts):
            if d.dedup_id:
                known: str | int | None = self._dedup.get(d.topic, d.dedup_id, now)
                if known is None:
                    known = seen.get((d.topic, d.dedup_id))
                if known is not None:
                    codes[i] = known
                    continue
                seen[(d.topic, d.dedup_id)] = i
            per_topic[d.topic] = per_topic.get(d.topic, 0) + 1
        return per_topic

    def _store(
        self, topic: Topic, d: Draft, headers: dict[str, str] | None, now: float, prefix: str
    ) -> Message:
        """Store one message; ``prefix`` is ``code_prefix`` of ``now`` (computed once per batch)."""
        seq = self._seq
        self._seq = seq + 1
        code = self._codes.code(prefix, seq)
        if d.deliver_at:
            deliver_at = d.deliver_at
        elif d.delay_s > 0:
            deliver_at = now + d.delay_s
        else:
            deliver_at = now
        ttl = d.ttl_s or topic.cfg.ttl_s
        expire_at = now + ttl if ttl > 0 else 0.0
        # Keys repeat across messages but arrive as fresh strings: share one copy.
        key = sys.intern(d.key) if d.key else ""
        delayed = deliver_at > now
        status = _DELAYED if delayed else _READY
        groups = topic.group_list
        msg = Message(
            seq, code, topic.name, d.data, key, d.priority, now, deliver_at, expire_at, d.producer_id,
            d.dedup_id, headers, group=groups[0] if groups else topic.no_group(),
            status=status if groups else Status.DROPPED, own_code=True,
        )  # fmt: skip
        self.messages[code] = msg
        self.stats.published += 1
        if len(groups) > 1:
            msg.route(groups[1:], status)  # the message itself is the entry of the first
        if groups and not delayed:
            for entry in (msg, *msg.more) if msg.more else (msg,):
                group = entry.group
                queue = group.ready[d.priority] or group.queue(d.priority)
                queue.append(entry)
                group.ready_count += 1
                self._dirty.add(group)
        if self.journal:
            self._changes.append(
                ch.Published(
                    seq, code, topic.name, d.data, key, d.priority, now, deliver_at, expire_at,
                    d.producer_id, d.dedup_id, headers, topic.durable,
                )
            )  # fmt: skip
        if not groups:
            self.stats.unrouted += 1
            self._complete(msg, topic, now, counted=False)
            return msg
        topic.live_count += 1
        topic.live_bytes += len(d.data)
        if topic.order is not None:
            topic.order.append(msg)
        if delayed:
            topic.delayed_count += len(groups)
            self._delayed.add((deliver_at, seq, msg))
        if expire_at:
            self._expiring.add((expire_at, seq, msg))
        return msg

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
    ) -> Consumer:
        """Add a consumer; ``group=None`` joins the p2p default group or, on a
        pub/sub topic, a private group that lives as long as the subscription."""
        topic = self.topic(topic_name)
        prefetch = self.cfg.prefetch if prefetch is None else prefetch
        if not 1 <= prefetch <= 1_000_000:
            raise SubscriptionError(f"prefetch must be 1 to 1000000, got {prefetch}")
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

    def set_prefetch(self, consumer_id: int, prefetch: int, now: float) -> None:
        if not 1 <= prefetch <= 1_000_000:
            raise SubscriptionError(f"prefetch must be 1 to 1000000, got {prefetch}")
        consumer = self._consumer(consumer_id)
        consumer.prefetch = prefetch
        self._dirty.add(consumer.group)
        self._dispatch(now)

    def _consumer(self, consumer_id: int) -> Consumer:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            raise SubscriptionError(f"no subscription {consumer_id}")
        return consumer

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
            self._deadlines.prune(consumer.ack_timeout_s)
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
                self._deadlines.add(entry.deadline, consumer.ack_timeout_s, entry)
        return unknown

    def _held_in_group(self, topic: str, group: str, code: str) -> Entry | None:
        msg = self.messages.get(code)
        entry = msg.entry(group) if msg is not None and msg.topic == topic else None
        if entry is None or entry.status is not Status.INFLIGHT or entry.consumer is None:
            return None
        return entry

    def settle_in_group(
        self, topic: str, group: str, codes: Iterable[str], how: str, now: float
    ) -> list[str]:
        """Ack (``how="ack"``), requeue (``"requeue"``) or reject leased messages by group.

        Used by pull mode, where the lease is held by the group rather than by a
        connection; returns the codes that were not in flight in that group.
        """
        unknown: list[str] = []
        for code in codes:
            entry = self._held_in_group(topic, group, code)
            if entry is None:
                unknown.append(code)
                continue
            assert entry.consumer is not None
            entry.consumer.held.pop(code, None)
            self._dirty.add(entry.group)
            if how == "ack":
                self.stats.acked += 1
                self._finish(entry, Status.CONSUMED, "ack", now)
            elif how == "requeue":
                self.stats.nacked += 1
                self._requeue(entry, "nack", now)
            else:
                self.stats.nacked += 1
                self._dead_letter(entry, "rejected", now)
        self._dispatch(now)
        return unknown

    # ------------------------------------------------------------ pull mode

    def pull(
        self, topic_name: str, group_name: str | None, max_n: int, lease_s: float, now: float
    ) -> list[Entry]:
        """Lease up to ``max_n`` ready messages of a durable group for ``lease_s`` seconds."""
        group = self.pull_group(topic_name, group_name, now)
        lessee = group.pull
        if lessee is None:
            cid = self._next_consumer
            self._next_consumer += 1
            lessee = group.pull = Consumer(cid, group, "pull", None, 0, False, is_pull=True, since=now)
            self.consumers[cid] = lessee
            group.consumers.append(lessee)
            group.consumers_changed()
        lessee.ack_timeout_s = lease_s
        lessee.prefetch = len(lessee.held) + max_n
        group.unpark()
        self._dirty.add(group)
        self._dispatch(now)
        lessee.prefetch = 0
        return self._pushes.pop(lessee.id, [])

    def pull_group(self, topic_name: str, group_name: str | None, now: float) -> Group:
        topic = self.topic(topic_name)
        if group_name is None:
            if DEFAULT_GROUP not in topic.groups:
                raise SubscriptionError(f"topic {topic_name!r} is pub/sub: pulling needs a named group")
            group_name = DEFAULT_GROUP
        check_name("group", group_name)
        if group_name.startswith("~"):
            raise SubscriptionError("group names starting with '~' are reserved")
        return self._group(topic, group_name, durable=True, now=now)

    # ------------------------------------------------------------ console operations

    def delete(self, code: str, now: float) -> bool:
        msg = self.messages.pop(code, None)
        if msg is None:
            return False
        if msg.live:
            self._end_message(msg, Status.DROPPED, "deleted", now)
        # A retained copy leaves the retention queue lazily (see tick).
        self.stats.deleted += 1
        if self.journal:
            self._changes.append(ch.MessageDeleted(code, now))
        self._dispatch(now)
        return True

    # ------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        """Do everything that is due at ``now``: releases, timeouts, expiry, retention."""
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, _, msg = delayed.pop(0)
            topic = self.topics[msg.topic]
            for entry in msg.all_entries():
                if entry.status is Status.DELAYED:
                    topic.delayed_count -= 1
                    entry.group.push_ready(entry)
                    self._dirty.add(entry.group)
        timed_out = self._deadlines.pop_due(now)
        for entry in timed_out:
            consumer = entry.consumer
            assert consumer is not None  # pop_due returns only entries still in flight
            consumer.held.pop(entry.msg.code, None)
            entry.last_consumer_id = consumer.id
            entry.consumer = None
        # Requeued to the front, so walk backwards to keep delivery order.
        for entry in reversed(timed_out):
            self.stats.timeouts += 1
            self._requeue(entry, "timeout", now)
        expiring = self._expiring
        while expiring and expiring[0][0] <= now:
            _, _, msg = expiring.pop(0)
            if msg.live:
                self._end_message(msg, Status.EXPIRED, "ttl", now)
        messages = self.messages
        for msg in self._retained.pop_due(now):
            if messages.get(msg.code) is msg:  # not deleted meanwhile
                del messages[msg.code]
            msg.forget()
        self._dedup.expire(now)
        self._dispatch(now)

    # ------------------------------------------------------------ internals

    def _dispatch(self, now: float) -> None:
        dirty = self._dirty
        while dirty:
            group = dirty.pop()
            if group.ready_count:
                if group.waiters:
                    self._woken.add(group)
                if group.consumers:
                    self._deliver(group, now)

    def _deliver(self, group: Group, now: float) -> None:
        """Hand ready entries of ``group`` to its consumers, as far as their credit goes."""
        pushes = self._pushes
        changes = self._changes if self.journal else None
        consumer: Consumer | None = None
        out: list[Entry] = []
        held: dict[str, Entry] = {}
        deadlines: deque[float] | None = None
        timed: deque[Entry] | None = None
        deadline = 0.0
        delivered = redelivered = 0
        for entry, c in group.assign():
            if c is not consumer:  # one deadline and one push list per consumer and call
                consumer = c
                held = c.held
                out = pushes.get(c.id) or pushes.setdefault(c.id, [])
                timeout = c.ack_timeout_s
                deadlines, timed = self._deadlines.queue(timeout) if timeout else (None, None)
                deadline = now + timeout
            entry.status = _INFLIGHT
            attempts = entry.attempts = entry.attempts + 1
            entry.last_delivered_at = now
            entry.consumer = c
            msg = entry.msg
            held[msg.code] = entry
            if deadlines is not None and timed is not None:
                entry.deadline = deadline
                deadlines.append(deadline)
                timed.append(entry)
            out.append(entry)
            c.delivered += 1
            delivered += 1
            if attempts > 1:
                redelivered += 1
            if changes is not None:
                changes.append(ch.Delivered(msg.code, msg.topic, group.name, attempts, now))
        self.stats.delivered += delivered
        self.stats.redelivered += redelivered

    def _requeue(self, entry: Entry, reason: str, now: float) -> None:
        topic = entry.group.topic
        limit = topic.cfg.max_deliveries
        if limit and not topic.is_dlq and entry.attempts >= limit:
            self._dead_letter(entry, "max_deliveries", now)
            return
        entry.group.push_ready(entry, front=True)
        self._dirty.add(entry.group)
        if self.journal:
            self._changes.append(ch.Requeued(entry.msg.code, entry.msg.topic, entry.group.name, reason, now))

    def _dead_letter(self, entry: Entry, reason: str, now: float) -> None:
        msg = entry.msg
        topic = entry.group.topic
        self._finish(entry, Status.DEAD, reason, now)
        self.stats.dead_lettered += 1
        if topic.is_dlq:
            return  # a dead letter of a dead letter stays here, marked dead
        headers = {
            "original_code": msg.code,
            "original_topic": msg.topic,
            "group": entry.group.name,
            "reason": reason,
            "attempts": str(entry.attempts),
        }
        # Not ``self.topic()``: the name may be 4 characters over the limit for user topics.
        dlq_name = topic.name + ".dlq"
        dlq = self.topics.get(dlq_name) or self._make_topic(dlq_name)
        draft = Draft(dlq.name, msg.data, msg.key, msg.priority, producer_id=msg.producer_id)
        self._store(dlq, draft, headers, now, code_prefix(int(now * 1000), self.node_id))
        by_topic = self.stats.by_topic_published
        by_topic[dlq_name] = by_topic.get(dlq_name, 0) + 1

    def _finish(self, entry: Entry, status: Status, reason: str, now: float) -> None:
        entry.status = status
        entry.deadline = now  # = settled_at, see Entry
        entry.consumer = None
        msg = entry.msg
        if self.journal:
            self._changes.append(ch.Settled(msg.code, msg.topic, entry.group.name, status.text, reason, now))
        if msg.status.final and (not msg.more or msg.settled()):
            self._complete(msg, entry.group.topic, now)

    def _end_message(self, msg: Message, status: Status, reason: str, now: float) -> None:
        """Finish every open entry of ``msg`` at once (TTL, overflow, console delete)."""
        if status is Status.EXPIRED:
            self.stats.expired += 1
        elif reason == "overflow":
            self.stats.dropped += 1
        for entry in msg.all_entries():
            st = entry.status
            if st.final:
                continue
            if st is Status.READY:
                entry.group.ready_count -= 1  # stays queued; skipped when reached
            elif st is Status.INFLIGHT and entry.consumer is not None:
                entry.consumer.held.pop(msg.code, None)
                self._dirty.add(entry.group)
            elif st is Status.DELAYED:
                entry.group.topic.delayed_count -= 1
            if status is Status.EXPIRED and self.cfg.expired == "dead_letter":
                self._dead_letter(entry, "expired", now)
            else:
                self._finish(entry, status, reason, now)
        self._delayed.discard((msg.deliver_at, msg.seq, msg))

    def _complete(self, msg: Message, topic: Topic, now: float, counted: bool = True) -> None:
        msg.finished_at = now
        if counted:
            topic.live_count -= 1
            topic.live_bytes -= len(msg.data)
        if msg.expire_at:
            self._expiring.discard((msg.expire_at, msg.seq, msg))
        retain = topic.cfg.retain_consumed_s
        if retain > 0 and self.cfg.retain_consumed_max > 0:
            self._retained.add(now + retain, retain, msg)
        elif self.messages.pop(msg.code, None) is not None:
            msg.forget()

    # ------------------------------------------------------------ views

    def iter_messages(self) -> Iterator[Message]:
        return iter(self.messages.values())
