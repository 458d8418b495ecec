"""A clock that moves only when told to."""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a ManualClock only moves forward")
        self.now += seconds
