"""Where "now" comes from. Pure code takes ``now`` as an argument; drivers ask a Clock.

A clock also schedules: the broker service's timer (the core's next deadline) and
long-poll time-outs go through ``call_at``, so a test's manual clock
(``kapok.testing.ManualClock``) drives ack deadlines, delayed releases and long polls
without waiting on the wall clock. Network time-outs (handshakes, heartbeats) stay on
the event loop's own clock: they are about sockets, not about the broker's rules.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "SystemClock", "Timer", "loop_time", "wait_set"]


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def time(self) -> float:
        """Unix time in seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` once ``time()`` has reached ``when`` (unix seconds)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(when - time.time(), 0.0), callback)


def loop_time() -> float:
    """The running event loop's monotonic clock, in seconds: what link silences and network
    time-outs are measured on (uvloop's clock has an origin of its own: one clock for all)."""
    return asyncio.get_running_loop().time()


async def wait_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for ``event`` at most ``timeout_s`` seconds; whether it was set. Use it instead of
    ``asyncio.wait_for(event.wait(), ...)`` in a loop: on Python 3.11 that can turn a cancel
    arriving as the time runs out into a TimeoutError, so a task asked to stop runs on."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
