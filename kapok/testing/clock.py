"""A clock that moves only when told to."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

__all__ = ["ManualClock"]


class _Scheduled:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """``time()`` is ``now``; ``advance`` moves it and runs, in time order, every callback
    scheduled with ``call_at`` that has become due (synchronously, inside ``advance``)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self._due: list[tuple[float, int, _Scheduled]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Scheduled:
        scheduled = _Scheduled(callback)
        heapq.heappush(self._due, (when, next(self._order), scheduled))
        return scheduled

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a ManualClock only moves forward")
        target = self.now + seconds
        while self._due and self._due[0][0] <= target:
            when, _, scheduled = heapq.heappop(self._due)
            self.now = max(self.now, when)  # a callback sees the time it was due at
            if not scheduled.cancelled:
                scheduled.callback()
        self.now = target
