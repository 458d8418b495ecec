"""Topics and groups: where ready messages wait and who gets them next.

Theory of operation. A topic owns named groups. Every message published to a
topic gets one ``Entry`` in each group that exists at that moment (durable
named groups, the p2p topic's ``default`` group, and each anonymous pub/sub
subscriber's private group). Inside a group, ready entries wait in ten FIFO
deques, one per priority; ``Group.assign`` hands them to consumers:

* highest priority first, FIFO within a priority (redelivered entries go to
  the front, so a redelivery may overtake newer messages: documented);
* only to consumers with free credit (``prefetch`` minus held messages);
* round-robin among eligible consumers, smooth weighted round-robin when
  weights differ, and not to ``last_consumer_id`` when another is eligible;
* an entry whose key no consumer of the group accepts is *parked*; parked
  entries rejoin the ready queue when the set of consumers changes. An
  entry that some busy consumer accepts is skipped (bounded look-ahead) so
  it cannot block an entry another consumer could take now.

Entries leave deques lazily: one that stopped being READY while queued
(expired, dropped, deleted) is discarded when it reaches the head. A plain
message far back may wait as a ``Waiting`` (``kapok.core.waiting``), made a
``Message`` when it reaches the head, unless a lookup by code made it earlier.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kapok.core.consumers import Consumer
from kapok.core.model import Entry, Status
from kapok.core.waiting import Waiting

if TYPE_CHECKING:
    from kapok.core.claims import Claims
    from kapok.core.model import Message
    from kapok.core.settings import TopicSettings

__all__ = ["DEFAULT_GROUP", "Group", "Queued", "Topic"]

Queued = Entry | Waiting  # what a ready queue holds (a ``Waiting``: see kapok.core.waiting)

DEFAULT_GROUP = "default"
PRIORITIES = 10
# How many entries ``assign`` may step over (their only takers are busy)
# before it stops looking; bounds the cost of one call.
LOOKAHEAD = 256


class Group:
    __slots__ = (
        "_rr",
        "_weighted",
        "claims",
        "consumers",
        "durable",
        "name",
        "parked",
        "pull",
        "ready",
        "ready_count",
        "topic",
        "unlisted",
        "waiters",
    )

    def __init__(self, topic: Topic, name: str, durable: bool) -> None:
        self.topic = topic
        self.name = name
        self.durable = durable
        self.unlisted = False  # a topic's no_group: a message's entry there is not listed
        # One FIFO per priority, made on first use: an empty deque costs 600
        # bytes, and most groups only ever see priority 0.
        self.ready: list[deque[Queued] | None] = [None] * PRIORITIES
        self.parked: list[Entry] = []  # a list: an empty deque is 600 bytes, per group
        self.ready_count = 0  # READY entries in ``ready`` and ``parked``
        self.consumers: list[Consumer] = []
        self.pull: Consumer | None = None  # lessee of HTTP pull requests
        self.claims: Claims | None = None  # named pull leases (kapok.core.claims); None until the first
        self.waiters = 0  # long-polls waiting for this group to get ready entries
        self._rr = 0
        self._weighted = False

    def queue(self, priority: int) -> deque[Queued]:
        queue = self.ready[priority]
        if queue is None:
            queue = self.ready[priority] = deque()
        return queue

    def queues(self) -> Iterator[deque[Queued]]:
        """The priority FIFOs made so far, highest priority first."""
        return (q for q in reversed(self.ready) if q is not None)

    def push_ready(self, entry: Entry, front: bool = False) -> None:
        entry.status = Status.READY
        entry.consumer = None
        queue = self.ready[entry.msg.priority] or self.queue(entry.msg.priority)
        if front:
            queue.appendleft(entry)
        else:
            queue.append(entry)
        self.ready_count += 1

    def consumers_changed(self) -> None:
        """Reset balancing state and give parked entries another chance."""
        self._rr = 0
        self._weighted = any(c.weight != 1 for c in self.consumers)
        for consumer in self.consumers:
            consumer.current_weight = 0
        self.unpark()

    def unpark(self) -> None:
        while self.parked:
            entry = self.parked.pop()
            if entry.status is Status.READY:
                self.queue(entry.msg.priority).appendleft(entry)

    def consumer_count(self) -> int:
        """Subscribed consumers (the pull lessee is not one)."""
        return sum(1 for c in self.consumers if not c.is_pull)

    def inflight_count(self) -> int:
        return sum(len(c.held) for c in self.consumers)

    def assign(self) -> Iterator[tuple[Entry, Consumer]]:
        """Yield ``(entry, consumer)`` pairs; the caller delivers each before resuming.

        Delivery uses up credit, so the caller must apply each pair before
        asking for the next one.
        """
        consumers = self.consumers
        if not consumers or not self.ready_count:
            return
        ready = Status.READY
        if len(consumers) == 1 and consumers[0].pattern is None:
            # One consumer that takes every key (the common case): no choice
            # to make, nothing to park or skip; FIFO until its credit is used.
            c = consumers[0]
            for queue in reversed(self.ready):
                while queue and c.prefetch > len(c.held) and c.room > 0:
                    entry = queue.popleft()
                    if type(entry) is Waiting:
                        entry = entry.resolve()
                    if entry.status is ready:
                        self.ready_count -= 1
                        yield entry, c
            return
        skipped: list[tuple[deque[Queued], Entry]] = []
        pick = self._pick
        try:
            for queue in reversed(self.ready):
                while queue:
                    entry = queue[0]
                    if type(entry) is Waiting:
                        entry = queue[0] = entry.resolve()
                    if entry.status is not ready:
                        queue.popleft()
                        continue
                    consumer = pick(entry)
                    if consumer is None:
                        if not self._has_credit():
                            return
                        queue.popleft()
                        if self._anyone_accepts(entry.msg.key):
                            skipped.append((queue, entry))
                            if len(skipped) >= LOOKAHEAD:
                                return
                        else:
                            self.parked.append(entry)
                        continue
                    queue.popleft()
                    self.ready_count -= 1
                    yield entry, consumer
        finally:
            for queue, entry in reversed(skipped):
                queue.appendleft(entry)

    def _has_credit(self) -> bool:
        return any(c.credit > 0 for c in self.consumers)

    def _anyone_accepts(self, key: str) -> bool:
        # An idle pull lessee (no request waiting) takes nothing, so it does
        # not keep entries out of the parked list.
        return any(c.accepts(key) for c in self.consumers if c.prefetch > 0)

    def _pick(self, entry: Entry) -> Consumer | None:
        consumers = self.consumers
        avoid = entry.last_consumer_id
        n = len(consumers)
        if n == 1:  # the common case, without the round-robin arithmetic
            c = consumers[0]
            if c.prefetch > len(c.held) and c.room > 0 and (c.pattern is None or c.accepts(entry.msg.key)):
                return c
            return None
        key = entry.msg.key
        if not self._weighted:
            fallback = -1
            rr = self._rr
            for i in range(n):
                idx = (rr + i) % n
                c = consumers[idx]
                if c.prefetch > len(c.held) and c.room > 0 and (c.pattern is None or c.pattern.matches(key)):
                    if c.id == avoid:
                        fallback = idx
                        continue
                    self._rr = idx + 1
                    return c
            if fallback < 0:
                return None
            self._rr = fallback + 1
            return consumers[fallback]
        # Smooth weighted round-robin (nginx): every eligible consumer gains
        # its weight, the richest wins and pays the total back. Counters are
        # reset whenever the consumer set changes, so they stay bounded.
        eligible = [c for c in consumers if c.credit > 0 and c.accepts(key)]
        if len(eligible) > 1 and avoid:
            eligible = [c for c in eligible if c.id != avoid] or eligible
        if not eligible:
            return None
        total = 0
        best = eligible[0]
        for c in eligible:
            c.current_weight += c.weight
            total += c.weight
            if c.current_weight > best.current_weight:
                best = c
        best.current_weight -= total
        return best


class Topic:
    __slots__ = (
        "_no_group",
        "cfg",
        "delayed_count",
        "durable",
        "group_list",
        "groups",
        "live_bytes",
        "live_count",
        "name",
        "order",
        "published",
    )

    def __init__(self, name: str, cfg: TopicSettings) -> None:
        self.name = name
        self.cfg = cfg
        self.groups: dict[str, Group] = {}
        self.live_count = 0  # messages not yet finished
        self.live_bytes = 0
        self.delayed_count = 0
        self.published = 0  # messages stored since start (dead letters into a .dlq included): rates
        # Publish order, kept only for drop_oldest (other topics never read it,
        # and it would pin every message ever published); finished messages are
        # skipped lazily and the deque is compacted when mostly stale.
        self.order: deque[Message] | None = deque() if cfg.overflow == "drop_oldest" else None
        # Read per published message, so kept up to date rather than computed:
        self.group_list: tuple[Group, ...] = ()  # every group, in creation order
        self.durable: tuple[str, ...] = ()  # names of the durable groups (recorded with a publish)
        self._no_group: Group | None = None

    def no_group(self) -> Group:
        """Where the entry of a message routed to no group points (see ``Message``); never listed."""
        if self._no_group is None:
            self._no_group = Group(self, "", durable=False)
            self._no_group.unlisted = True
        return self._no_group

    def groups_changed(self) -> None:
        self.group_list = tuple(self.groups.values())
        self.durable = tuple(name for name, g in self.groups.items() if g.durable)

    @property
    def is_dlq(self) -> bool:
        return self.name.endswith(".dlq")

    def oldest_live(self) -> Message | None:
        order = self.order
        if order is None:
            return None
        while order and not order[0].live:
            order.popleft()
        return order[0] if order else None

    def compact_order(self) -> None:
        if self.order is not None and len(self.order) > 2 * self.live_count + 1024:
            self.order = deque(m for m in self.order if m.live)
