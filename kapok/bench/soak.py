"""``kapok bench --workload soak --minutes N``: a long mixed run that must lose nothing.

Against one node the bench started: native producers (``pub`` frames, a window of
frames in flight) and KapokMQ producers (a frame per message, replies in order), paced
together at ``--rate`` messages a second; native consumers (manual acks, and a nack with
requeue for about one delivery in a hundred) and KapokMQ consumers (an ack per code).
Every client hangs up and reconnects after a random 10-40 s of life, and at half time the
node is killed (``kill -9``) and restarted on its directory; clients reconnect as soon as
it answers again. Then the producers stop and the consumers drain the topics.

Every payload carries a unique id, so the accounting needs no help from the node:
*published* ids were sent; *confirmed* ones got their ``puback`` / ``ok``; *delivered*
ones reached a consumer at least once; *lost* = confirmed but never delivered (must be
0: a confirmed message survives even the kill); *duplicates* = deliveries beyond the
first (at-least-once: acks in flight at a disconnect or the kill are redelivered). The
node's RSS (with its archiver) is sampled every ``SAMPLE_S``; after a warm-up it must not
keep growing. The load runs in the bench's own process: a soak measures correctness and
memory over time, not throughput.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kapok.bench.harness import CaseFailed, Harness
from kapok.bench.nodes import LocalNode, Node
from kapok.bench.report import Row
from kapok.protocol.kapokmq import KEY_OK, decode_push, decode_reply, encode_produce
from kapok.protocol.native import decode_frame, encode_pub, encode_settle, encode_sub
from kapok.tasks import cancel_all

__all__ = ["Soak", "soak"]

SAMPLE_S = 10.0
LIFE_S = (10.0, 40.0)  # a client's life before it hangs up and reconnects
DRAIN_S = 120.0  # at most this long after the producers stop, for the last deliveries
NACK_RATE = 0.01
CLIENTS = 2  # of each kind: native producer, KapokMQ producer, native consumer, KapokMQ consumer
NATIVE_TOPIC, COMPAT_TOPIC = "soak_native", "soak_kapokmq"
ENDED = (
    aiohttp.WSMsgType.CLOSE,
    aiohttp.WSMsgType.CLOSED,
    aiohttp.WSMsgType.CLOSING,
    aiohttp.WSMsgType.ERROR,
)


@dataclass
class Tally:
    published: set[str] = field(default_factory=set)
    confirmed: set[str] = field(default_factory=set)
    delivered: set[str] = field(default_factory=set)
    deliveries: int = 0
    refused: int = 0  # error replies (none expected; counted, not confirmed)
    nacks: int = 0
    reconnects: int = 0  # connections after each client's first (its lives, and the kill)
    rss_mb: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, MB)


class Soak:
    def __init__(self, node: LocalNode, key: str, rate: float, seconds: float, report: Callable[[str], None]):
        self.node = node
        self.key = key
        self.rate = rate
        self.seconds = seconds
        self.report = report
        self.tally = Tally()
        self.rng = random.Random(17)
        self.producing = True
        self.running = True
        self.up = asyncio.Event()  # the node answers (cleared while it is killed)
        self.t0 = 0.0

    # ------------------------------------------------------------ the run

    async def run(self) -> Tally:
        self.t0 = time.monotonic()
        self.up.set()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=5)) as session:
            per = self.rate / (2 * CLIENTS)
            tasks = [
                *(self._forever(session, self._native_producer, i, per) for i in range(CLIENTS)),
                *(self._forever(session, self._compat_producer, i, per) for i in range(CLIENTS)),
                *(self._forever(session, self._native_consumer, i, 0) for i in range(CLIENTS)),
                *(self._forever(session, self._compat_consumer, i, 0) for i in range(CLIENTS)),
            ]
            workers = [asyncio.ensure_future(t) for t in tasks]
            try:
                await self._drive()
            finally:
                self.running = False
                await cancel_all(*workers)
        return self.tally

    async def _drive(self) -> None:
        """Sample RSS, kill and restart the node at half time, stop producing, drain."""
        killed = False
        next_sample = 0.0
        loop_end = self.t0 + self.seconds
        while time.monotonic() < loop_end:
            now = time.monotonic() - self.t0
            if now >= next_sample:
                self._sample(now)
                next_sample += SAMPLE_S
            if not killed and now >= self.seconds / 2:
                killed = True
                await self._kill_and_restart()
            await asyncio.sleep(0.2)
        self.producing = False
        missing = self.tally.confirmed - self.tally.delivered
        for _ in range(int(DRAIN_S / 0.2)):  # the consumers get what is still queued
            missing = {m for m in missing if m not in self.tally.delivered}
            if not missing:
                break
            await asyncio.sleep(0.2)
        self._sample(time.monotonic() - self.t0)

    def _sample(self, at: float) -> None:
        rss = self.node.rss_bytes()
        t = self.tally
        if rss is not None:
            t.rss_mb.append((at, rss / 1e6))
        self.report(
            f"soak {at / 60:5.1f} min: published {len(t.published):,}, confirmed {len(t.confirmed):,}, "
            f"delivered {len(t.delivered):,} ({t.deliveries - len(t.delivered):,} again), "
            f"RSS {rss / 1e6 if rss else float('nan'):.0f} MB"
        )

    async def _kill_and_restart(self) -> None:
        self.up.clear()
        self.report("soak: kill -9 of the node")
        await asyncio.to_thread(self.node.kill)
        took = await asyncio.to_thread(self.node.start)
        self.report(f"soak: the node is back after {took:.1f} s; clients reconnect")
        self.up.set()

    # ------------------------------------------------------------ clients

    async def _forever(
        self,
        session: aiohttp.ClientSession,
        client: Callable[[aiohttp.ClientWebSocketResponse, int, float, float], Awaitable[None]],
        index: int,
        rate: float,
    ) -> None:
        """Run a client for a random life, hang up, reconnect; through the node's restart too.
        Producers end when producing does; consumers go on draining."""
        producer = rate > 0
        connected = False
        while self.running and (self.producing or not producer):
            await self.up.wait()
            life_end = time.monotonic() + self.rng.uniform(*LIFE_S)
            try:
                ws = await self._connect(session, client, index)
                self.tally.reconnects += connected  # the first connection is no reconnect
                connected = True
                await client(ws, index, rate, life_end)
            except (aiohttp.ClientError, ConnectionError, TimeoutError, RuntimeError):
                await asyncio.sleep(0.2)  # the node is away (killed) or hung up: try again

    async def _connect(
        self, session: aiohttp.ClientSession, client: Any, index: int
    ) -> aiohttp.ClientWebSocketResponse:
        ws_url = self.node.ws_url
        name = client.__name__.strip("_")
        if client in (self._native_producer, self._native_consumer):
            return await session.ws_connect(
                f"{ws_url}/v1/ws?client={name}{index}", headers={"Authorization": f"Bearer {self.key}"}
            )
        kind = "Producers" if client == self._compat_producer else "Consumers"
        ws = await session.ws_connect(f"{ws_url}/{kind}/Conn/{COMPAT_TOPIC}/{name}{index}")
        await ws.receive(timeout=5)  # the prompt, ASK_KEY
        await ws.send_str(self.key)
        if (await ws.receive(timeout=5)).data != KEY_OK:
            raise RuntimeError("the KapokMQ handshake failed")
        return ws

    async def _paced(self, rate: float, sent: int, started: float) -> None:
        delay = started + sent / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def _native_producer(
        self, ws: aiohttp.ClientWebSocketResponse, index: int, rate: float, life_end: float
    ) -> None:
        pending: dict[int, list[str]] = {}
        seq = rid = 0
        started = time.monotonic()
        async with ws:
            # At the end of its life a producer stops sending and takes its replies first:
            # only the kill leaves publishes in doubt.
            while pending or (self.producing and time.monotonic() < life_end):
                while len(pending) < 4 and self.producing and time.monotonic() < life_end:
                    rid += 1
                    ids = [f"n{index}-{rid}-{seq + i}-{self.rng.random():.6f}" for i in range(50)]
                    seq += 50
                    pending[rid] = ids
                    self.tally.published.update(ids)
                    await ws.send_bytes(encode_pub(rid, [{"data": i} for i in ids], NATIVE_TOPIC))
                    await self._paced(rate, seq, started)
                msg = await ws.receive(timeout=10)
                if msg.type in ENDED:
                    return
                frame = decode_frame(msg.data)
                ids = pending.pop(frame.get("id", 0), [])
                if frame.get("op") == "puback":
                    self.tally.confirmed.update(ids)
                else:
                    self.tally.refused += len(ids)

    async def _compat_producer(
        self, ws: aiohttp.ClientWebSocketResponse, index: int, rate: float, life_end: float
    ) -> None:
        pending: list[str] = []
        seq = 0
        started = time.monotonic()
        async with ws:
            while pending or (self.producing and time.monotonic() < life_end):
                while len(pending) < 200 and self.producing and time.monotonic() < life_end:
                    payload = f"k{index}-{seq}-{self.rng.random():.6f}"
                    seq += 1
                    pending.append(payload)
                    self.tally.published.add(payload)
                    await ws.send_str(encode_produce(payload))
                    if seq % 20 == 0:
                        await self._paced(rate, seq, started)
                        break
                msg = await ws.receive(timeout=10)
                if msg.type in ENDED:
                    return
                payload = pending.pop(0)  # one reply per frame, in order
                if decode_reply(msg.data) is None:
                    self.tally.confirmed.add(payload)
                else:
                    self.tally.refused += 1

    async def _frames(
        self, ws: aiohttp.ClientWebSocketResponse, life_end: float
    ) -> AsyncIterator[str | bytes]:
        """A consumer's frames until its life ends or the socket closes (a quiet
        second is no end: it only lets the consumer look at the clock)."""
        while self.running and time.monotonic() < life_end:
            try:
                msg = await ws.receive(timeout=1)
            except TimeoutError:
                continue
            if msg.type in ENDED:
                return
            yield msg.data

    def _delivered(self, payload: str) -> None:
        self.tally.deliveries += 1
        self.tally.delivered.add(payload)

    async def _native_consumer(
        self, ws: aiohttp.ClientWebSocketResponse, index: int, rate: float, life_end: float
    ) -> None:
        async with ws:
            await ws.send_bytes(encode_sub(1, NATIVE_TOPIC, prefetch=500))
            async for raw in self._frames(ws, life_end):
                frame = decode_frame(raw)
                if frame.get("op") != "msg":
                    continue
                acks, nacks = [], []
                for m in frame["msgs"]:
                    if self.rng.random() < NACK_RATE:
                        nacks.append(m["code"])
                    else:
                        acks.append(m["code"])
                        self._delivered(m["data"])
                if nacks:
                    self.tally.nacks += len(nacks)
                    await ws.send_bytes(encode_settle("nack", frame["sub"], nacks, True))
                await ws.send_bytes(encode_settle("ack", frame["sub"], acks))

    async def _compat_consumer(
        self, ws: aiohttp.ClientWebSocketResponse, index: int, rate: float, life_end: float
    ) -> None:
        async with ws:
            async for raw in self._frames(ws, life_end):
                push = decode_push(raw)
                if push is not None:
                    self._delivered(push["data"])
                    await ws.send_str(push["code"])


def soak(h: Harness, node: Node, protocol: str) -> list[Row]:
    """The soak workload (both protocols at once, whatever ``--protocol`` says)."""
    if not isinstance(node, LocalNode):
        raise CaseFailed("needs a node started by the bench (it is killed and restarted), not --url")
    o = h.options
    h.deadline = time.monotonic() + o.minutes * 60 + DRAIN_S + 60
    t0 = time.monotonic()
    tally = asyncio.run(Soak(node, o.key, o.rate, o.minutes * 60, h.progress.line).run())
    wall = time.monotonic() - t0
    lost = len(tally.confirmed - tally.delivered)
    duplicates = tally.deliveries - len(tally.delivered)
    row = h.row("soak", "both", node, None, messages=len(tally.published), wall_s=wall)
    row.msgs_per_s = len(tally.confirmed) / wall
    row.node_rss_bytes = node.rss_bytes()
    per_minute = _per_minute(tally.rss_mb)
    row.extra.update(
        published=len(tally.published),
        confirmed=len(tally.confirmed),
        delivered=len(tally.delivered),
        lost=lost,
        duplicates=duplicates,
        refused=tally.refused,
        nacks=tally.nacks,
        reconnects=tally.reconnects,
        rss_mb=[[round(t, 1), round(m, 1)] for t, m in tally.rss_mb],
    )
    row.notes = (
        f"published {len(tally.published):,}, confirmed {len(tally.confirmed):,}, "
        f"delivered {len(tally.delivered):,}, lost {lost:,}, duplicates {duplicates:,}; "
        f"kill -9 at half time, {tally.reconnects:,} reconnects, {tally.nacks:,} nacks; "
        f"RSS MB by minute: {per_minute}"
    )
    if lost:
        raise CaseFailed(f"{lost:,} confirmed messages were never delivered: {row.notes}")
    return [row]


def _per_minute(samples: list[tuple[float, float]]) -> str:
    """The last RSS sample of each minute, as "95 101 103 ..." (the whole run if shorter)."""
    by_minute: dict[int, float] = {}
    for at, mb in samples:
        by_minute[int(at // 60)] = mb
    return " ".join(f"{mb:.0f}" for _, mb in sorted(by_minute.items())) or "n/a"
