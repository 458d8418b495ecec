"""Ack deadlines: which in-flight entries time out, and when (pure: ``now`` is an argument).

Theory of operation. A delivery's deadline is ``now + timeout``, and a
consumer's timeout is fixed, so deadlines of one timeout value arrive in
time order: one FIFO per timeout value replaces a heap (append and popleft
are O(1), and no tie-breaker is needed). A clock that steps back only
delays the timeouts queued behind a later one, by at most the step.

Items are never removed when an entry is acked, touched or requeued: an item
is *stale* when its entry is no longer in flight with that deadline, and is
skipped when it reaches the head. ``prune`` drops stale heads right after
acks, so the queues stay about as long as the in-flight set, instead of
pinning every acked message for a whole ack timeout.
"""

from __future__ import annotations

from collections import deque

from kapok.core.model import Entry, Status

__all__ = ["DeadlineQueues"]

_INFLIGHT = Status.INFLIGHT


def _live(deadline: float, entry: Entry) -> bool:
    """The item still stands for the entry's current delivery."""
    return entry.status is _INFLIGHT and entry.deadline == deadline and entry.consumer is not None


class DeadlineQueues:
    __slots__ = ("_queues",)

    def __init__(self) -> None:
        # timeout -> (deadlines, entries): two parallel FIFOs rather than one of
        # pairs, so queuing a delivery allocates nothing the garbage collector
        # tracks (one consumer's deliveries in one call share a deadline float).
        self._queues: dict[float, tuple[deque[float], deque[Entry]]] = {}

    def __len__(self) -> int:
        return sum(len(entries) for _, entries in self._queues.values())

    def queue(self, timeout: float) -> tuple[deque[float], deque[Entry]]:
        """The FIFOs of one timeout value, to append ``now + timeout`` and the entry to."""
        queue = self._queues.get(timeout)
        if queue is None:
            queue = self._queues[timeout] = (deque(), deque())
        return queue

    def add(self, entry: Entry, deadline: float, timeout: float) -> None:
        deadlines, entries = self.queue(timeout)
        deadlines.append(deadline)
        entries.append(entry)

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

    def next_due(self) -> float | None:
        """The earliest deadline queued (it may be stale: then a tick finds nothing to do)."""
        heads = [deadlines[0] for deadlines, _ in self._queues.values()]
        return min(heads) if heads else None

    def pop_due(self, now: float) -> list[Entry]:
        """The entries whose delivery timed out at ``now``, in deadline order; stale items are dropped."""
        # By entry: a touch or a redelivery at the same instant queues a second
        # item with the same deadline, and the entry must time out once.
        due: dict[int, tuple[float, Entry]] = {}
        for timeout in list(self._queues):
            deadlines, entries = self._queues[timeout]
            while deadlines and deadlines[0] <= now:
                deadline = deadlines.popleft()
                entry = entries.popleft()
                if _live(deadline, entry):
                    due.setdefault(id(entry), (deadline, entry))
            if not deadlines:
                del self._queues[timeout]
        items = list(due.values())
        items.sort(key=lambda item: item[0])  # stable: delivery order within one deadline
        return [entry for _, entry in items]
