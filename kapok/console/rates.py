"""Publish / deliver / ack rates for the console: a small bounded ring of counter samples.

The broker keeps only monotonic counters (``Broker.stats``, ``Topic.published``, per
consumer delivered and acked); a rate needs two readings apart in time. ``RateSampler``
(the driver) reads them every ``SAMPLE_S`` seconds into rings of fixed length: the node
totals for ``HISTORY`` samples (the Overview chart: ten minutes), the per-topic and
per-consumer figures for ``DETAIL`` samples only (rates over the last ten seconds), so
memory stays bounded however many topics and consumers come and go. The arithmetic is the
pure functions below.

A consumer's counters vanish with it, so a group's rate is the sum over the consumers
present at both ends of the window: exact except for a consumer's last seconds.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from kapok.service import BrokerService
from kapok.tasks import cancel_and_wait

__all__ = ["RATES", "RateSampler", "Sample", "history_chart", "rate", "rates_ctx", "total_rates"]

SAMPLE_S: Final = 2.0
HISTORY: Final = 300  # node totals: 10 minutes
DETAIL: Final = 6  # per topic and consumer: 10 seconds
TOTALS: Final = ("published", "delivered", "acked", "redelivered", "dead_lettered")


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # unix seconds
    totals: tuple[int, ...]  # the ``TOTALS`` counters, in that order
    topics: Mapping[str, int] | None = None  # published per topic (detail samples only)
    consumers: Mapping[int, tuple[int, int]] | None = None  # consumer id -> (delivered, acked)


def rate(older: int, newer: int, seconds: float) -> float:
    """Per second; a counter that went backwards (a restart, a consumer that left) is 0."""
    if seconds <= 0 or newer < older:
        return 0.0
    return (newer - older) / seconds


def total_rates(first: Sample, last: Sample) -> dict[str, float]:
    dt = last.t - first.t
    return {name: rate(a, b, dt) for name, a, b in zip(TOTALS, first.totals, last.totals, strict=True)}


CHART_SERIES: Final = (("publish", "published"), ("deliver", "delivered"), ("ack", "acked"))


def history_chart(samples: list[Sample]) -> dict[str, Any]:
    """Per-interval publish / deliver / ack rates of the node, as a line chart's data: ``x``
    is the end of each interval (unix seconds)."""
    index = {name: TOTALS.index(name) for _, name in CHART_SERIES}
    x: list[float] = []
    values: dict[str, list[float]] = {label: [] for label, _ in CHART_SERIES}
    for a, b in itertools.pairwise(samples):
        x.append(b.t)
        for label, name in CHART_SERIES:
            values[label].append(round(rate(a.totals[index[name]], b.totals[index[name]], b.t - a.t), 2))
    series = [{"name": label, "values": values[label]} for label, _ in CHART_SERIES]
    return {"x": x, "xfmt": "time", "unit": "messages/s", "series": series}


class RateSampler:
    """Reads the service's counters every ``SAMPLE_S`` seconds into bounded rings."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self.totals: deque[Sample] = deque(maxlen=HISTORY)
        self.detail: deque[Sample] = deque(maxlen=DETAIL)
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        service = self.service
        stats = service.broker.stats
        totals = tuple(getattr(stats, name) for name in TOTALS)
        consumers = {c.id: (c.delivered, c.acked) for c in service.broker.consumers.values()}
        topics = {name: t.published for name, t in service.broker.topics.items()}
        now = service.now()
        self.totals.append(Sample(now, totals))
        self.detail.append(Sample(now, totals, topics, consumers))

    def rates(self) -> dict[str, float]:
        """Node-wide rates per second over the detail window."""
        if len(self.detail) < 2:
            return dict.fromkeys(TOTALS, 0.0)
        return total_rates(self.detail[0], self.detail[-1])

    def topic_rate(self, topic: str) -> float:
        """Publishes per second to ``topic`` over the detail window."""
        if len(self.detail) < 2:
            return 0.0
        first, last = self.detail[0], self.detail[-1]
        assert first.topics is not None and last.topics is not None
        return rate(first.topics.get(topic, 0), last.topics.get(topic, 0), last.t - first.t)

    def consumer_rates(self, consumer_id: int) -> tuple[float, float]:
        """(deliveries, acks) per second of one consumer over the detail window."""
        if len(self.detail) < 2:
            return 0.0, 0.0
        first, last = self.detail[0], self.detail[-1]
        assert first.consumers is not None and last.consumers is not None
        a, b = first.consumers.get(consumer_id), last.consumers.get(consumer_id)
        if a is None or b is None:
            return 0.0, 0.0
        dt = last.t - first.t
        return rate(a[0], b[0], dt), rate(a[1], b[1], dt)

    def history_chart(self) -> dict[str, Any]:
        return history_chart(list(self.totals))

    async def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.sample()


RATES: Final = web.AppKey("console_rates", RateSampler)


async def rates_ctx(app: web.Application) -> AsyncIterator[None]:
    """Samples while the app runs (``app[RATES]`` is set when the console is set up)."""
    sampler = app[RATES]
    await sampler.start()
    yield
    await sampler.aclose()
