"""Where "now" comes from. Pure code takes ``now`` as an argument; drivers ask a Clock."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    def time(self) -> float:
        """Unix time in seconds."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()
