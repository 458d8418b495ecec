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

Timers never scan: delayed messages, TTLs and retention sit in sorted lists
(sortedcontainers) and ack deadlines in a heap with lazy deletion, so a
tick costs only the work that is due.

Invariants (checked by the stateful test): a message is in flight to at
most one consumer of a group; a consumer never holds more than its
prefetch; a delayed entry is never delivered before ``deliver_at``; after
``max_deliveries`` deliveries an entry is dead-lettered to ``<topic>.dlq``;
nothing is forgotten until it is final (consumed, dead, expired, dropped).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from kapok.config import MqConfig
from kapok.core import changes as ch
from kapok.core.limits import DedupWindow, RateLimiter, RetentionQueue
from kapok.core.model import Consumer, Entry, Message, Status, make_code
from kapok.core.routing import compile_pattern
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


@dataclass(frozen=True, slots=True)
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
        self._next_consumer = 1
        self._delayed: SortedList = SortedList()  # (deliver_at, seq, msg)
        self._expiring: SortedList = SortedList()  # (expire_at, seq, msg)
        self._retained: RetentionQueue[Message] = RetentionQueue(cfg.retain_consumed_max)
        self._deadlines: list[tuple[float, int, Entry]] = []  # heap, lazily pruned
        self._heap_ties = itertools.count()  # unique tie-breaker: entries never get compared
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
        if self._deadlines:
            heads.append(self._deadlines[0][0])
        retained = self._retained.next_due()
        if retained is not None:
            heads.append(retained)
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
        pending: list[Entry] = [e for q in group.ready for e in q]
        pending.extend(group.parked)
        if topic.delayed_count:
            pending.extend(
                e for _, _, m in self._delayed if m.topic == topic.name and (e := m.entries.get(group.name))
            )
        for entry in pending:
            msg = entry.msg
            if msg.entries.pop(group.name, None) is None:
                continue
            if entry.status is Status.DELAYED:
                topic.delayed_count -= 1
            if not entry.status.final:
                entry.status = Status.DROPPED
                msg.open_entries -= 1
                if not msg.open_entries:
                    self._complete(msg, now)

    # ------------------------------------------------------------ publish

    def publish(self, drafts: Iterable[Draft], now: float) -> list[str]:
        """Accept a batch atomically: every draft is checked before any is stored."""
        drafts = list(drafts)
        max_bytes = self.cfg.max_message_bytes
        per_producer: dict[str, int] = {}
        for d in drafts:
            if len(d.data) > max_bytes:
                raise MessageTooLargeError(
                    f"message of {len(d.data)} bytes is over max_message_bytes ({max_bytes})"
                )
            if not 0 <= d.priority <= MAX_PRIORITY:
                raise BadRequestError(f"priority must be 0 to {MAX_PRIORITY}, got {d.priority}")
            if d.ttl_s < 0:
                raise BadRequestError("ttl_s must not be negative")
            per_producer[d.producer_id] = per_producer.get(d.producer_id, 0) + 1
        # Duplicates are answered with the original code and take no room.
        # Each slot: None (store it), a known code, or the index of an earlier
        # draft of this batch with the same dedup id.
        codes: list[str | int | None] = []
        fresh: dict[str, list[Draft]] = {}
        seen: dict[tuple[str, str], int] = {}
        for i, d in enumerate(drafts):
            if d.dedup_id:
                known: str | int | None = self._dedup.get(d.topic, d.dedup_id, now)
                if known is None:
                    known = seen.get((d.topic, d.dedup_id))
                if known is not None:
                    codes.append(known)
                    continue
                seen[(d.topic, d.dedup_id)] = i
            codes.append(None)
            fresh.setdefault(d.topic, []).append(d)
        for name, batch in fresh.items():
            topic = self.topic(name)
            cfg = topic.cfg
            too_many = cfg.max_length and topic.live_count + len(batch) > cfg.max_length
            too_big = cfg.max_bytes and topic.live_bytes + sum(len(d.data) for d in batch) > cfg.max_bytes
            if (too_many or too_big) and cfg.overflow == "reject":
                raise QueueFullError(
                    f"topic {name!r} is full (max_length {cfg.max_length}, max_bytes {cfg.max_bytes})"
                )
        if self._limiter.enabled:
            for producer, n in per_producer.items():
                if not self._limiter.allow(producer, n, now):
                    raise RateLimitedError(
                        f"producer {producer!r} is over its publish rate of {self.cfg.producer_rate}/s"
                    )
        out: list[str] = []
        for d, slot in zip(drafts, codes, strict=True):
            if slot is None:
                code = self._store(self.topic(d.topic), d, None, now).code
                if d.dedup_id:
                    self._dedup.add(d.topic, d.dedup_id, code, now)
            else:
                self.stats.duplicates += 1
                code = out[slot] if isinstance(slot, int) else slot
            out.append(code)
        for name in fresh:
            self._enforce_limits(self.topics[name], now)
        self._dispatch(now)
        return out

    def _store(self, topic: Topic, d: Draft, headers: dict[str, str] | None, now: float) -> Message:
        seq = self._seq
        self._seq += 1
        deliver_at = d.deliver_at or (now + d.delay_s if d.delay_s > 0 else now)
        ttl = d.ttl_s or topic.cfg.ttl_s
        code = make_code(int(now * 1000), self.node_id, seq)
        expire_at = now + ttl if ttl > 0 else 0.0
        msg = Message(
            seq, code, topic.name, d.data, d.key, d.priority, now, deliver_at, expire_at, d.producer_id,
            d.dedup_id, headers,
        )  # fmt: skip
        self.messages[code] = msg
        stats = self.stats
        stats.published += 1
        by_topic = stats.by_topic_published
        by_topic[topic.name] = by_topic.get(topic.name, 0) + 1
        delayed = deliver_at > now
        status = Status.DELAYED if delayed else Status.READY
        entries = msg.entries
        for group in topic.groups.values():
            entry = Entry(msg, group, status)
            entries[group.name] = entry
            if not delayed:
                group.push_ready(entry)
                self._dirty.add(group)
        msg.open_entries = len(entries)
        if self.journal:
            self._changes.append(
                ch.Published(
                    seq, code, topic.name, d.data, d.key, d.priority, now, deliver_at, expire_at,
                    d.producer_id, d.dedup_id, headers, topic.durable_names(),
                )
            )  # fmt: skip
        if not msg.entries:
            stats.unrouted += 1
            self._complete(msg, now, counted=False)
            return msg
        topic.live_count += 1
        topic.live_bytes += len(msg.data)
        topic.order.append(msg)
        if delayed:
            topic.delayed_count += len(msg.entries)
            self._delayed.add((deliver_at, seq, msg))
        if msg.expire_at:
            self._expiring.add((msg.expire_at, seq, msg))
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
        for code in codes:
            entry = held.pop(code, None)
            if entry is None:
                unknown.append(code)
                continue
            consumer.acked += 1
            self.stats.acked += 1
            self._finish(entry, Status.CONSUMED, "ack", now)
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
                heapq.heappush(self._deadlines, (entry.deadline, next(self._heap_ties), entry))
        return unknown

    def _held_in_group(self, topic: str, group: str, code: str) -> Entry | None:
        msg = self.messages.get(code)
        entry = msg.entries.get(group) if msg is not None and msg.topic == topic else None
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
            for entry in msg.entries.values():
                if entry.status is Status.DELAYED:
                    topic.delayed_count -= 1
                    entry.group.push_ready(entry)
                    self._dirty.add(entry.group)
        heap = self._deadlines
        timed_out: list[Entry] = []
        while heap and heap[0][0] <= now:
            deadline, _, entry = heapq.heappop(heap)
            consumer = entry.consumer
            if entry.status is not Status.INFLIGHT or entry.deadline != deadline or consumer is None:
                continue  # acked, touched or requeued since: a stale heap item
            consumer.held.pop(entry.msg.code, None)
            entry.last_consumer_id = consumer.id
            entry.consumer = None  # a second heap item with the same deadline is now stale too
            timed_out.append(entry)
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
        self._dedup.expire(now)
        self._dispatch(now)

    # ------------------------------------------------------------ internals

    def _dispatch(self, now: float) -> None:
        dirty = self._dirty
        while dirty:
            group = dirty.pop()
            if group.waiters and group.ready_count:
                self._woken.add(group)
            for entry, consumer in group.assign():
                self._deliver(entry, consumer, now)

    def _deliver(self, entry: Entry, consumer: Consumer, now: float) -> None:
        entry.status = Status.INFLIGHT
        if entry.attempts:
            self.stats.redelivered += 1
        entry.attempts += 1
        entry.last_delivered_at = now
        entry.consumer = consumer
        consumer.delivered += 1
        consumer.held[entry.msg.code] = entry
        self.stats.delivered += 1
        if consumer.ack_timeout_s:
            entry.deadline = now + consumer.ack_timeout_s
            heapq.heappush(self._deadlines, (entry.deadline, next(self._heap_ties), entry))
        pushes = self._pushes.get(consumer.id)
        if pushes is None:
            self._pushes[consumer.id] = [entry]
        else:
            pushes.append(entry)
        if self.journal:
            self._changes.append(
                ch.Delivered(entry.msg.code, entry.msg.topic, entry.group.name, entry.attempts, now)
            )

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
        self._store(dlq, draft, headers, now)

    def _finish(self, entry: Entry, status: Status, reason: str, now: float) -> None:
        entry.status = status
        entry.finished_at = now
        entry.consumer = None
        msg = entry.msg
        if self.journal:
            self._changes.append(ch.Settled(msg.code, msg.topic, entry.group.name, status.value, reason, now))
        msg.open_entries -= 1
        if not msg.open_entries:
            self._complete(msg, now)

    def _end_message(self, msg: Message, status: Status, reason: str, now: float) -> None:
        """Finish every open entry of ``msg`` at once (TTL, overflow, console delete)."""
        if status is Status.EXPIRED:
            self.stats.expired += 1
        elif reason == "overflow":
            self.stats.dropped += 1
        for entry in list(msg.entries.values()):
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

    def _complete(self, msg: Message, now: float, counted: bool = True) -> None:
        msg.finished_at = now
        topic = self.topics[msg.topic]
        if counted:
            topic.live_count -= 1
            topic.live_bytes -= len(msg.data)
        if msg.expire_at:
            self._expiring.discard((msg.expire_at, msg.seq, msg))
        retain = topic.cfg.retain_consumed_s
        if retain > 0 and self.cfg.retain_consumed_max > 0:
            self._retained.add(now + retain, retain, msg)
        else:
            self.messages.pop(msg.code, None)

    # ------------------------------------------------------------ views

    def iter_messages(self) -> Iterator[Message]:
        return iter(self.messages.values())
