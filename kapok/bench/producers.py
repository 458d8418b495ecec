"""The raw aiohttp load producers of both protocols, written for low client-side cost.

* ``NativeProducer`` (``/v1/ws``) sends pre-encoded ``pub`` frames of ``batch`` messages and
  keeps at most ``window`` messages unconfirmed; every ``puback`` frees ``len(codes)``.
* ``CompatProducer`` (KapokMQ's ``/Producers/Conn``) does the key handshake, then fires one
  JSON frame per message, keeping at most ``window`` without their ``ok``.

Round trip (both protocols): a producer sends one message, waits for its confirmation in
the same task (no reply reader: the fewest client-side loop turns), and records the time.
Latency payloads are stamped with the send time (``kapok.bench.clients.STAMP_DIGITS``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import aiohttp
from aiohttp import WSMsgType

from kapok.bench.clients import (
    DATA,
    STAMP_DIGITS,
    BenchError,
    Gauge,
    Window,
    closed,
    compat_connect,
    native_connect,
    native_error,
    padding,
)
from kapok.protocol.kapokmq import decode_reply, encode_produce
from kapok.protocol.native import decode_frame, encode_pub

__all__ = ["CompatProducer", "NativeProducer"]


def _stamp(pad: str) -> str:
    return f"{time.monotonic_ns():0{STAMP_DIGITS}d}{pad}"


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
                if msg.type in DATA:
                    self._reply(msg.data)
                elif msg.type is WSMsgType.ERROR:
                    break
            if not self._closing:
                raise closed(self.ws, "producer")
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
                if msg.type not in DATA:
                    raise closed(ws, "producer")
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
        self.ws = await native_connect(session, self.ws_url, self.key, self.name)
        self._start_reader()

    def _reply(self, data: str | bytes) -> None:
        frame = decode_frame(data)
        op = frame.get("op")
        if op == "puback":
            self.window.confirm(len(frame["codes"]))
        elif op == "error":
            raise native_error(frame)

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
        self.ws = await compat_connect(session, url, self.key)
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
