"""Every due time of the broker, in one component (pure: ``now`` is an argument).

``Timers`` holds the four kinds: delayed messages waiting for ``deliver_at``,
messages with a TTL waiting for ``expire_at``, deliveries waiting for their
ack deadline, and finished messages retained until they are forgotten. The
broker asks it for ``next_due()`` (when ``tick`` must next run) and pops what
is due; no structure is ever scanned. Delayed and expiring messages sit in
sorted lists (sortedcontainers); deadlines and retention in FIFOs per period:

Theory of operation of the FIFOs. An item is due ``period`` after it is queued, and
``now`` only grows, so items of one period arrive in due order: one FIFO per
period replaces a heap (append and popleft are O(1), and no tie-breaker is
needed). A clock that steps back only delays the items queued behind a later
one, by at most the step. Due times and items sit in two parallel deques
rather than one of pairs: a pair is one more object per item for the memory
and the garbage collector. ``PeriodFifos`` is that structure; the broker uses
it for ack deadlines (``DeadlineQueues``) and for retained consumed
messages (``RetentionQueue``).

Ack deadlines: a delivery's deadline is ``now + timeout``, and a consumer's
timeout is fixed. Items are never removed when an entry is acked, touched or
requeued: an item is *stale* when its entry is no longer in flight with that
deadline, and is skipped when it reaches the head. ``prune`` drops stale
heads right after acks, so the queues stay about as long as the in-flight
set, instead of pinning every acked message for a whole ack timeout.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

from sortedcontainers import SortedList

from kapok.core.model import Entry, Message, Status

__all__ = ["DeadlineQueues", "PeriodFifos", "RetentionQueue", "Timers"]

T = TypeVar("T")

_INFLIGHT = Status.INFLIGHT


def _live(deadline: float, entry: Entry) -> bool:
    """The item still stands for the entry's current delivery."""
    return entry.status is _INFLIGHT and entry.deadline == deadline and entry.consumer is not None


class PeriodFifos(Generic[T]):
    """Items with due times, one FIFO per period (see the module's docstring)."""

    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: dict[float, tuple[deque[float], deque[T]]] = {}

    def queue(self, period: float) -> tuple[deque[float], deque[T]]:
        """The FIFOs (due times, items) of one period, to append to directly."""
        queue = self._queues.get(period)
        if queue is None:
            queue = self._queues[period] = (deque(), deque())
        return queue

    def add(self, due: float, period: float, item: T) -> None:
        dues, items = self.queue(period)
        dues.append(due)
        items.append(item)

    def next_due(self) -> float | None:
        """The earliest due time queued."""
        heads = [dues[0] for dues, _ in self._queues.values() if dues]
        return min(heads) if heads else None

    def _take_due(self, now: float) -> Iterator[tuple[float, T]]:
        """Remove and yield ``(due, item)`` for every item due at ``now``, queue by queue;
        queues left empty are forgotten (pull leases make one per lease length)."""
        for period in list(self._queues):
            dues, items = self._queues[period]
            while dues and dues[0] <= now:
                yield dues.popleft(), items.popleft()
            if not dues:
                del self._queues[period]


class DeadlineQueues(PeriodFifos[Entry]):
    """In-flight entries by ack deadline, one FIFO per timeout value."""

    __slots__ = ()

    def __len__(self) -> int:
        return sum(len(entries) for _, entries in self._queues.values())

    def prune(self, timeout: float) -> None:
        """Drop the stale items at the head of one queue (after acks by a consumer with ``timeout``)."""
        queue = self._queues.get(timeout)
        if queue is None:
            return
        deadlines, entries = queue
        while entries:
            if _live(deadlines[0], entries[0]):
                return
            deadlines.popleft()
            entries.popleft()
        del self._queues[timeout]  # pull leases make one queue per lease length: forget idle ones

    def pop_due(self, now: float) -> list[Entry]:
        """The entries whose delivery timed out at ``now``, in deadline order; stale items are dropped."""
        # By entry: a touch or a redelivery at the same instant queues a second
        # item with the same deadline, and the entry must time out once.
        due: dict[int, tuple[float, Entry]] = {}
        for deadline, entry in self._take_due(now):
            if _live(deadline, entry):
                due.setdefault(id(entry), (deadline, entry))
        items = list(due.values())
        items.sort(key=lambda item: item[0])  # stable: delivery order within one deadline
        return [entry for _, entry in items]


class RetentionQueue(PeriodFifos[T]):
    """Things to forget at a due time (one FIFO per retention period), bounded in
    count: past ``max_items`` the item due first goes early."""

    __slots__ = ("_size", "max_items")

    def __init__(self, max_items: int) -> None:
        super().__init__()
        self.max_items = max_items
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, due: float, period: float, item: T) -> None:
        super().add(due, period, item)
        self._size += 1

    def pop_due(self, now: float) -> list[T]:
        out = [item for _, item in self._take_due(now)]
        self._size -= len(out)
        while self._size > self.max_items:
            dues, items = min((q for q in self._queues.values() if q[0]), key=lambda q: q[0][0])
            dues.popleft()
            out.append(items.popleft())
            self._size -= 1
        return out


class Timers:
    """The broker's due times: releases, expiries, ack deadlines and retention."""

    __slots__ = ("deadlines", "delayed", "expiring", "retained")

    def __init__(self, retain_max: int) -> None:
        self.delayed: SortedList = SortedList()  # (deliver_at, seq, msg)
        self.expiring: SortedList = SortedList()  # (expire_at, seq, msg)
        self.deadlines = DeadlineQueues()  # in-flight entries; appended to directly by delivery
        self.retained: RetentionQueue[Message] = RetentionQueue(retain_max)

    def next_due(self) -> float | None:
        heads = [lst[0][0] for lst in (self.delayed, self.expiring) if lst]
        heads.extend(t for t in (self.deadlines.next_due(), self.retained.next_due()) if t is not None)
        return min(heads) if heads else None

    def delay(self, msg: Message) -> None:
        self.delayed.add((msg.deliver_at, msg.seq, msg))

    def undelay(self, msg: Message) -> None:
        self.delayed.discard((msg.deliver_at, msg.seq, msg))

    def expire(self, msg: Message) -> None:
        self.expiring.add((msg.expire_at, msg.seq, msg))

    def unexpire(self, msg: Message) -> None:
        self.expiring.discard((msg.expire_at, msg.seq, msg))

    def retain(self, msg: Message, until: float, period: float) -> None:
        self.retained.add(until, period, msg)

    def delayed_messages(self) -> Iterator[Message]:
        return (msg for _, _, msg in self.delayed)

    def pop_released(self, now: float) -> list[Message]:
        """Delayed messages whose time has come, in ``deliver_at`` order."""
        return self._pop_sorted(self.delayed, now)

    def pop_expired(self, now: float) -> list[Message]:
        """Messages whose TTL has passed (finished ones included: the caller skips them)."""
        return self._pop_sorted(self.expiring, now)

    def pop_timed_out(self, now: float) -> list[Entry]:
        return self.deadlines.pop_due(now)

    def pop_forgotten(self, now: float) -> list[Message]:
        """Retained messages whose retention is over (or that the count bound pushes out)."""
        return self.retained.pop_due(now)

    @staticmethod
    def _pop_sorted(items: SortedList, now: float) -> list[Message]:
        due = items.bisect_right((now, float("inf")))
        if not due:
            return []
        out = [msg for _, _, msg in items[:due]]
        del items[:due]
        return out
