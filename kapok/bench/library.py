"""The client library as a bench load client: ``kapok.client.Producer`` behind the bench's
``Producer`` protocol, so the ``client`` workload can set it beside the raw clients.

It publishes the way an application would: ``await producer.send(payload)`` per message
(each with its generated ``dedup_id``, as by default), batches of ``batch`` messages, at most
``inflight`` batches unconfirmed, then ``flush()``. Confirmations are counted from the
producer's stats, not with a callback per message, so the bench adds no cost of its own.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from kapok.bench.clients import Gauge, Window, padding
from kapok.client import Producer

__all__ = ["LibraryProducer"]


class LibraryProducer:
    def __init__(
        self, ws_url: str, key: str, topic: str, name: str, size: int, *, protocol: str, batch: int,
        inflight: int, gauge: Gauge,
    ) -> None:  # fmt: skip
        self.url = "http" + ws_url.removeprefix("ws")
        self.size = size
        self.window = Window(batch * inflight, gauge)
        self._gauge = gauge
        self.producer = Producer(
            self.url, secret=key, topic=topic, name=name, batch_size=batch,
            protocol="kapokmq" if protocol == "kapokmq" else "native",
            max_inflight=inflight, max_pending=batch * inflight, publish_timeout_s=600.0, dedup=False,
        )  # fmt: skip

    async def connect(self, session: aiohttp.ClientSession) -> None:
        await self.producer.start()
        await self.producer.publish("warm-up")  # the connection is open before the clock starts
        self.window.confirmed = 0

    def _done(self, confirmed_before: int) -> None:
        confirmed = self.producer.stats.confirmed - confirmed_before
        self.window.confirmed += confirmed
        self.window.t_last = time.monotonic()
        self._gauge.value += confirmed

    async def burst(self, n: int) -> None:
        before = self.producer.stats.confirmed
        body = padding(self.size, False)
        send = self.producer.send
        for _ in range(n):
            await send(body)
        await self.producer.flush()
        self._done(before)

    async def paced(self, n: int, rate: float, deadline: float) -> None:
        before = self.producer.stats.confirmed
        body = padding(self.size, False)
        t0 = time.monotonic()
        for i in range(n):
            if time.monotonic() > deadline:
                break
            await self.producer.send(body)
            await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
        await self.producer.flush()
        self._done(before)

    async def roundtrip(self, n: int, until: float, samples: list[int]) -> None:
        before = self.producer.stats.confirmed
        body = padding(self.size, False)
        clock = time.monotonic_ns
        end_ns = int(until * 1e9)
        for _ in range(n):
            t0 = clock()
            if t0 >= end_ns:
                break
            await self.producer.publish(body)
            samples.append(clock() - t0)
        self._done(before)

    async def close(self) -> None:
        await self.producer.drain(timeout_s=5.0)
