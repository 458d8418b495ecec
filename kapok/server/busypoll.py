"""Busy polling: the event loop keeps polling its sockets for a moment after a client's
data instead of sleeping, while the clients' traffic is dense enough for that to pay.

Why. A client that waits for each confirmation before it sends the next message (a
synchronous producer; ``kapok bench --workload roundtrip``) finds the node asleep in
``epoll_wait`` every time: the next frame has to wake it, and on a virtual machine such a
wake-up (the scheduler, the idle core's exit, the interrupt) costs as much as the node's
whole work on the frame. Go's scheduler and Erlang's schedulers spin a little before they
park a thread for this reason. Here the loop is kept busy with a chain of ``call_soon``
steps: while a step is pending the loop polls its sockets without blocking, so a frame
that arrives is read at once. Each step also yields the core (``sched_yield``): any other
process that is ready to run on it (a client, the archiver, another program) runs first, and
when that kept the loop away for longer than a window, the core is contended and polling
ends: it would only take from the others (three nodes polling on one 2-core machine skewed
a producer's latency-based balancing between them).

When. Polling costs a core for as long as it lasts, so it is done only while it is likely
to catch the next frame: ``SpinRule`` keeps an average of the gaps between the moments
data arrived from clients, and polls for ``window_s`` after data only while that average
is below ``window_s``; a window that passes without data resets the average, so that only a
new run of dense gaps starts it again. A steady trickle (a message every half a millisecond or
more) never starts it, nor do bunches of data on a machine too busy to wake the node at once;
one request at a time does, and so do bursts. A busy loop seldom gets to poll at all:
it has work of its own. ``server.busy_poll_us`` sets the window; 0 turns it off (a host
shared with latency-insensitive work, or billed by CPU time).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["BusyPoll", "SpinRule"]

# How much of the average one gap may move (1/4: a few short gaps in a row start polling
# again after an idle spell; one long gap alone does not stop it).
_WEIGHT = 0.25
# A gap counts at most this many windows: an idle minute must not take minutes to forget.
_MAX_GAP_WINDOWS = 8


class SpinRule:
    """Whether polling pays, from the times data arrived (pure: ``now`` in, a deadline out)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._idle = _MAX_GAP_WINDOWS * window_s  # the longest gap counted
        self._last = float("-inf")
        self._gap = self._idle  # the average gap; start as if idle

    def heard(self, now: float) -> float | None:
        """Data arrived at ``now``: until when to poll (None: not now)."""
        gap = min(now - self._last, self._idle)
        self._last = now
        self._gap += (gap - self._gap) * _WEIGHT
        return now + self.window_s if self._gap < self.window_s else None

    def missed(self) -> None:
        """A polling window passed without data: start again only after a run of dense gaps
        (data that comes in bunches, on a machine too busy to wake the node at once, must
        not start a poll that then waits in vain for the next bunch)."""
        self._gap = self._idle


class BusyPoll(Collector):
    """Drives ``SpinRule`` on a loop: ``heard`` on every read of a client socket."""

    def __init__(self, window_s: float) -> None:
        self._rule = SpinRule(window_s)
        self._until = 0.0
        self._since: float | None = None  # polling since (monotonic), None while not polling
        self._stepped = 0.0  # when the last step ran
        self._loop: asyncio.AbstractEventLoop | None = None
        self.seconds = 0.0  # spent polling, in periods that ended

    @property
    def polling(self) -> bool:
        return self._since is not None

    def heard(self) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        now = time.monotonic()  # not loop.time(): uvloop's counts whole milliseconds
        until = self._rule.heard(now)
        if until is None:
            return
        self._until = until
        if self._since is None:
            self._since = self._stepped = now
            loop.call_soon(self._step)

    def _step(self) -> None:
        loop = self._loop
        assert loop is not None and self._since is not None
        now = time.monotonic()
        # Out of the window, or the core went to other work for longer than a window (its
        # yield was taken: the core is contended, and polling only takes from the others).
        if now >= self._until or now - self._stepped > self._rule.window_s:
            self.seconds += now - self._since
            self._since = None
            self._rule.missed()
            return
        self._stepped = now
        os.sched_yield()
        loop.call_soon(self._step)

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "kapok_busy_poll_seconds",
            "Seconds the event loop polled its sockets instead of sleeping (server.busy_poll_us)",
            value=self.seconds,
        )
