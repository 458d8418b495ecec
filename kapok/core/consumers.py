"""The broker's consumers: one per subscription, with the credit that paces its deliveries.

A consumer is the broker's view of a subscriber: its group, its key pattern, its
prefetch and what it holds (the entries delivered to it and not yet settled), and
the room left in its connection's send queue. The drivers create and remove them
through the broker; nothing outside ``kapok.core`` mutates one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kapok.core.model import Entry
    from kapok.core.routing import KeyPattern
    from kapok.core.topics import Group

__all__ = ["NO_ROOM_LIMIT", "PUSH_OVERHEAD_BYTES", "Consumer"]

NO_ROOM_LIMIT = 1 << 62
# What a delivery costs its connection's send queue beside the payload (the push's JSON
# fields), so that ``Consumer.room`` bounds small messages too.
PUSH_OVERHEAD_BYTES = 160


class Consumer:
    """One subscription: a push consumer on a socket, or a group's pull lessee."""

    __slots__ = (
        "ack_timeout_s",
        "acked",
        "auto_ack",
        "current_weight",
        "delivered",
        "group",
        "held",
        "id",
        "is_pull",
        "name",
        "pattern",
        "prefetch",
        "room",
        "since",
        "weight",
    )

    def __init__(
        self,
        id: int,
        group: Group,
        name: str,  # the client's own id (KapokMQ consumerId), for the console
        pattern: KeyPattern | None,
        prefetch: int,
        auto_ack: bool,
        weight: int = 1,
        ack_timeout_s: float = 60.0,  # 0 = no deadline (auto-ack: the driver acks after the write)
        is_pull: bool = False,
        since: float = 0.0,
    ) -> None:
        self.id = id
        self.group = group
        self.name = name
        self.pattern = pattern
        self.prefetch = prefetch
        self.auto_ack = auto_ack
        self.weight = weight
        self.ack_timeout_s = ack_timeout_s
        self.is_pull = is_pull
        self.since = since
        self.held: dict[str, Entry] = {}  # code -> entry, delivery order
        # Bytes its connection's send queue can still take (see Broker.set_room): deliveries
        # stop at 0 whatever the prefetch, so a consumer that stops reading holds a bounded
        # amount of the node's memory. Pull lessees and tests have no such limit.
        self.room = NO_ROOM_LIMIT
        self.current_weight = 0  # smooth weighted round-robin state
        self.delivered = 0
        self.acked = 0

    def __repr__(self) -> str:
        return f"Consumer({self.id}, group={self.group.name!r}, held={len(self.held)}/{self.prefetch})"

    @property
    def credit(self) -> int:
        return self.prefetch - len(self.held) if self.room > 0 else 0

    def accepts(self, key: str) -> bool:
        return self.pattern is None or self.pattern.matches(key)
