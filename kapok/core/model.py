"""The broker's nouns: drafts, messages and their per-group delivery entries.

A ``Message`` is immutable content plus bookkeeping. Each group the message
was routed to holds one ``Entry`` with that group's delivery state, so one
subscriber's ack can never complete the message for another group (the
KapokMQ pub/sub bug). The message is *finished* when no entry is open.

Memory is the constraint that shapes these classes: a node keeps a million
queued messages, so every per-message object and field counts (about 280
bytes per queued 100-byte message, payload and index included: most wait
as a ``Waiting``, ``kapok.core.waiting``). They are
slotted, hold no per-message dict, and share their strings (topic, key,
producer id, the first 30 digits of the code) with the broker's own objects;
a message *is* the entry of its first group (almost every message has
exactly one group), so a queued message is one object plus its payload, and
its code is made again at the edge. See ``Entry``, ``Message``,
``kapok.core.waiting`` and ``kapok.core.codes``.

They are not frozen: the broker mutates them in place on the hot path, and
nothing outside ``kapok.core`` may.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from kapok.core.codes import HEX2, CodeBlock
from kapok.core.frozen import record

if TYPE_CHECKING:
    from kapok.core.consumers import Consumer
    from kapok.core.topics import Group

__all__ = [
    "Draft",
    "Entry",
    "GroupEntry",
    "Message",
    "Status",
    "Stored",
]


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
    headers: dict[str, str] | None = None  # the producer's, delivered with the message


class Status(enum.Enum):
    """Per-group state of one message."""

    DELAYED = "delayed"
    READY = "ready"
    INFLIGHT = "inflight"
    CONSUMED = "consumed"
    DEAD = "dead"  # dead-lettered: a copy went to <topic>.dlq
    EXPIRED = "expired"  # TTL passed before it was consumed
    DROPPED = "dropped"  # removed by the drop_oldest overflow policy

    def __init__(self, value: str) -> None:
        # Plain attributes, read on the hot path: an enum's ``value`` is a
        # descriptor and its hash a Python call, each 100 ns.
        self.final = value in ("consumed", "dead", "expired", "dropped")
        self.text = value


class Stored:
    """What a ``Message`` and a ``Waiting`` read alike: the code, kept as its ``CodeBlock``
    and the last byte of the number, or whole; the topic, from the first group; the
    payload's size."""

    __slots__ = ()

    _code: CodeBlock | str
    _seq: int
    group: Group
    data: bytes

    @property
    def seq(self) -> int:
        code = self._code
        return code.base + self._seq if type(code) is CodeBlock else self._seq

    @property
    def code(self) -> str:
        """The message's 32 digits (its block's and two more), or its foreign code."""
        code = self._code
        return code.head + HEX2[self._seq] if type(code) is CodeBlock else code

    @property
    def topic(self) -> str:
        """The topic's name (read from the first group: each group is in the message's topic)."""
        return self.group.topic.name

    @property
    def compact_code(self) -> bool:
        """The code is made from a ``CodeBlock`` (``make_code``'s layout: it carries ``seq``)."""
        return type(self._code) is CodeBlock

    @property
    def size(self) -> int:
        return len(self.data)


class Entry:
    """One message's state inside one group.

    Two kinds: a ``Message`` is itself the entry of its first group (almost
    every message has exactly one, and one object instead of two saves
    memory, construction and garbage-collector work per message), and a
    ``GroupEntry`` is the entry of each further group. ``msg`` leads from
    either to the message.

    ``deadline`` doubles as ``settled_at``: the ack deadline matters only in
    flight, the settle time only once final, and a field less is 16 bytes
    less per message (object sizes round up to 16).
    """

    __slots__ = (
        "attempts",
        "consumer",
        "deadline",
        "group",
        "last_consumer_id",
        "last_delivered_at",
        "status",
    )

    def _start(self, group: Group, status: Status) -> None:
        self.group = group
        self.status = status
        self.attempts = 0  # deliveries so far; never reset
        self.last_delivered_at = 0.0
        self.deadline = 0.0  # ack deadline while in flight, settle time once final
        self.consumer: Consumer | None = None  # holder while in flight
        self.last_consumer_id = 0  # avoided on redelivery after a timeout

    @property
    def msg(self) -> Message:
        raise NotImplementedError

    @property
    def settled_at(self) -> float:
        """When the entry became final (consumed, dead, expired, dropped); 0 before."""
        return self.deadline if self.status.final else 0.0

    @settled_at.setter
    def settled_at(self, at: float) -> None:
        self.deadline = at

    def __repr__(self) -> str:
        status = self.status.value
        return f"Entry({self.msg.code}, group={self.group.name!r}, {status}, attempts={self.attempts})"


class GroupEntry(Entry):
    """The entry of a message in a group other than its first."""

    __slots__ = ("msg",)

    def __init__(self, msg: Message, group: Group, status: Status) -> None:
        self.msg = msg  # type: ignore[misc]  # a slot where the base class has a read-only property
        self._start(group, status)


_NO_ENTRIES: tuple[GroupEntry, ...] = ()


class Message(Entry, Stored):
    """One published message, and its entry in its first group.

    Memory per queued message is the budget this class is shaped by:

    * it is the entry of its first group (see ``Entry``); entries of further
      groups are in the ``more`` tuple;
    * one that waits keeps neither a code string (96 bytes) nor an int for its
      number (32): a code of ``make_code``'s layout is its ``CodeBlock``, shared
      by up to 256 messages of a publish batch, and the last byte of its number
      (``_seq``, a small int Python shares); a message being delivered, or
      whose code is foreign (KapokMQ imports), keeps its code and its number;
    * whether entries are still open is read from the entries themselves, and
      the topic from the first group.

    A message routed to no group at all still has an entry: in its topic's
    ``no_group``, already dropped, never listed. When an anonymous
    subscriber's group goes away, a message whose first group it was moves
    its entry there too.
    """

    __slots__ = (
        "_code",
        "_seq",
        "create_time",
        "data",
        "dedup_id",
        "deliver_at",
        "expire_at",
        "finished_at",
        "headers",
        "key",
        "more",
        "priority",
        "producer_id",
    )

    def __init__(
        self,
        seq: int,
        code: str | CodeBlock,  # the block of a code of ``make_code``'s layout, or the code
        data: bytes,
        key: str = "",
        priority: int = 0,
        create_time: float = 0.0,  # unix seconds
        deliver_at: float = 0.0,  # create_time + delay
        expire_at: float = 0.0,  # 0 = no TTL
        producer_id: str = "",
        dedup_id: str = "",
        headers: dict[str, str] | None = None,
        *,
        group: Group,  # the first group (``Topic.no_group()`` when there is none)
        status: Status,  # the message's state in that group
    ) -> None:
        # Entry._start, inlined: this runs once per published message.
        self.group = group
        self.status = status
        self.attempts = 0
        self.last_delivered_at = 0.0
        self.deadline = 0.0
        self.consumer = None
        self.last_consumer_id = 0
        self._seq = seq - code.base if type(code) is CodeBlock else seq
        self._code = code
        self.data = data
        self.key = key
        self.priority = priority
        self.create_time = create_time
        self.deliver_at = deliver_at
        self.expire_at = expire_at
        self.producer_id = producer_id
        self.dedup_id = dedup_id
        self.headers = headers
        self.more = _NO_ENTRIES  # entries in further groups, in routing order
        self.finished_at = 0.0  # when the last entry became final; 0 while live

    def __repr__(self) -> str:
        return f"Message({self.code}, topic={self.topic!r}, open_entries={self.open_entries})"

    @property
    def msg(self) -> Message:
        return self

    def delivered_code(self) -> str:
        """The code, kept whole from now on (with the number): a message being delivered is
        read by its code again (its push, its ack, their records), and is seldom queued long
        after."""
        code = self._code
        if type(code) is CodeBlock:
            low = self._seq
            self._seq = code.base + low
            code = self._code = code.head + HEX2[low]
        return code

    @property
    def live(self) -> bool:
        return self.finished_at == 0.0

    def wire_status(self, now: float) -> int:
        """KapokMQ's status: 0 delayed, -1 pending or in flight, 1 consumed by every group."""
        if not self.live:
            return 1
        return 0 if self.deliver_at > now else -1

    # ------------------------------------------------------------ entries

    def all_entries(self) -> tuple[Entry, ...]:
        """The entries, one per group, in routing order."""
        if self.group.unlisted:
            return self.more
        return (self, *self.more) if self.more else (self,)

    def add_entry(self, entry: GroupEntry) -> None:
        self.more = (*self.more, entry)

    def route(self, groups: tuple[Group, ...], status: Status) -> tuple[GroupEntry, ...]:
        """Add an entry in each of ``groups`` (further groups: the first is the message's own)."""
        self.more = tuple([GroupEntry(self, group, status) for group in groups])
        return self.more

    def entry(self, group: str) -> Entry | None:
        for e in self.all_entries():
            if e.group.name == group:
                return e
        return None

    def remove_entry(self, group: str) -> Entry | None:
        """Forget the entry of ``group``, a gone anonymous subscriber's group.

        The message's own entry cannot leave it: it moves to the topic's
        ``no_group``, where it is not listed.
        """
        if self.group.name == group:
            self.group = self.group.topic.no_group()
            return self
        for e in self.more:
            if e.group.name == group:
                self.more = tuple(x for x in self.more if x is not e)
                return e
        return None

    def forget(self) -> None:
        """Drop the further entries of a message the broker no longer keeps.

        Those point back to the message, so the two form a cycle that only
        the garbage collector's full pass frees; cut it, and a finished
        message is freed as soon as nothing refers to it.
        """
        self.more = _NO_ENTRIES

    def settled(self) -> bool:
        """No entry is open any more (the message is complete)."""
        if not self.status.final:
            return False
        more = self.more
        return not more or all(e.status.final for e in more)

    @property
    def open_entries(self) -> int:
        return sum(1 for e in self.all_entries() if not e.status.final)

    @property
    def entries(self) -> dict[str, Entry]:
        """Group name -> entry, a fresh dict (views and tests; the broker uses the fields)."""
        return {e.group.name: e for e in self.all_entries()}
