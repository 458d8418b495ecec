"""Change records: every state change of the broker, as data.

The broker emits these (when journaling is on) in the order it applied
them. They are the single currency of durability: the WAL writes them, a
slave replays them, and the analytics archive reads them. Replaying the same
records into an empty broker rebuilds the same state (``kapok.core.replay``).

Every record is built on the hot path (three per message: published,
delivered, settled), hence ``@record``: frozen for the type checker, and
three times cheaper to build than a run-time frozen dataclass.
"""

from __future__ import annotations

from kapok.core.frozen import record

__all__ = [
    "DELETED",
    "EARLIEST",
    "EXPIRED",
    "REQUEUED",
    "Change",
    "Checkpoint",
    "Deduped",
    "Delivered",
    "GroupCreated",
    "MessageDeleted",
    "Published",
    "Requeued",
    "Settled",
]


# Settled reasons with a meaning of their own (see ``Settled``).
REQUEUED = "requeued"
DELETED = "deleted"
EXPIRED = "expired"
# GroupCreated's ``start`` when the group was made with every live message of its topic.
EARLIEST = "earliest"


@record
class Published:
    seq: int
    code: str
    topic: str
    data: bytes
    key: str
    priority: int
    create_time: float
    deliver_at: float
    expire_at: float
    producer_id: str
    dedup_id: str
    headers: dict[str, str] | None
    groups: tuple[str, ...]  # durable groups the message was routed to


@record
class GroupCreated:
    """A durable group made. ``start``: ``EARLIEST`` when it was made with an entry for every
    live message its topic held then (a pull's ``start=earliest``); "" when it gets only the
    messages published after it (and in records written before the field existed)."""

    topic: str
    group: str
    at: float
    start: str = ""


@record
class Delivered:
    """An entry leased to a consumer (its ``attempts``-th delivery).

    ``claim``: the claim the pull named (``kapok.core.claims``), "" for none (and in
    records written before the field existed); ``lease_s``: the lease's length, which
    recovery and a takeover lease a claimed entry again for (0 when unclaimed).
    ``consumer``: the name of the consumer that got the lease (``Consumer.name``: how each
    protocol names one is in docs/protocol.md, "Consumer names"), "" when unknown (and in
    records written before the field existed). Nothing replays it: it is for the archive.
    """

    code: str
    topic: str
    group: str
    attempts: int
    at: float
    claim: str = ""
    lease_s: float = 0.0
    consumer: str = ""


@record
class Requeued:
    """A delivered, unacked entry made ready again.

    ``reason``: "nack" | "timeout" | "disconnect", or at start-up "recovery" (in flight
    when the node stopped) and "takeover" (in flight on the master a slave took over
    from); "snapshot" in a snapshot (an entry delivered before and ready again).
    ``attempts``: the delivery attempt that ended unacked (0 in records written before
    the field existed).
    """

    code: str
    topic: str
    group: str
    reason: str
    at: float
    attempts: int = 0


@record
class Settled:
    """An entry reached a final status (consumed, dead, expired, dropped).

    A few reasons give the end a meaning of its own (the archive's events rely on them):
    consumed with ``REQUEUED`` is a dead letter published again to its topic, not an
    ack; dropped with ``DELETED`` is an entry of a message deleted by the console or the
    API; dead with ``EXPIRED`` is a TTL that passed with ``mq.expired: dead_letter``.
    """

    code: str
    topic: str
    group: str
    status: str
    reason: str
    at: float


@record
class MessageDeleted:
    code: str
    at: float
    topic: str = ""  # "" in records written before the field existed


@record
class Deduped:
    """A duplicate-filter entry (snapshots only: the WAL has it inside ``Published``)."""

    topic: str
    dedup_id: str
    code: str
    at: float


@record
class Checkpoint:
    """Heads a snapshot: the node's next message sequence number."""

    next_seq: int
    at: float


Change = Published | GroupCreated | Delivered | Requeued | Settled | MessageDeleted | Deduped | Checkpoint
