"""The master's recent log, in memory, for slaves that fall behind or reconnect.

Batches arrive as the WAL encodes them (``offer``) and stay, oldest first, until their
bytes pass ``max_bytes``; a slave reads on from any batch boundary still held
(``since``). A slave whose position has left the backlog needs a full transfer (Redis's
partial resync and its fallback). Each batch remembers when it arrived, so the lag of a
slave can be told in seconds as well as in records and bytes.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

__all__ = ["Backlog", "Batch"]


@dataclass(frozen=True, slots=True)
class Batch:
    first_lsn: int
    count: int
    payload: bytes
    at: float  # when the master logged it (its clock)

    @property
    def end(self) -> int:
        return self.first_lsn + self.count


class Backlog:
    def __init__(self, max_bytes: int, next_lsn: int = 0) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.next_lsn = next_lsn  # the LSN the next batch starts at
        self._batches: deque[Batch] = deque()
        self._firsts: deque[int] = deque()  # first LSNs, for the binary search

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def start(self) -> int:
        """The oldest LSN still held (``next_lsn`` when empty)."""
        return self._firsts[0] if self._firsts else self.next_lsn

    def offer(self, first_lsn: int, count: int, payload: bytes, now: float) -> None:
        if first_lsn != self.next_lsn:  # a gap (the WAL restarted elsewhere): start afresh
            self.clear(first_lsn)
        self._batches.append(Batch(first_lsn, count, payload, now))
        self._firsts.append(first_lsn)
        self.bytes += len(payload)
        self.next_lsn = first_lsn + count
        while self.bytes > self.max_bytes and len(self._batches) > 1:
            old = self._batches.popleft()
            self._firsts.popleft()
            self.bytes -= len(old.payload)

    def clear(self, next_lsn: int) -> None:
        self._batches.clear()
        self._firsts.clear()
        self.bytes = 0
        self.next_lsn = next_lsn

    def holds(self, lsn: int) -> bool:
        """A slave at ``lsn`` can read on from here (a batch starts there, or it is the end)."""
        if lsn == self.next_lsn:
            return True
        i = bisect.bisect_left(self._firsts, lsn)
        return i < len(self._firsts) and self._firsts[i] == lsn

    def since(self, lsn: int, limit: int = 64) -> list[Batch]:
        """Up to ``limit`` batches from ``lsn`` on; [] at the end or past it (records the WAL
        has not encoded yet). ``KeyError`` when ``lsn`` has left the backlog (or is not a
        batch boundary)."""
        if lsn >= self.next_lsn:
            return []
        i = bisect.bisect_left(self._firsts, lsn)
        if i >= len(self._firsts) or self._firsts[i] != lsn:
            raise KeyError(lsn)
        return [self._batches[j] for j in range(i, min(i + limit, len(self._batches)))]

    def bytes_after(self, lsn: int) -> int:
        """Payload bytes of the batches from ``lsn`` on (a slave's lag in bytes)."""
        i = bisect.bisect_left(self._firsts, lsn)
        return sum(len(self._batches[j].payload) for j in range(i, len(self._batches)))

    def logged_at(self, lsn: int) -> float | None:
        """When the batch holding ``lsn`` was logged; None past the end or before the start."""
        i = bisect.bisect_right(self._firsts, lsn) - 1
        if 0 <= i < len(self._batches) and lsn < self._batches[i].end:
            return self._batches[i].at
        return None
