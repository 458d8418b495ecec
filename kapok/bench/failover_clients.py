"""The failover trial's clients (``kapok.bench.failover``), on the native protocol.

A producer that publishes numbered messages, with confirmations, to whichever node of the
pair says it is active, and moves on when that node refuses or goes quiet; a consumer that
subscribes on whichever node takes consumers and acks every message after a little work;
the ``Tally`` of what was confirmed and what was delivered; and the ``Watch`` that polls
every node's ``/health`` for a pair with two active nodes, or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field

import aiohttp

from kapok.protocol.native import decode_frame, encode_pub, encode_settle, encode_sub

__all__ = ["AUTH", "PATIENCE_S", "TOPIC", "Tally", "Watch", "confirmed_after", "consume", "produce"]

SECRET = "test"
AUTH = {"Authorization": f"Bearer {SECRET}"}
TOPIC = "trial"
BATCH = 10
INFLIGHT = 4
# The consumer works this long per pushed frame before it acks, so a backlog of confirmed
# but undelivered messages has built up on the master when it is killed: those must come
# from the slave.
WORK_S = 0.01
# How long the producer waits for a node's answer before it tries the other one (a frozen or
# cut-off node answers nothing); a client's publish time-out plays this part.
PATIENCE_S = 1.0


@dataclass
class Tally:
    confirmed: set[str] = field(default_factory=set)
    seen: dict[str, int] = field(default_factory=dict)  # payload -> deliveries
    confirmed_at: list[tuple[float, float]] = field(default_factory=list)  # (sent, confirmed), monotonic


async def produce(
    http: aiohttp.ClientSession, urls: list[str], tally: Tally, stop: asyncio.Event, rate: float = 0.0
) -> None:
    """Publish numbered messages with ``INFLIGHT`` batches unconfirmed to the node of the pair
    that says it is active (as a client following the pair would), moving on when it refuses
    or goes quiet. (It ends on ``stop``, not on a cancel: aiohttp's receive with a timeout
    may turn a cancel into a timeout.)"""
    counter = itertools.count()
    probe = aiohttp.ClientTimeout(total=0.25)
    while not stop.is_set():
        active = await asyncio.gather(*(_active(http, url, probe) for url in urls))
        for url in (u for u, up in zip(urls, active, strict=True) if up):
            pending: dict[int, tuple[list[str], float]] = {}
            with contextlib.suppress(aiohttp.ClientError, ConnectionError, TimeoutError):
                closing = aiohttp.ClientWSTimeout(ws_close=0.2)  # a stopping node may not answer a close
                async with http.ws_connect(f"{url}/v1/ws", headers=AUTH, timeout=closing) as ws:
                    rid = 0
                    while not stop.is_set():
                        while len(pending) < INFLIGHT:
                            rid += 1
                            payloads = [f"m{next(counter)}" for _ in range(BATCH)]
                            pending[rid] = (payloads, time.monotonic())
                            await ws.send_bytes(encode_pub(rid, [{"data": p} for p in payloads], TOPIC))
                        msg = await ws.receive(timeout=PATIENCE_S)
                        if msg.type is not aiohttp.WSMsgType.TEXT:
                            break
                        frame = decode_frame(msg.data)
                        payloads, sent_at = pending.pop(frame.get("id", 0), ([], 0.0))
                        if rate:
                            await asyncio.sleep(BATCH / rate)
                        if frame.get("op") == "puback":
                            tally.confirmed.update(payloads)
                            tally.confirmed_at.append((sent_at, time.monotonic()))
                        elif frame.get("code") in ("not_active", "fenced"):
                            break  # this node takes no producers: look again
            break
        await asyncio.sleep(0.05)


async def consume(http: aiohttp.ClientSession, urls: list[str], tally: Tally, stop: asyncio.Event) -> None:
    """Subscribe on whichever node takes consumers; ack everything; move on when it goes."""
    while not stop.is_set():
        for url in urls:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError, TimeoutError):
                async with http.ws_connect(f"{url}/v1/ws", headers=AUTH) as ws:
                    await ws.send_bytes(encode_sub(1, TOPIC, prefetch=200))
                    while not stop.is_set():
                        msg = await ws.receive(timeout=1.0)
                        if msg.type is not aiohttp.WSMsgType.TEXT:
                            break
                        frame = decode_frame(msg.data)
                        if frame.get("op") == "error":
                            break
                        if frame.get("op") != "msg":
                            continue
                        for m in frame["msgs"]:
                            tally.seen[m["data"]] = tally.seen.get(m["data"], 0) + 1
                        await asyncio.sleep(WORK_S)
                        codes = [m["code"] for m in frame["msgs"]]
                        await ws.send_bytes(encode_settle("ack", frame["sub"], codes))
        await asyncio.sleep(0.05)


def confirmed_after(tally: Tally, since: float) -> list[float]:
    return [confirmed for sent, confirmed in tally.confirmed_at if sent > since]


@dataclass
class Watch:
    """Every 50 ms, each node's ``/health``: how often both were active, the longest stretch
    with neither."""

    both_active: int = 0
    no_active_s: float = 0.0
    _none_since: float | None = None

    async def run(self, http: aiohttp.ClientSession, urls: list[str], stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=0.5)
        while not stop.is_set():
            polled = await asyncio.gather(*(_active(http, url, timeout) for url in urls))
            now = time.monotonic()
            self.both_active += sum(polled) > 1
            if any(polled):
                self._none_since = None
            else:
                self._none_since = self._none_since or now
                self.no_active_s = max(self.no_active_s, now - self._none_since)
            await asyncio.sleep(0.05)


async def _active(http: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout) -> bool:
    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
        async with http.get(url + "/health", timeout=timeout) as resp:
            return (await resp.json()).get("active") is True
    return False
