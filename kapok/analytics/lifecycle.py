"""A message's life per group: the backlog and the latency split, one message at a time.

Plain Python, run inside Spark's tasks by ``kapok.analytics.engine`` on each partition of
the events shuffled by code (all of a message's events in one task); the rules are stated
in ``kapok.analytics.transforms`` ("Per group" and "Latency split"). Per message (its
events: ``published``, ``deleted`` and those that name a group):

* its topic, creation time, due time (creation + its delay) and delete time;
* its entries: every group the message has an event in, and every other group of its
  topic whose first event (in the whole input: ``starts``) is not later than the
  message's creation (assumed to have the message ready: a ``published`` event names no
  group);
* each entry's events, sorted by (``t``, attempt), walk a small state machine
  (``Lives._entry``): its state changes (ready ±1, in flight ±1 at a time), when it began
  and ended being unacked, its first delivery, its ack and the delivery the ack ended.

What it gathers: the durations (end-to-end latency, queue wait and processing per entry,
the intentional delay per message) per topic × metric, by window, in ms; and per
topic × group × window the sum of the state changes and the oldest due time of the
entries unacked at the window's end (``BacklogParts``), which
``kapok.analytics.transforms.backlog`` turns into running figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from kapok.analytics.kinds import GROUP_KINDS

__all__ = ["BacklogParts", "Lives", "Step"]

# Step kinds of an entry's walk, in the order of a tie at one instant.
_DUE, _DELIVERED, _RETRIED, _END, _DELETED = 0, 1, 2, 3, 4
# States: not known yet, ready, in flight, gone.
_UNKNOWN, _READY, _IN_FLIGHT, _GONE = 0, 1, 2, 3
_UNACKED: Final = (_READY, _IN_FLIGHT)
_LAST: Final = 1e12  # an order after every attempt
_GROUP_KINDS: Final = frozenset(GROUP_KINDS)

# (t, order, kind, group, is an ack): ``order`` breaks ties at one instant: a delivery
# before the requeue of the same attempt, that requeue before the next attempt's
# delivery, the ends after both.
Step = tuple[float, float, int, str, bool]
# Per (topic, group, window_t): [ready change, in-flight change, oldest due time of the
# entries still unacked at the input's end that began in the window, oldest due time of
# the entries unacked at the window's end that ended later].
BacklogParts = dict[tuple[str, str, int], list[Any]]


class Lives:
    """The figures of the messages given to ``message``, in windows of ``window_s``;
    durations only at or after ``since_t``."""

    def __init__(
        self, window_s: int, since_t: float | None, starts: Mapping[str, Mapping[str, float]]
    ) -> None:
        self.window_s = window_s
        self.since_t = since_t
        self.starts = starts  # per topic, per group: the time of the group's first event
        self.backlog: BacklogParts = {}
        # per (topic, metric): the durations' windows (unix s) and values (ms)
        self.values: dict[tuple[str, str], tuple[list[int], list[float]]] = {}

    def _w(self, t: float) -> int:
        return math.floor(t / self.window_s) * self.window_s

    def _values(self, topic: str, metric: str) -> tuple[list[int], list[float]]:
        found = self.values.get((topic, metric))
        if found is None:
            found = self.values[(topic, metric)] = ([], [])
        return found

    def _value(self, topic: str, metric: str, at: float | None, start: float | None) -> None:
        if at is None or start is None or (self.since_t is not None and at < self.since_t):
            return
        windows, values = self._values(topic, metric)
        windows.append(self._w(at))
        values.append((at - start) * 1000.0)

    def add_parts(self, parts: BacklogParts) -> None:
        """Backlog parts found elsewhere (``kapok.analytics.common``), merged into ``backlog``."""
        for key, (ready, in_flight, open_since, closed_since) in parts.items():
            mine = self._parts(*key)
            mine[0] += ready
            mine[1] += in_flight
            for i, since in ((2, open_since), (3, closed_since)):
                if since is not None:
                    mine[i] = since if mine[i] is None else min(mine[i], since)

    def _parts(self, topic: str, group: str, window_t: int) -> list[Any]:
        parts = self.backlog.get((topic, group, window_t))
        if parts is None:
            parts = self.backlog[(topic, group, window_t)] = [0, 0, None, None]
        return parts

    def message(
        self,
        evs: Sequence[str],
        topics: Sequence[str],
        groups: Sequence[str | None],
        ts: Sequence[float],
        creates: Sequence[float | None],
        delivers: Sequence[float | None],
        attempts: Sequence[int | None],
        i: int,
        j: int,
    ) -> float | None:
        """One message: its events are rows ``i`` to ``j`` (excluded) of the columns given.
        Returns when its last entry ended (every entry gone: acked, dead-lettered, deleted
        …), −inf with no entry, None while an entry is still unacked or not yet due."""
        topic = None
        created = deliver_at = deleted_t = None
        steps: list[Step] = []
        for k in range(i, j):
            ev = evs[k]
            if ev == "published":
                if topic is None:
                    topic = topics[k]
                c = creates[k]
                if c is not None and (created is None or c < created):
                    created = c
                d = delivers[k]
                if d is not None and (deliver_at is None or d < deliver_at):
                    deliver_at = d
            elif ev == "deleted":
                if deleted_t is None or ts[k] < deleted_t:
                    deleted_t = ts[k]
            elif ev in _GROUP_KINDS:
                group = groups[k]
                if group is None:
                    continue
                attempt = float(attempts[k] or 0)
                if ev == "delivered":
                    steps.append((ts[k], attempt * 2, _DELIVERED, group, False))
                elif ev == "retried":
                    steps.append((ts[k], attempt * 2 + 1, _RETRIED, group, False))
                else:
                    steps.append((ts[k], _LAST, _END, group, ev == "acked"))
        if topic is None:  # its ``published`` event is not in the input
            topic = topics[i]
        delayed = created is not None and deliver_at is not None and deliver_at > created
        delay_s = deliver_at - created if delayed else None  # type: ignore[operator]
        due = None if created is None else created + (delay_s or 0.0)
        if delay_s is not None:
            self._value(topic, "delay", created, created - delay_s)  # type: ignore[operator]
        touched = {step[3] for step in steps}
        closed: float | None = -math.inf
        for group, start in self.starts.get(topic, {}).items():
            if group in touched or (created is not None and start <= created):
                own = [step for step in steps if step[3] == group]
                gone = self._entry(topic, group, created, due, deleted_t, own)
                closed = None if closed is None or gone is None else max(closed, gone)
        return closed

    def _entry(
        self,
        topic: str,
        group: str,
        created: float | None,
        due: float | None,
        deleted_t: float | None,
        own: list[Step],
    ) -> float | None:
        """Walk one entry; returns when it was gone (None: it never was)."""
        if due is not None:
            own.append((due, -1.0, _DUE, group, False))
        if deleted_t is not None:
            own.append((deleted_t, _LAST * 2, _DELETED, group, False))
        own.sort()
        state = _UNKNOWN
        began = ended = gone = first_delivery = last_delivery = acked = acked_delivery = None
        # The state changes, summed per window before they reach ``backlog``: most entries
        # live within one window (one dict update, not one a change).
        w = self.window_s
        window_t: int | None = None
        d_ready = d_in_flight = 0
        for t, _, kind, _, ack in own:
            live = state != _GONE
            if not live:
                new = _GONE
            elif kind == _DUE:
                new = _READY if state == _UNKNOWN else state
            elif kind == _DELIVERED:
                new = _IN_FLIGHT
            elif kind == _RETRIED:
                new = _READY
            else:
                new = _GONE
            if new != state:
                at = math.floor(t / w) * w
                if at != window_t:
                    if window_t is not None:
                        parts = self._parts(topic, group, window_t)
                        parts[0] += d_ready
                        parts[1] += d_in_flight
                    window_t, d_ready, d_in_flight = at, 0, 0
                d_ready += (new == _READY) - (state == _READY)
                d_in_flight += (new == _IN_FLIGHT) - (state == _IN_FLIGHT)
            if began is None and new in _UNACKED:
                began = t
            if state in _UNACKED and new == _GONE:
                ended = t
            if gone is None and new == _GONE:
                gone = t
            if live and kind == _DELIVERED:
                if first_delivery is None:
                    first_delivery = t
                last_delivery = t
            if live and ack:
                acked, acked_delivery = t, last_delivery
            state = new
        if window_t is not None:
            parts = self._parts(topic, group, window_t)
            parts[0] += d_ready
            parts[1] += d_in_flight
        self._value(topic, "latency", acked, created)
        self._value(topic, "processing", acked, acked_delivery)
        self._value(topic, "queue_wait", first_delivery, due)
        if began is None:
            return gone
        since = due if due is not None else began  # its first known step without its ``published``
        if ended is None:  # unacked at every window end after it began
            parts = self._parts(topic, group, self._w(began))
            parts[2] = since if parts[2] is None else min(parts[2], since)
            return gone
        w = self.window_s
        for n in range(math.floor(began / w), math.floor(ended / w)):  # the window ends before its end
            parts = self._parts(topic, group, n * w)
            parts[3] = since if parts[3] is None else min(parts[3], since)
        return gone
