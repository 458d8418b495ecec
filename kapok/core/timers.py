"""Due-time queues of the core (pure: ``now`` is an argument).

Theory of operation. An item is due ``period`` after it is queued, and
``now`` only grows, so items of one period arrive in due order: one FIFO per
period replaces a heap (append and popleft are O(1), and no tie-breaker is
needed). A clock that steps back only delays the items queued behind a later
one, by at most the step. Due times and items sit in two parallel deques
rather than one of pairs: a pair is one more object per item for the memory
and the garbage collector. ``PeriodFifos`` is that structure; the broker uses
it for ack deadlines (``DeadlineQueues``, here) and for retained consumed
messages (``limits.RetentionQueue``).

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

from kapok.core.model import Entry, Status

__all__ = ["DeadlineQueues", "PeriodFifos"]

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
