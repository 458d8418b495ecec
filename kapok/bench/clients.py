"""Minimal raw aiohttp load clients for both protocols, written for low client-side cost.

Native (``/v1/ws``):
  * ``NativeProducer`` sends pre-encoded ``pub`` frames of ``batch`` messages and keeps at
    most ``window`` messages unconfirmed; every ``puback`` frees ``len(codes)``.
  * ``NativeConsumer`` subscribes with manual acks and answers every ``msg`` frame with one
    ``ack`` frame holding all of that frame's codes.

KapokMQ (``/Producers/Conn``, ``/Consumers/Conn``):
  * ``CompatProducer`` does the key handshake, then fires one JSON frame per message, keeping
    at most ``window`` without their ``ok``.
  * ``CompatConsumer`` does the handshake and acks every pushed message by sending its raw
    ``MessageCode``.

Round trip (both protocols): a producer sends one message, waits for its confirmation in
the same task (no reply reader: the fewest client-side loop turns), and records the time.

Latency payloads start with ``STAMP_DIGITS`` digits of ``time.monotonic_ns()`` (one clock
for every process of the machine); the rest is padding up to the payload size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import aiohttp
from aiohttp import WSMsgType

from kapok.protocol.kapokmq import ASK_KEY, KEY_OK, decode_push, decode_reply, encode_produce
from kapok.protocol.native import decode_frame, encode_pub, encode_settle, encode_sub

__all__ = [
    "STAMP_DIGITS",
    "BenchError",
    "CompatConsumer",
    "CompatProducer",
    "Consumer",
    "Gauge",
    "NativeConsumer",
    "NativeProducer",
    "Producer",
    "Tally",
    "Window",
    "padding",
]

STAMP_DIGITS = 20
CONNECT_TIMEOUT_S = 15.0

_DATA = (WSMsgType.TEXT, WSMsgType.BINARY)


class BenchError(Exception):
    """A load client could not do its job (refused, closed, wrong reply)."""


class Gauge(Protocol):
    """A shared counter the orchestrator reads for its progress line (``multiprocessing.Value``)."""

    value: int


def padding(size: int, stamped: bool) -> str:
    return "x" * max(0, size - STAMP_DIGITS if stamped else size)


def _stamp(pad: str) -> str:
    return f"{time.monotonic_ns():0{STAMP_DIGITS}d}{pad}"


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


async def _native_connect(session: aiohttp.ClientSession, ws_url: str, key: str, name: str) -> Any:
    return await session.ws_connect(
        f"{ws_url}/v1/ws?client={name}",
        headers={"Authorization": f"Bearer {key}"},
        max_msg_size=0,
        timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
    )


async def _compat_connect(session: aiohttp.ClientSession, url: str, key: str) -> Any:
    ws = await session.ws_connect(url, max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=5.0))
    ask = await ws.receive_str(timeout=CONNECT_TIMEOUT_S)
    if ask != ASK_KEY:
        raise BenchError(f"unexpected greeting from {url}: {ask[:80]!r}")
    await ws.send_str(key)
    answer = await ws.receive_str(timeout=CONNECT_TIMEOUT_S)
    if answer != KEY_OK:
        raise BenchError(f"the node refused the secret key: {answer[:80]!r}")
    return ws


def _closed(ws: Any, what: str) -> BenchError:
    exc = ws.exception()
    detail = f": {exc}" if exc else f" (close code {ws.close_code})"
    return BenchError(f"the node closed the {what} connection{detail}")


def _native_error(frame: dict[str, Any]) -> BenchError:
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


class _ProducerBase:
    def __init__(
        self,
        ws_url: str,
        key: str,
        topic: str,
        name: str,
        size: int,
        window: int,
        gauge: Gauge,
        *,
        reader: bool = True,
    ) -> None:
        self.ws_url = ws_url
        self.key = key
        self.topic = topic
        self.name = name
        self.size = size
        self.window = Window(window, gauge)
        self.ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._read_replies = reader  # False: ``roundtrip`` reads each reply itself
        self._closing = False

    def _start_reader(self) -> None:
        if self._read_replies:
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type in _DATA:
                    self._reply(msg.data)
                elif msg.type is WSMsgType.ERROR:
                    break
            if not self._closing:
                raise _closed(self.ws, "producer")
        except BenchError as exc:
            self.window.fail(exc)
        except Exception as exc:  # a malformed reply: report it, do not hang the sender
            self.window.fail(BenchError(f"bad reply: {type(exc).__name__}: {exc}"))

    def _reply(self, data: str | bytes) -> None:
        raise NotImplementedError

    async def _send_stamped(self, due: int, pad: str) -> int:
        """Send some of the ``due`` messages, each stamped with the send time; returns how many."""
        raise NotImplementedError

    async def _send_one(self) -> None:
        """Send one message of ``size`` bytes (a frame built once and reused)."""
        raise NotImplementedError

    async def roundtrip(self, n: int, until: float, samples: list[int]) -> None:
        """One message in flight: send it, read replies until it is confirmed, record the
        time from send to confirmation (ns); until ``n`` are confirmed or ``until`` passes."""
        window, ws = self.window, self.ws
        clock = time.monotonic_ns
        end_ns = int(until * 1e9)
        while window.confirmed < n:
            t0 = clock()
            if t0 >= end_ns:
                break
            window.used += 1
            await self._send_one()
            while window.used:
                msg = await ws.receive()
                if msg.type not in _DATA:
                    raise _closed(ws, "producer")
                self._reply(msg.data)
            samples.append(clock() - t0)

    async def paced(self, n: int, rate: float, deadline: float) -> None:
        pad = padding(self.size, True)
        t0 = time.monotonic()
        sent = 0
        while sent < n and time.monotonic() < deadline:
            due = min(n, int((time.monotonic() - t0) * rate) + 1)
            while sent < due:
                sent += await self._send_stamped(due - sent, pad)
            # >= 1 ms: the loop's timers have millisecond resolution
            await asyncio.sleep(max(0.001, t0 + sent / rate - time.monotonic()))
        await self.window.drain()

    async def close(self) -> None:
        self._closing = True
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            self._reader.cancel()


class NativeProducer(_ProducerBase):
    """``pub`` frames of ``batch`` messages, at most ``window`` messages unconfirmed."""

    def __init__(self, *args: Any, batch: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch = max(1, batch)
        self._one: bytes | None = None

    async def connect(self, session: aiohttp.ClientSession) -> None:
        self.ws = await _native_connect(session, self.ws_url, self.key, self.name)
        self._start_reader()

    def _reply(self, data: str | bytes) -> None:
        frame = decode_frame(data)
        op = frame.get("op")
        if op == "puback":
            self.window.confirm(len(frame["codes"]))
        elif op == "error":
            raise _native_error(frame)

    def _frame(self, k: int, make: Callable[[], str]) -> bytes:
        return encode_pub(0, [{"data": make()} for _ in range(k)], self.topic)

    async def burst(self, n: int) -> None:
        body = padding(self.size, False)
        full = self._frame(self.batch, lambda: body)
        sent = 0
        while sent < n:
            k = min(self.batch, n - sent)
            await self.window.take(k)
            await self.ws.send_bytes(full if k == self.batch else self._frame(k, lambda: body))
            sent += k
        await self.window.drain()

    async def _send_stamped(self, due: int, pad: str) -> int:
        # Everything due at this tick goes in one frame (at most a batch).
        k = min(due, self.batch)
        await self.window.take(k)
        await self.ws.send_bytes(self._frame(k, partial(_stamp, pad)))
        return k

    async def _send_one(self) -> None:
        if self._one is None:
            body = padding(self.size, False)
            self._one = self._frame(1, lambda: body)
        await self.ws.send_bytes(self._one)


class CompatProducer(_ProducerBase):
    """KapokMQ producer: one ``{"MessageData", "DelayTime"}`` frame per message, ``ok`` each."""

    _one: str | None = None

    async def connect(self, session: aiohttp.ClientSession) -> None:
        url = f"{self.ws_url}/Producers/Conn/{self.topic}/{self.name}"
        self.ws = await _compat_connect(session, url, self.key)
        self._start_reader()

    def _reply(self, data: str | bytes) -> None:
        refusal = decode_reply(str(data))
        if refusal is None:
            self.window.confirm(1)
            return
        raise BenchError(f"node refused a message: {refusal[:200]}")

    def _message(self) -> str:
        return encode_produce(padding(self.size, False))

    async def burst(self, n: int) -> None:
        frame = self._message()
        take, send = self.window.take, self.ws.send_str
        for _ in range(n):
            await take(1)
            await send(frame)
        await self.window.drain()

    async def _send_one(self) -> None:
        if self._one is None:
            self._one = self._message()
        await self.ws.send_str(self._one)

    async def _send_stamped(self, due: int, pad: str) -> int:
        await self.window.take(1)
        await self.ws.send_str(encode_produce(_stamp(pad)))
        return 1


class _ConsumerBase:
    def __init__(self, ws_url: str, key: str, topic: str, name: str, gauge: Gauge) -> None:
        self.ws_url = ws_url
        self.key = key
        self.topic = topic
        self.name = name
        self.gauge = gauge
        self.ws: Any = None

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


class NativeConsumer(_ConsumerBase):
    """Manual-ack subscription; one ``ack`` frame per received ``msg`` frame."""

    def __init__(self, *args: Any, prefetch: int, group: str | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefetch = prefetch
        self.group = group
        self.sub = 0

    async def connect(self, session: aiohttp.ClientSession) -> None:
        self.ws = await _native_connect(session, self.ws_url, self.key, self.name)
        await self.ws.send_bytes(encode_sub(1, self.topic, group=self.group or None, prefetch=self.prefetch))
        msg = await self.ws.receive(timeout=CONNECT_TIMEOUT_S)
        if msg.type not in _DATA:
            raise _closed(self.ws, "consumer")
        frame = decode_frame(msg.data)
        if frame.get("op") == "error":
            raise _native_error(frame)
        if frame.get("op") != "subok":
            raise BenchError(f"expected subok, got {str(msg.data)[:200]}")
        self.sub = frame["sub"]

    async def run(self, tally: Tally, latencies: list[int] | None) -> None:
        ws, gauge, sub = self.ws, self.gauge, self.sub
        async for msg in ws:
            if msg.type not in _DATA:
                break
            frame = decode_frame(msg.data)
            msgs = frame.get("msgs")
            if frame.get("op") != "msg" or msgs is None:
                if frame.get("op") == "error":
                    raise _native_error(frame)
                continue
            if latencies is not None:
                now = time.monotonic_ns()
                latencies.extend(now - int(m["data"][:STAMP_DIGITS]) for m in msgs)
            await ws.send_bytes(encode_settle("ack", sub, [m["code"] for m in msgs]))
            tally.add(len(msgs))
            gauge.value += len(msgs)
        raise _closed(ws, "consumer")


class CompatConsumer(_ConsumerBase):
    """KapokMQ consumer: acks each pushed message by sending its ``MessageCode``."""

    async def connect(self, session: aiohttp.ClientSession) -> None:
        url = f"{self.ws_url}/Consumers/Conn/{self.topic}/{self.name}"
        self.ws = await _compat_connect(session, url, self.key)

    async def run(self, tally: Tally, latencies: list[int] | None) -> None:
        ws, gauge = self.ws, self.gauge
        async for msg in ws:
            if msg.type is not WSMsgType.TEXT:
                break
            push = decode_push(msg.data)
            if push is None:
                raise BenchError(f"node error: {msg.data[:200]}")
            if latencies is not None:
                latencies.append(time.monotonic_ns() - int(push["data"][:STAMP_DIGITS]))
            await ws.send_str(push["code"])
            tally.add(1)
            gauge.value += 1
        raise _closed(ws, "consumer")
