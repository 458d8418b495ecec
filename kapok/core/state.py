"""The broker's state table and how ready entries reach consumers (``Broker``'s base).

``BrokerState`` holds every topic, group, message and consumer of one node, the outputs a
driver reads back (pushes, change records, woken groups) and delivery: ``_dispatch`` walks
the groups an event made dirty and ``_deliver`` hands their ready entries to consumers as far
as their credit goes. The classes above it add what a message goes through
(``kapok.core.lifecycle``), pull mode (``kapok.core.leases``), recovery
(``kapok.core.restore``) and the client-facing operations (``kapok.core.broker``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kapok.core import changes as ch
from kapok.core.admission import Admission
from kapok.core.claims import Claims
from kapok.core.codes import CodeMaker
from kapok.core.consumers import PUSH_OVERHEAD_BYTES, Consumer
from kapok.core.index import MessageIndex
from kapok.core.model import Entry, GroupEntry, Status
from kapok.core.settings import BrokerSettings
from kapok.core.timers import Timers
from kapok.core.topics import DEFAULT_GROUP, Group, Topic
from kapok.core.waiting import Waiting
from kapok.errors import BadRequestError, SubscriptionError

__all__ = ["KEEP_CODES_QUEUED", "BrokerState", "Stats", "check_name", "small_route"]

MAX_NAME_CHARS = 255
# Up to this many messages ready in its group, a message published keeps its code whole (at
# most ~1 MB a group): it is soon delivered, and its code read again (push, ack, records).
# Past it, a plain one is stored as a ``Waiting`` (``kapok.core.waiting``).
KEEP_CODES_QUEUED = 10_000
_INFLIGHT = Status.INFLIGHT


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


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise BadRequestError(f"{kind} must be 1 to {MAX_NAME_CHARS} characters")
    if any(c.isspace() or c == "/" or not c.isprintable() for c in name):
        raise BadRequestError(f"{kind} {name!r} contains a space, a slash or a control character")
    return name


class BrokerState:
    """Topics, groups, messages and consumers of one node, and delivery (``Broker``'s base)."""

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

    def _consumer(self, consumer_id: int) -> Consumer:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            raise SubscriptionError(f"no subscription {consumer_id}")
        return consumer

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

    @staticmethod
    def _unclaim(claims: Claims, entry: Entry) -> None:
        """``entry`` leaves the flight: it leaves its claim, if any (and the group forgets
        its ``Claims`` once none is left)."""
        claims.leave(entry)
        if not claims.by_name:
            entry.group.claims = None

    # ------------------------------------------------------------ delivery

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
