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

import enum
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kapok.core import changes as ch
from kapok.core.admission import MESSAGE_OVERHEAD_BYTES, Admission
from kapok.core.claims import Claim, Claims
from kapok.core.index import MessageIndex
from kapok.core.model import (
    NO_ROOM_LIMIT,
    PUSH_OVERHEAD_BYTES,
    SEQ_MASK,
    CodeBlock,
    CodeMaker,
    Consumer,
    Draft,
    Entry,
    GroupEntry,
    Message,
    Status,
    Waiting,
    code_prefix,
)
from kapok.core.routing import compile_pattern
from kapok.core.settings import BrokerSettings
from kapok.core.timers import Timers
from kapok.core.topics import DEFAULT_GROUP, Group, Topic
from kapok.errors import BadRequestError, NotFoundError, SubscriptionError

__all__ = ["Broker", "Draft", "Settle", "Stats", "small_route"]

MAX_NAME_CHARS = 255
# Up to this many messages ready in its group, a message published keeps its code whole (at
# most ~1 MB a group): it is soon delivered, and its code read again (push, ack, records).
# Past it, a plain one is stored as a ``Waiting`` (``kapok.core.model``).
KEEP_CODES_QUEUED = 10_000
_READY, _DELAYED, _INFLIGHT = Status.READY, Status.DELAYED, Status.INFLIGHT


def small_route(topic: Topic, groups: tuple[Group, ...]) -> bool:
    """A plain message routed so (no key, headers, priority, delay or TTL) may wait as a
    ``Waiting``: one listed group, in a topic that keeps no publish order (drop_oldest)."""
    return len(groups) == 1 and topic.order is None and not groups[0].unlisted


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


class Settle(enum.Enum):
    """How ``settle_in_group`` settles a leased message."""

    ACK = "ack"
    REQUEUE = "requeue"  # a nack that gives the message back to the queue
    REJECT = "reject"  # a nack that dead-letters it


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise BadRequestError(f"{kind} must be 1 to {MAX_NAME_CHARS} characters")
    if any(c.isspace() or c == "/" or not c.isprintable() for c in name):
        raise BadRequestError(f"{kind} {name!r} contains a space, a slash or a control character")
    return name


class Broker:
    def __init__(
        self, settings: BrokerSettings, node_id: int = 0, *, journal: bool = False, first_seq: int = 1
    ) -> None:
        self.settings = settings
        self.node_id = node_id
        self.journal = journal
        self.stats = Stats()
        self.topics: dict[str, Topic] = {}
        self.consumers: dict[int, Consumer] = {}
        self.messages = MessageIndex()  # live and retained, by code, in sequence order
        # Live messages' payload bytes + MESSAGE_OVERHEAD_BYTES each: what
        # mq.max_backlog_bytes limits (Admission), whatever the topic.
        self.backlog_bytes = 0
        self.admission = Admission(settings)
        self.timers = Timers(settings.retain_consumed_max)
        self._seq = first_seq
        self._codes = CodeMaker()
        self.keep_codes_queued = KEEP_CODES_QUEUED  # (tests lower it)
        self._next_consumer = 1
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
        return self.timers.next_due()

    # ------------------------------------------------------------ topics and groups

    def topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            check_name("topic", name)
            topic = self._make_topic(name)
        return topic

    def _make_topic(self, name: str, *, journal: bool = True) -> Topic:
        topic = self.topics[name] = Topic(name, self.settings.topic(name))
        if topic.cfg.push_type == 1 or topic.is_dlq:
            self._group(topic, DEFAULT_GROUP, durable=True, now=0.0, journal=journal)
        return topic

    def _group(
        self, topic: Topic, name: str, *, durable: bool, now: float, journal: bool = True, start: str = ""
    ) -> Group:
        group = topic.groups.get(name)
        if group is None:
            group = topic.groups[name] = Group(topic, name, durable)
            topic.groups_changed()
            if durable and journal and self.journal:
                self._changes.append(ch.GroupCreated(topic.name, name, now, start))
        return group

    def backfill(self, group: Group, now: float | None) -> int:
        """Give a group just made an entry for every live message of its topic (ready, or
        delayed until ``deliver_at``), in publish order; returns how many. ``now`` None:
        replayed (``kapok.core.replay``), entries ready, queued by ``resume``."""
        topic = group.topic
        name = group.name
        added = 0
        for held in self.messages.held():
            if held.topic != topic.name or not held.live:
                continue
            msg = held.resolve() if type(held) is Waiting else held  # it gets a second entry
            if msg.entry(name) is not None:
                continue
            delayed = now is not None and msg.deliver_at > now
            entry = GroupEntry(msg, group, Status.DELAYED if delayed else Status.READY)
            msg.add_entry(entry)
            added += 1
            if now is None:
                continue
            if delayed:
                topic.delayed_count += 1  # released with the message's other entries
            else:
                group.push_ready(entry)
        if added:
            self._dirty.add(group)
        return added

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

    def _store(self, topic: Topic, d: Draft, headers: dict[str, str] | None, now: float, prefix: str) -> str:
        """Store one message and return its code; ``prefix`` is ``code_prefix`` of ``now``
        (computed once per batch)."""
        seq = self._seq
        self._seq = seq + 1
        block = self._codes.block(prefix, seq)
        code = block.code(seq & 0xFF)
        if d.deliver_at:
            deliver_at = d.deliver_at
        elif d.delay_s:  # a negative delay (KapokMQ's DelayTime may be) is kept, and means "now"
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
        # A message that will wait (behind many others, or for its time) keeps its code's block,
        # not the code: see CodeBlock. One delivered soon keeps the code it has already.
        waits = delayed or not groups or groups[0].ready_count >= self.keep_codes_queued
        if (
            waits
            and seq <= SEQ_MASK
            and deliver_at == now
            and not expire_at
            and not key
            and not d.priority
            and headers is None
            and small_route(topic, groups)
        ):
            return self._store_waiting(topic, groups[0], d, block, seq, code, now)
        msg = Message(
            seq, block if waits and seq <= SEQ_MASK else code, d.data, key, d.priority, now, deliver_at,
            expire_at, d.producer_id, d.dedup_id, headers, group=groups[0] if groups else topic.no_group(),
            status=status if groups else Status.DROPPED,
        )  # fmt: skip
        self.messages.add_numbered(msg)
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
            return code
        topic.live_count += 1
        topic.live_bytes += len(d.data)
        self.backlog_bytes += len(d.data) + MESSAGE_OVERHEAD_BYTES
        if topic.order is not None:
            topic.order.append(msg)
        if delayed:
            topic.delayed_count += len(groups)
            self.timers.delay(msg)
        if expire_at:
            self.timers.expire(msg)
        return code

    def _store_waiting(
        self, topic: Topic, group: Group, d: Draft, block: CodeBlock, seq: int, code: str, now: float
    ) -> str:
        """``_store`` of a plain message that waits far back: as a ``Waiting``."""
        held = Waiting(seq, block, d.data, now, d.producer_id, d.dedup_id, group)
        self.messages.add_numbered(held)
        self.stats.published += 1
        (group.ready[0] or group.queue(0)).append(held)
        group.ready_count += 1
        self._dirty.add(group)
        if self.journal:
            self._changes.append(
                ch.Published(
                    seq, code, topic.name, d.data, "", 0, now, now, 0.0, d.producer_id, d.dedup_id, None,
                    topic.durable,
                )
            )  # fmt: skip
        topic.live_count += 1
        topic.live_bytes += len(d.data)
        self.backlog_bytes += len(d.data) + MESSAGE_OVERHEAD_BYTES
        return code

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

    def _held_in_group(self, topic: str, group: str, code: str) -> Entry | None:
        msg = self.messages.get(code)
        entry = msg.entry(group) if msg is not None and msg.topic == topic else None
        if entry is None or entry.status is not Status.INFLIGHT or entry.consumer is None:
            return None
        return entry

    def settle_in_group(
        self, topic: str, group: str | None, codes: Iterable[str], how: Settle, now: float
    ) -> list[str]:
        """Ack, requeue or reject leased messages by group (``None``: the p2p default group).

        Used by pull mode, where the lease is held by the group rather than by a
        connection; returns the codes that were not in flight in that group. Settling
        creates nothing: an unknown topic or group is a ``NotFoundError``.
        """
        return self.settle_leases(topic, group, codes, "", how, now)[1]

    def settle_leases(
        self, topic: str, group: str | None, codes: Iterable[str], claim: str, how: Settle, now: float
    ) -> tuple[int, list[str]]:
        """``settle_in_group`` of ``codes``, then of every entry in flight under ``claim``
        (when given; an unknown or settled claim settles nothing); returns how many entries
        were settled, and the codes that were not in flight in the group."""
        grp = self._existing_group(topic, group)
        group = grp.name
        unknown: list[str] = []
        codes = codes if isinstance(codes, list) else list(codes)
        claims = grp.claims
        if claim and claims is not None:
            claimed = [e.msg.code for e in claims.take(claim)]
            if not claims.by_name:
                grp.claims = None
            if codes and claimed:
                given = set(codes)
                claimed = [code for code in claimed if code not in given]
            codes = codes + claimed
        for code in codes:
            entry = self._held_in_group(topic, group, code)
            if entry is None:
                unknown.append(code)
                continue
            assert entry.consumer is not None
            if claims is not None:
                self._unclaim(claims, entry)
            entry.consumer.held.pop(code, None)
            self._dirty.add(entry.group)
            if how is Settle.ACK:
                self.stats.acked += 1
                self._finish(entry, Status.CONSUMED, "ack", now)
            elif how is Settle.REQUEUE:
                self.stats.nacked += 1
                self._requeue(entry, "nack", now)
            else:
                self.stats.nacked += 1
                self._dead_letter(entry, "rejected", now)
        self._dispatch(now)
        return len(codes) - len(unknown), unknown

    def _existing_group(self, topic_name: str, group_name: str | None) -> Group:
        topic = self.topics.get(topic_name)
        if topic is None:
            raise NotFoundError(f"no topic {topic_name!r}")
        group = topic.groups.get(DEFAULT_GROUP if group_name is None else group_name)
        if group is None or not group.durable:
            what = "no default group (it is pub/sub)" if group_name is None else f"no group {group_name!r}"
            raise NotFoundError(f"topic {topic_name!r} has {what}")
        return group

    # ------------------------------------------------------------ pull mode

    def pull(
        self,
        topic_name: str,
        group_name: str | None,
        max_n: int,
        lease_s: float,
        now: float,
        claim: str = "",
        start: str = "",
        consumer: str = "",
    ) -> list[Entry]:
        """Lease up to ``max_n`` ready messages of a durable group for ``lease_s`` seconds.

        Under a ``claim`` (``kapok.core.claims``) that still has entries in flight, the
        answer is those entries, their leases renewed, and nothing new is leased; else
        the messages leased are put under the claim. ``start``: see ``pull_group``.
        ``consumer``: who pulls, the name their ``Delivered`` records carry.
        """
        group = self.pull_group(topic_name, group_name, now, start)
        if claim and group.claims is not None:
            held = group.claims.get(claim)
            if held is not None:
                return self._renew(held, lease_s, now)
        lessee = self._lessee(group, now)
        lessee.ack_timeout_s = lease_s
        lessee.prefetch = len(lessee.held) + max_n
        # Every puller of the group shares its lessee, which gets entries only inside this
        # call (its prefetch is 0 otherwise): named so for the call, the deliveries are.
        lessee.name = consumer
        group.unpark()
        self._dirty.add(group)
        journaled = len(self._changes)
        self._dispatch(now)
        lessee.prefetch = 0
        entries = self._pushes.pop(lessee.id, [])
        if claim and entries:
            self._claim(group, claim, lease_s, entries, journaled)
        return entries

    def _lessee(self, group: Group, now: float) -> Consumer:
        """The group's pull lessee, the consumer that holds what pulls leased (made if needed)."""
        lessee = group.pull
        if lessee is None:
            cid = self._next_consumer
            self._next_consumer += 1
            lessee = group.pull = Consumer(cid, group, "pull", None, 0, False, is_pull=True, since=now)
            self.consumers[cid] = lessee
            group.consumers.append(lessee)
            group.consumers_changed()
        return lessee

    def _claim(self, group: Group, name: str, lease_s: float, entries: list[Entry], journaled: int) -> None:
        """Put ``entries``, just leased, under the claim ``name``; their ``Delivered`` records
        (journaled from index ``journaled`` on) carry it. They are rewritten here rather than
        built so by ``_deliver``, which then tests nothing per message for unclaimed pulls."""
        claims = group.claims
        if claims is None:
            claims = group.claims = Claims()
        claims.add(name, lease_s, entries)
        if not self.journal:
            return
        codes = {entry.msg.code for entry in entries}
        changes = self._changes
        delivered = ch.Delivered
        for i in range(journaled, len(changes)):
            r = changes[i]
            if type(r) is delivered and r.code in codes and r.group == group.name:
                changes[i] = delivered(r.code, r.topic, r.group, r.attempts, r.at, name, lease_s, r.consumer)

    def _renew(self, claim: Claim, lease_s: float, now: float) -> list[Entry]:
        """The entries in flight under ``claim``, their leases ending ``lease_s`` from now."""
        claim.lease_s = lease_s
        deadline = now + lease_s
        add = self.timers.deadlines.add
        entries = list(claim.entries)
        for entry in entries:
            entry.deadline = deadline
            add(deadline, lease_s, entry)
        return entries

    @staticmethod
    def _unclaim(claims: Claims, entry: Entry) -> None:
        """``entry`` leaves the flight: it leaves its claim, if any (and the group forgets
        its ``Claims`` once none is left)."""
        claims.leave(entry)
        if not claims.by_name:
            entry.group.claims = None

    def pull_group(self, topic_name: str, group_name: str | None, now: float, start: str = "") -> Group:
        """The durable group a pull reads, made if new: with ``start`` ``changes.EARLIEST``,
        made with every live message of the topic (``backfill``), else with none (it gets
        what is published from now on). A group that exists is left as it is."""
        topic = self.topic(topic_name)
        if group_name is None:
            if DEFAULT_GROUP not in topic.groups:
                raise SubscriptionError(f"topic {topic_name!r} is pub/sub: pulling needs a named group")
            group_name = DEFAULT_GROUP
        check_name("group", group_name)
        if group_name.startswith("~"):
            raise SubscriptionError("group names starting with '~' are reserved")
        if start == ch.EARLIEST and group_name not in topic.groups:
            group = self._group(topic, group_name, durable=True, now=now, start=ch.EARLIEST)
            self.backfill(group, now)
            return group
        return self._group(topic, group_name, durable=True, now=now)

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

    # ------------------------------------------------------------ recovery and replication

    # ``kapok.core.replay`` rebuilds state from change records through these seams (the
    # WAL at start-up, a slave's stream). They skip the checks a client's request gets:
    # records hold only what was accepted once.

    def restore_topic(self, name: str) -> Topic:
        return self.topics.get(name) or self._make_topic(name, journal=False)

    def restore_group(self, topic: Topic, name: str, at: float) -> Group:
        # Replayed, never new: its own record is in the log being replayed.
        return self._group(topic, name, durable=True, now=at, journal=False)

    def restore_seq(self, next_seq: int) -> None:
        """Codes made from now on use sequence numbers from ``next_seq`` up (never lower)."""
        self._seq = max(self._seq, next_seq)

    def resume(self, msg: Message, now: float, reason: str = "recovery") -> int:
        """Make a replayed live message deliverable: its open entries go back to their queues
        (or wait for ``deliver_at``, or are dead-lettered past ``max_deliveries``). An entry
        replayed as in flight (delivered, never settled nor requeued) is requeued for
        ``reason`` ("recovery", "takeover"), which is journaled like any other requeue.
        Returns how many were (they are delivered again)."""
        topic = self.topics[msg.topic]
        timers = self.timers
        topic.live_count += 1
        topic.live_bytes += len(msg.data)
        self.backlog_bytes += len(msg.data) + MESSAGE_OVERHEAD_BYTES
        if topic.order is not None:
            topic.order.append(msg)
        if msg.expire_at:
            timers.expire(msg)
        delayed = msg.deliver_at > now
        if delayed:
            timers.delay(msg)
        limit = topic.cfg.max_deliveries
        redelivered = 0
        for entry in msg.all_entries():
            if entry.status.final:
                continue
            claims = entry.group.claims
            if claims is not None and entry in claims.of and entry.status is _INFLIGHT:
                continue  # stays in flight under its claim: ``resume_claims`` leases it again
            if limit and not topic.is_dlq and entry.attempts >= limit:
                self._dead_letter(entry, "max_deliveries", now)
                continue
            if entry.status is _INFLIGHT:
                redelivered += 1
                if self.journal:
                    self._changes.append(
                        ch.Requeued(msg.code, msg.topic, entry.group.name, reason, now, entry.attempts)
                    )
            if delayed:
                entry.status = Status.DELAYED
                topic.delayed_count += 1
            else:
                entry.group.push_ready(entry)
                self._dirty.add(entry.group)
        return redelivered

    def resume_all(self, messages: Iterable[Message | Waiting], now: float, reason: str = "recovery") -> int:
        """``resume`` every replayed live message and ``retire`` every finished one, in the
        order given (publish order); returns how many entries are delivered again. The common
        message (its one entry ready, never delivered, due, with no TTL; every ``Waiting``) is
        queued the short way: a million of them come back at every start-up."""
        dirty = self._dirty
        redelivered = 0
        added = 0
        for msg in messages:
            if type(msg) is Waiting and msg.create_time > now:
                msg = msg.resolve()  # due after now (the clock went back): the long way
            if type(msg) is Waiting or (
                not msg.finished_at
                and msg.status is _READY
                and not msg.attempts
                and not msg.more
                and not msg.expire_at
                and msg.deliver_at <= now
            ):
                group = msg.group
                topic = group.topic
                size = len(msg.data)
                topic.live_count += 1
                topic.live_bytes += size
                added += size + MESSAGE_OVERHEAD_BYTES
                if topic.order is not None and type(msg) is Message:  # (never a ``Waiting``'s topic)
                    topic.order.append(msg)
                (group.ready[msg.priority] or group.queue(msg.priority)).append(msg)
                group.ready_count += 1
                dirty.add(group)
            elif msg.finished_at:  # not ``live``
                self.retire(msg, now)
            else:
                redelivered += self.resume(msg, now, reason)
        self.backlog_bytes += added
        return redelivered

    def restore_claim(self, entry: Entry, claim: str, lease_s: float) -> None:
        """A replayed delivery of ``entry``: under ``claim`` ("" for none: it leaves any
        claim it was under)."""
        group = entry.group
        claims = group.claims
        if claim:
            if claims is None:
                claims = group.claims = Claims()
            claims.add(claim, lease_s, (entry,))
        elif claims is not None:
            self._unclaim(claims, entry)

    def unclaim(self, entry: Entry) -> None:
        """A replayed end of ``entry``'s delivery (settled, requeued, deleted)."""
        claims = entry.group.claims
        if claims is not None:
            self._unclaim(claims, entry)

    def resume_claims(self, now: float) -> int:
        """Lease every replayed entry in flight under a claim (``resume`` left them in
        flight) to its group's pull lessee again, for its claim's lease length from
        ``now``, in the order they were leased; returns how many."""
        resumed = 0
        for topic in self.topics.values():
            for group in topic.groups.values():
                claims = group.claims
                if claims is None:
                    continue
                lessee = self._lessee(group, now)
                held = lessee.held
                add = self.timers.deadlines.add
                for claim in claims.by_name.values():
                    deadline = now + claim.lease_s
                    for entry in claim.entries:
                        entry.consumer = lessee
                        entry.deadline = deadline
                        held[entry.msg.code] = entry
                        add(deadline, claim.lease_s, entry)
                        resumed += 1
        return resumed

    def retire(self, msg: Message, now: float) -> None:
        """Keep a replayed finished message for the rest of its retention, or forget it."""
        retain = self.topics[msg.topic].cfg.retain_consumed_s
        until = msg.finished_at + retain
        if retain > 0 and until > now:
            self.timers.retain(msg, until, retain)
        else:
            self.messages.discard(msg)

    def dispatch(self, now: float) -> None:
        """Deliver what became deliverable (after ``resume``)."""
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
        topic_name = group.topic.name
        consumer: Consumer | None = None
        out: list[Entry] = []
        held: dict[str, Entry] = {}
        deadlines: deque[float] | None = None
        timed: deque[Entry] | None = None
        deadline = 0.0
        delivered = redelivered = 0
        find = self.messages.find
        for entry, c in group.assign():
            if c is not consumer:  # one deadline and one push list per consumer and call
                consumer = c
                held = c.held
                out = pushes.get(c.id) or pushes.setdefault(c.id, [])
                timeout = c.ack_timeout_s
                deadlines, timed = self.timers.deadlines.queue(timeout) if timeout else (None, None)
                deadline = now + timeout
            entry.status = _INFLIGHT
            attempts = entry.attempts = entry.attempts + 1
            entry.last_delivered_at = now
            entry.consumer = c
            msg = entry.msg
            waited = msg.compact_code
            code = msg.delivered_code()
            if waited:  # perhaps as a ``Waiting`` until now: the index holds the message from here on
                find(code, msg.seq)
            held[code] = entry
            c.room -= len(msg.data) + PUSH_OVERHEAD_BYTES
            if deadlines is not None and timed is not None:
                entry.deadline = deadline
                deadlines.append(deadline)
                timed.append(entry)
            out.append(entry)
            c.delivered += 1
            delivered += 1
            if attempts > 1:
                redelivered += 1
            if changes is not None:  # the consumer's name: a reference, not a copy
                changes.append(ch.Delivered(code, topic_name, group.name, attempts, now, "", 0.0, c.name))
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
            msg = entry.msg
            self._changes.append(
                ch.Requeued(msg.code, msg.topic, entry.group.name, reason, now, entry.attempts)
            )

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
        dlq.published += 1

    def _finish(self, entry: Entry, status: Status, reason: str, now: float) -> None:
        entry.status = status
        entry.deadline = now  # = settled_at, see Entry
        entry.consumer = None
        msg = entry.msg
        group = entry.group
        if self.journal:
            self._changes.append(ch.Settled(msg.code, group.topic.name, group.name, status.text, reason, now))
        if msg.status.final and (not msg.more or msg.settled()):
            self._complete(msg, group.topic, now)

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
                claims = entry.group.claims
                if claims is not None:
                    self._unclaim(claims, entry)
            elif st is Status.DELAYED:
                entry.group.topic.delayed_count -= 1
            if status is Status.EXPIRED and self.settings.expired == "dead_letter":
                self._dead_letter(entry, ch.EXPIRED, now)
            else:
                self._finish(entry, status, reason, now)
        self.timers.undelay(msg)

    def _complete(self, msg: Message, topic: Topic, now: float, counted: bool = True) -> None:
        msg.finished_at = now
        if counted:
            topic.live_count -= 1
            topic.live_bytes -= len(msg.data)
            self.backlog_bytes -= len(msg.data) + MESSAGE_OVERHEAD_BYTES
        if msg.expire_at:
            self.timers.unexpire(msg)
        retain = topic.cfg.retain_consumed_s
        if retain > 0 and self.settings.retain_consumed_max > 0:
            self.timers.retain(msg, now + retain, retain)
        elif self.messages.discard(msg):
            msg.forget()

    # ------------------------------------------------------------ views

    def iter_messages(self) -> Iterator[Message]:
        return self.messages.values()
