"""What the raw aiohttp load clients share: payloads, flow control, connecting, their shapes.

The clients themselves are in ``kapok.bench.producers`` and ``kapok.bench.consumers``,
both written for low client-side cost. Here: the ``Window`` of messages a producer keeps
unconfirmed, the ``Tally`` of messages a consumer received, the ``Gauge`` the orchestrator
reads, the connection to each protocol (``/v1/ws``, and KapokMQ's key handshake), the
errors they report, and the ``Producer`` and ``Consumer`` protocols the roles drive.

Latency payloads start with ``STAMP_DIGITS`` digits of ``time.monotonic_ns()`` (one clock
for every process of the machine); the rest is padding up to the payload size.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import aiohttp
from aiohttp import WSMsgType

from kapok.protocol.kapokmq import ASK_KEY, KEY_OK

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DATA",
    "STAMP_DIGITS",
    "BenchError",
    "Consumer",
    "Gauge",
    "Producer",
    "Tally",
    "Window",
    "closed",
    "compat_connect",
    "native_connect",
    "native_error",
    "padding",
]

STAMP_DIGITS = 20
CONNECT_TIMEOUT_S = 15.0

DATA = (WSMsgType.TEXT, WSMsgType.BINARY)


class BenchError(Exception):
    """A load client could not do its job (refused, closed, wrong reply)."""


class Gauge(Protocol):
    """A shared counter the orchestrator reads for its progress line (``multiprocessing.Value``)."""

    value: int


def padding(size: int, stamped: bool) -> str:
    return "x" * max(0, size - STAMP_DIGITS if stamped else size)


class Window:
    """Messages sent but not confirmed yet, at most ``limit`` (a whole batch may exceed it
    when nothing is outstanding). A failure of the reply reader wakes and fails the sender."""

    def __init__(self, limit: int, gauge: Gauge) -> None:
        self.limit = max(1, limit)
        self.used = 0
        self.confirmed = 0
        self.t_last = 0.0
        self.failure: BaseException | None = None
        self._gauge = gauge
        self._event = asyncio.Event()

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def take(self, k: int) -> None:
        while self.used and self.used + k > self.limit:
            self._check()
            self._event.clear()
            await self._event.wait()
        self._check()
        self.used += k

    def confirm(self, k: int) -> None:
        self.used -= k
        self.confirmed += k
        self.t_last = time.monotonic()
        self._gauge.value += k
        self._event.set()

    def fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self._event.set()

    async def drain(self) -> None:
        while self.used:
            self._check()
            self._event.clear()
            await self._event.wait()
        self._check()


class Tally:
    """Messages received towards a target, with the first and last arrival time."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.got = 0
        self.t_first = 0.0
        self.t_last = 0.0
        self.done = asyncio.Event()
        if target <= 0:
            self.done.set()

    def add(self, k: int) -> None:
        now = time.monotonic()
        if not self.got:
            self.t_first = now
        self.got += k
        self.t_last = now
        if self.got >= self.target:
            self.done.set()


async def native_connect(session: aiohttp.ClientSession, ws_url: str, key: str, name: str) -> Any:
    return await session.ws_connect(
        f"{ws_url}/v1/ws?client={name}",
        headers={"Authorization": f"Bearer {key}"},
        max_msg_size=0,
        timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
    )


async def compat_connect(session: aiohttp.ClientSession, url: str, key: str) -> Any:
    ws = await session.ws_connect(url, max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=5.0))
    ask = await ws.receive_str(timeout=CONNECT_TIMEOUT_S)
    if ask != ASK_KEY:
        raise BenchError(f"unexpected greeting from {url}: {ask[:80]!r}")
    await ws.send_str(key)
    answer = await ws.receive_str(timeout=CONNECT_TIMEOUT_S)
    if answer != KEY_OK:
        raise BenchError(f"the node refused the secret key: {answer[:80]!r}")
    return ws


def closed(ws: Any, what: str) -> BenchError:
    exc = ws.exception()
    detail = f": {exc}" if exc else f" (close code {ws.close_code})"
    return BenchError(f"the node closed the {what} connection{detail}")


def native_error(frame: dict[str, Any]) -> BenchError:
    return BenchError(f"node error {frame.get('code')}: {frame.get('message')}")


class Producer(Protocol):
    window: Window

    async def connect(self, session: aiohttp.ClientSession) -> None: ...

    async def burst(self, n: int) -> None: ...

    async def paced(self, n: int, rate: float, deadline: float) -> None: ...

    async def roundtrip(self, n: int, until: float, samples: list[int]) -> None: ...

    async def close(self) -> None: ...


class Consumer(Protocol):
    async def connect(self, session: aiohttp.ClientSession) -> None: ...

    async def run(self, tally: Tally, latencies: list[int] | None) -> None: ...

    async def close(self) -> None: ...
