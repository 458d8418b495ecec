"""The producer's bookkeeping per pair: batches, lanes, and what a lane has measured (pure).

A ``Batch`` is a run of messages sent in one ``pub`` frame. A ``Lane`` is one pair of the
cluster as the producer sees it: the member that serves it now, the connection, the open
batch, the queue of sealed batches in sequence order, and two figures the producer
measures itself for ``balance="p2c"``:

``load``     messages placed on this lane and not yet settled (open, queued or in flight).
             It counts from the moment a message is placed, so a burst of sends spreads
             by it before anything is on the wire.
``latency``  a moving average of the time from writing a batch to its ``puback``, decaying
             with time (``LATENCY_DECAY_S``) rather than per sample, so a lane's figure
             means the same at 10 and at 10,000 batches a second.

The cost of a lane is ``slowness × (load + 1)``, after the measure of Finagle's and gRPC's
power-of-two-choices balancers: a node that answers slowly, or holds more of this
producer's work, gets less of it. ``slowness`` is the lane's latency over the fastest
lane's, less a tolerance (``LATENCY_TOLERANCE``), and at least 1: answer times within twice
the fastest count as equal, since nodes that are alike wander that much on a busy machine
without meaning anything (and a balancer that chased it would skew an even load), while a
node ten times slower gets about a ninth of the share. Gossip's load figure is not used: it
is seconds old and counts connections, which every client opens to every master alike.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from kapok.client.session import NodeSession
from kapok.client.view import Member

__all__ = ["LATENCY_DECAY_S", "LATENCY_TOLERANCE", "Batch", "Lane", "costs"]

LATENCY_DECAY_S = 1.0
LATENCY_TOLERANCE = 2.0


@dataclasses.dataclass(slots=True)
class Batch:
    seq: int
    deadline: float  # monotonic: its messages fail with PublishTimeoutError then, wherever they are
    msgs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    futures: list[asyncio.Future[str]] = dataclasses.field(default_factory=list)
    size: int = 0
    attempts: int = 0
    pinned_until: float = 0.0  # while in the future: in doubt, only for its own pair
    part: int = 0  # the place among the singles of one split batch (they share its seq)

    def singles(self) -> list[Batch]:
        """One batch per message, in order, each keeping this batch's place and deadline."""
        return [
            Batch(self.seq, self.deadline, [m], [f], len(m["data"]), self.attempts, part=self.part + i)
            for i, (m, f) in enumerate(zip(self.msgs, self.futures, strict=True))
        ]


class Lane:
    """One pair: its member, connection, open batch, queue and measurements."""

    def __init__(self, pair: str, member: Member | None) -> None:
        self.pair = pair
        self.member = member  # the member that serves the pair, or served it last
        self.active = member is not None  # some member serves the pair now
        self.gone = False  # the pair left the cluster
        self.session: NodeSession | None = None
        self.connecting: asyncio.Task[NodeSession] | None = None
        self.gen = 0  # bumped on every failure: late reports of an old connection are ignored
        self.open: Batch | None = None
        self.timer: asyncio.Handle | None = None
        self.queue: collections.deque[Batch] = collections.deque()  # ordered by seq
        self.inflight = 0  # batches
        self.load = 0  # messages placed here and not yet settled
        self.failures = 0  # connection failures in a row
        self.limited = 0  # rate-limit refusals in a row
        self.down_until = 0.0
        self.serial_until = 0.0  # till then one batch in flight at a time (after a rate limit)
        self.latency = 0.0  # seconds; 0 = not measured yet
        self._measured_at = 0.0

    @property
    def name(self) -> str:
        return self.member.name if self.member is not None else self.pair

    def sendable(self, now: float) -> bool:
        return self.active and not self.gone and self.down_until <= now

    def hold(self, batch: Batch) -> None:
        """Put a batch in the queue in seq order (it was sent before everything queued after it)."""
        places = [(b.seq, b.part) for b in self.queue]
        self.queue.insert(bisect.bisect(places, (batch.seq, batch.part)), batch)
        self.load += len(batch.msgs)

    def take(self, batch: Batch) -> Batch:
        """Remove a queued batch (it goes elsewhere, or fails)."""
        self.queue.remove(batch)
        self.load -= len(batch.msgs)
        return batch

    def take_unpinned(self) -> list[Batch]:
        return [self.take(b) for b in [b for b in self.queue if not b.pinned_until]]

    def observe(self, seconds: float, now: float) -> None:
        """One batch's time from write to confirmation."""
        if not self.latency:
            self.latency = seconds
        else:
            keep = math.exp(-(now - self._measured_at) / LATENCY_DECAY_S)
            self.latency = self.latency * keep + seconds * (1.0 - keep)
        self._measured_at = now


def costs(lanes: Iterable[Lane]) -> dict[str, float]:
    """Each lane's p2c cost; a lane not measured yet counts as the fastest."""
    lanes = list(lanes)
    fastest = min((lane.latency for lane in lanes if lane.latency), default=0.0)
    out = {}
    for lane in lanes:
        slowness = lane.latency / fastest - (LATENCY_TOLERANCE - 1.0) if lane.latency else 1.0
        out[lane.pair] = max(1.0, slowness) * (lane.load + 1)
    return out
