"""A plain message that waits far back in its group's queue, held small: ``Waiting``.

A ``Waiting`` stands in for a ``Message`` (``kapok.core.model``) until something needs the
message to change, and then makes it; its class says how. ``Held`` is what the broker's
index and a group's ready queue hold: either of the two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, final

from kapok.core.codes import CodeBlock
from kapok.core.model import Message, Status, Stored

if TYPE_CHECKING:
    from kapok.core.topics import Group

__all__ = ["Held", "Waiting"]

_READY = Status.READY


@final  # ``type(x) is Waiting`` tells it from a ``Message``
class Waiting(Stored):
    """A plain message that waits far back in its group's queue, in 96 bytes.

    A ``Message`` is 192 bytes as allocated (20 slots: its state in every group,
    its deliveries, its options). A message published behind ``KEEP_CODES_QUEUED``
    ready ones will not be delivered for a while, and a plain one (one group, no
    key, no headers, priority 0, no delay, no TTL) has nothing of that state yet
    but its payload, its code, its time and its producer. So it is stored as a
    ``Waiting``: those, in 8 slots, at 96 bytes: with its payload (144) and two
    list slots, ~280 bytes a queued message instead of ~370.

    Theory of operation. A ``Waiting`` is held in two places only: the broker's
    index (``kapok.core.index``) and its group's ready queue (``kapok.core.topics``):
    no timer, no ``more`` entries, no drop-oldest order refers to it. Whichever of
    the two needs the message to change (a delivery at the head of the queue; a
    lookup by code, which may be followed by a delete, a requeue from the console,
    a replayed record) calls ``resolve``, which makes the ``Message`` once and
    remembers it (``moved``); the other holder finds it there when it gets to it.
    Readers that only look (snapshots, searches, the console's figures) read a
    ``Waiting`` as it is: its fields have the values a plain, never delivered
    message has.
    """

    __slots__ = ("_code", "_seq", "create_time", "data", "dedup_id", "group", "moved", "producer_id")

    # What a plain message that was never delivered has (read by snapshots and searches).
    key: Final = ""
    priority: Final = 0
    expire_at: Final = 0.0
    headers: Final = None
    attempts: Final = 0
    last_delivered_at: Final = 0.0
    settled_at: Final = 0.0
    finished_at: Final = 0.0
    live: Final = True

    def __init__(
        self, seq: int, code: CodeBlock | str, data: bytes, create_time: float, producer_id: str,
        dedup_id: str, group: Group,
    ) -> None:  # fmt: skip
        self._seq = seq - code.base if type(code) is CodeBlock else seq
        self._code = code
        self.data = data
        self.create_time = create_time
        self.producer_id = producer_id
        self.dedup_id = dedup_id
        self.group = group
        self.moved: Message | None = None

    def __repr__(self) -> str:
        return f"Waiting({self.code}, topic={self.topic!r})"

    @property
    def status(self) -> Status:
        """READY (its state in its group), or the message's once made: what a reader of a
        queue sees, which may find it there after a lookup made the message."""
        return self.moved.status if self.moved is not None else _READY

    @property
    def msg(self) -> Held:
        return self.current()

    @property
    def deliver_at(self) -> float:
        return self.create_time

    def wire_status(self, now: float) -> int:
        return -1  # pending (KapokMQ's status)

    def all_entries(self) -> tuple[Waiting]:
        return (self,)

    def resolve(self) -> Message:
        """The message itself, made on the first call: every later change is made to it."""
        msg = self.moved
        if msg is None:
            at = self.create_time
            msg = self.moved = Message(
                self.seq, self._code, self.data, "", 0, at, at, 0.0, self.producer_id, self.dedup_id, None,
                group=self.group, status=_READY,
            )  # fmt: skip
        return msg

    def current(self) -> Held:
        """What to read: the message once made, else this."""
        return self.moved or self


Held = Message | Waiting  # what the index and a group's queue hold
