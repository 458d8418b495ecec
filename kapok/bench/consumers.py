"""The raw aiohttp load consumers of both protocols, written for low client-side cost.

* ``NativeConsumer`` (``/v1/ws``) subscribes with manual acks and answers every ``msg``
  frame with one ``ack`` frame holding all of that frame's codes.
* ``CompatConsumer`` (KapokMQ's ``/Consumers/Conn``) does the key handshake and acks every
  pushed message by sending its raw ``MessageCode``.

With latencies asked for, each payload's leading ``STAMP_DIGITS`` digits (the producer's
send time) are read back on arrival.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from aiohttp import WSMsgType

from kapok.bench.clients import (
    CONNECT_TIMEOUT_S,
    DATA,
    STAMP_DIGITS,
    BenchError,
    Gauge,
    Tally,
    closed,
    compat_connect,
    native_connect,
    native_error,
)
from kapok.protocol.kapokmq import decode_push
from kapok.protocol.native import decode_frame, encode_settle, encode_sub

__all__ = ["CompatConsumer", "NativeConsumer"]


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
        self.ws = await native_connect(session, self.ws_url, self.key, self.name)
        await self.ws.send_bytes(encode_sub(1, self.topic, group=self.group or None, prefetch=self.prefetch))
        msg = await self.ws.receive(timeout=CONNECT_TIMEOUT_S)
        if msg.type not in DATA:
            raise closed(self.ws, "consumer")
        frame = decode_frame(msg.data)
        if frame.get("op") == "error":
            raise native_error(frame)
        if frame.get("op") != "subok":
            raise BenchError(f"expected subok, got {str(msg.data)[:200]}")
        self.sub = frame["sub"]

    async def run(self, tally: Tally, latencies: list[int] | None) -> None:
        ws, gauge, sub = self.ws, self.gauge, self.sub
        async for msg in ws:
            if msg.type not in DATA:
                break
            frame = decode_frame(msg.data)
            msgs = frame.get("msgs")
            if frame.get("op") != "msg" or msgs is None:
                if frame.get("op") == "error":
                    raise native_error(frame)
                continue
            if latencies is not None:
                now = time.monotonic_ns()
                latencies.extend(now - int(m["data"][:STAMP_DIGITS]) for m in msgs)
            await ws.send_bytes(encode_settle("ack", sub, [m["code"] for m in msgs]))
            tally.add(len(msgs))
            gauge.value += len(msgs)
        raise closed(ws, "consumer")


class CompatConsumer(_ConsumerBase):
    """KapokMQ consumer: acks each pushed message by sending its ``MessageCode``."""

    async def connect(self, session: aiohttp.ClientSession) -> None:
        url = f"{self.ws_url}/Consumers/Conn/{self.topic}/{self.name}"
        self.ws = await compat_connect(session, url, self.key)

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
        raise closed(ws, "consumer")
