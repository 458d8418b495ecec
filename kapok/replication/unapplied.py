"""What a slave has journaled and not yet applied to its mirror: a bounded queue, and when to apply.

A follower writes each records batch of its master to its WAL as it came and acks it once
durable, without decoding it; the batch waits here until it is applied to the mirror
(``kapok.replication.applier`` runs the effects). The rules, as a pure state machine
(``now`` in, decisions out):

* ``add`` queues a batch (the follower's ``Append``); batches are contiguous in LSNs (a
  gap is a bug: ``ValueError``).
* ``due(now)``: apply now, because the link has been quiet for ``quiet_s`` (the loop is
  idle: nothing came in for that long), because the load is light (fewer than
  ``light_records`` came in this window of ``quiet_s`` and the one before: applying them
  costs next to nothing, and a master that sends a little all the time should not leave
  its slave's mirror behind for long), or because the queue is ``full``.
* ``full``: ``max_records`` records or ``max_bytes`` payload bytes are queued. The
  follower then applies the oldest batches itself before it reads the link again, so a
  slave that cannot keep up holds at most the bound (its acks slow down instead).
* ``take()`` pops the oldest batch for applying; ``applied`` is then the end of what the
  mirror holds, and ``end`` the end of what is journaled.

The bound is what a takeover must apply before it serves (``max_records``: a few µs a
record, so 100,000 records are a fraction of a second) and what it costs in memory
(``max_bytes``: the payloads, held until applied).
"""

from __future__ import annotations

from collections import deque

from kapok.replication.session import Append

__all__ = ["Unapplied"]


class Unapplied:
    def __init__(
        self, applied: int, *, max_records: int, max_bytes: int, quiet_s: float, light_records: int
    ) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.quiet_s = quiet_s
        self.light_records = light_records
        self.applied = applied  # the end (next LSN) of what the mirror holds
        self.end = applied  # the end of what is journaled
        self.records = 0
        self.bytes = 0
        self.last_added = float("-inf")
        self._window_end = float("-inf")  # records came in windows of quiet_s: this one ends then
        self._in_window = self._window_before = 0
        self._batches: deque[Append] = deque()

    def __len__(self) -> int:
        return len(self._batches)

    def add(self, batch: Append, now: float) -> None:
        if batch.first_lsn != self.end:
            raise ValueError(f"a batch from LSN {batch.first_lsn}, but what is journaled ends at {self.end}")
        self._batches.append(batch)
        self.end = batch.end
        self.records += batch.count
        self.bytes += len(batch.payload)
        self.last_added = now
        if now >= self._window_end:  # the window before counts only if it was the last one
            self._window_before = self._in_window if now < self._window_end + self.quiet_s else 0
            self._in_window = 0
            self._window_end = now + self.quiet_s
        self._in_window += batch.count

    @property
    def full(self) -> bool:
        return self.records >= self.max_records or self.bytes >= self.max_bytes

    def due(self, now: float) -> bool:
        """Whether to apply now: something waits, and the link has been quiet, the load is
        light, or the queue is full."""
        if not self._batches:
            return False
        light = self._window_before + self._in_window < self.light_records
        return light or self.full or now - self.last_added >= self.quiet_s

    def quiet_at(self) -> float:
        """When the queue becomes due if nothing more comes."""
        return self.last_added + self.quiet_s

    def take(self) -> Append | None:
        """The oldest batch, counted as applied (the caller applies it before it yields)."""
        if not self._batches:
            return None
        batch = self._batches.popleft()
        self.applied = batch.end
        self.records -= batch.count
        self.bytes -= len(batch.payload)
        return batch
