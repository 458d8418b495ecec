"""The broker's nouns: messages, their per-group delivery entries, consumers.

A ``Message`` is immutable content plus bookkeeping. Each group the message
was routed to holds one ``Entry`` with that group's delivery state, so one
subscriber's ack can never complete the message for another group (the
KapokMQ pub/sub bug). The message is *finished* when no entry is open.

These classes are plain slotted objects and not frozen: the broker mutates
them in place on the hot path, and nothing outside ``kapok.core`` may.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kapok.core.routing import KeyPattern
    from kapok.core.topics import Group

__all__ = ["Consumer", "Entry", "Message", "Status", "make_code"]


class Status(enum.Enum):
    """Per-group state of one message."""

    DELAYED = "delayed"
    READY = "ready"
    INFLIGHT = "inflight"
    CONSUMED = "consumed"
    DEAD = "dead"  # dead-lettered: a copy went to <topic>.dlq
    EXPIRED = "expired"  # TTL passed before it was consumed
    DROPPED = "dropped"  # removed by the drop_oldest overflow policy

    @property
    def final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({Status.CONSUMED, Status.DEAD, Status.EXPIRED, Status.DROPPED})


def make_code(create_ms: int, node_id: int, seq: int) -> str:
    """32 lowercase hex digits, like KapokMQ's codes, but ordered by creation time.

    48 bits of milliseconds, 32 bits of node id, 48 bits of node sequence: unique
    across the cluster (node ids differ) and across restarts (the sequence is
    restored by recovery), and sortable by creation time as plain strings.
    """
    return f"{create_ms & 0xFFFFFFFFFFFF:012x}{node_id & 0xFFFFFFFF:08x}{seq & 0xFFFFFFFFFFFF:012x}"


@dataclass(slots=True, eq=False)
class Message:
    seq: int
    code: str
    topic: str
    data: bytes
    key: str = ""
    priority: int = 0
    create_time: float = 0.0  # unix seconds
    deliver_at: float = 0.0  # create_time + delay
    expire_at: float = 0.0  # 0 = no TTL
    producer_id: str = ""
    dedup_id: str = ""
    headers: dict[str, str] | None = None
    entries: dict[str, Entry] = field(default_factory=dict)  # group name -> state
    open_entries: int = 0
    finished_at: float = 0.0  # when the last entry became final; 0 while live

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def live(self) -> bool:
        return self.finished_at == 0.0

    def wire_status(self, now: float) -> int:
        """KapokMQ's status: 0 delayed, -1 pending or in flight, 1 consumed by every group."""
        if not self.live:
            return 1
        return 0 if self.deliver_at > now else -1


@dataclass(slots=True, eq=False)
class Entry:
    """One message's state inside one group."""

    msg: Message
    group: Group
    status: Status
    attempts: int = 0  # deliveries so far; never reset
    last_delivered_at: float = 0.0
    finished_at: float = 0.0  # consumed / dead / expired time
    deadline: float = 0.0  # ack deadline while in flight
    consumer: Consumer | None = None  # holder while in flight
    last_consumer_id: int = 0  # avoided on redelivery after a timeout


@dataclass(slots=True, eq=False)
class Consumer:
    """One subscription: a push consumer on a socket, or a group's pull lessee."""

    id: int
    group: Group
    name: str  # the client's own id (KapokMQ consumerId), for the console
    pattern: KeyPattern | None
    prefetch: int
    auto_ack: bool
    weight: int = 1
    ack_timeout_s: float = 60.0  # 0 = no deadline (auto-ack: the driver acks after the write)
    is_pull: bool = False
    since: float = 0.0
    held: dict[str, Entry] = field(default_factory=dict)  # code -> entry, delivery order
    current_weight: int = 0  # smooth weighted round-robin state
    delivered: int = 0
    acked: int = 0

    @property
    def credit(self) -> int:
        return self.prefetch - len(self.held)

    def accepts(self, key: str) -> bool:
        return self.pattern is None or self.pattern.matches(key)
