"""Crash acceptance test: SIGKILL a real node 20 times mid-traffic, lose nothing.

One real ``kapok serve`` process (``storage.fsync=always``, snapshots every
0.5 s, ``mq.ack_timeout_s=5``, ``mq.max_deliveries=0`` so that repeated
crashes never dead-letter a message) serves a producer and a consumer over
``/v1/ws``. Each *epoch* is one life of the node: the producer publishes
batches (a window of a few ``pub`` frames in flight), the consumer
subscribes to the p2p topic's shared group with manual acks and acks every
push with an ``id`` (so it learns when the node has *processed* the ack:
the ``ok`` reply; it never learns when the ack is *durable*). After a
seeded random 0.2-1.0 s the node gets SIGKILL and is restarted on the same
directory. After 20 kills the last epoch drains the topic; then the node is
stopped cleanly and started once more to check that nothing comes back.

What is checked, and why each rule is sound:

*Durability evidence.* The WAL is a single ordered log and recovery keeps
a prefix of it (it stops at the first torn record). A ``puback`` is sent
only once its batch's ``Published`` records, and therefore every record
appended before them, are on disk. The node appends an ack's ``Settled``
record in the same event-loop step that processes the ack, before replying
``ok``; likewise a push's ``Delivered`` record is appended in the step that
queues the ``msg`` frame. So, with a client-side logical clock: an ack whose
``ok`` arrived *before* the client sent a ``pub`` frame that was later
confirmed in the same epoch is **provably durable**; the same holds for a
delivery (and for the message it carries) received before such a ``pub``.
Anything later is *in doubt*: an ack is fire-and-forget, so one sent in
the last moments before a kill may be lost and the message legitimately
delivered once more.

1. *At-least-once, none lost.* Every message that must survive (its
   publish was confirmed, or a delivery of it is provably durable) was
   delivered at least once, and its last delivery was settled for good:
   it was in the final (drain) epoch and acked there, or its ack in that
   epoch is provably durable, or (an ack in doubt that was not followed by
   a redelivery) the node reports the message ``consumed`` at the end.
   After the drain the topic has no live message, and a clean restart
   delivers nothing.
2. *Duplicates are bounded.* A code is never delivered twice in one epoch
   (acks are immediate and the 5 s ack timeout is longer than any epoch),
   and never delivered again after a provably durable ack. Each
   redelivery therefore traces back to an ack in doubt (or to no ack at
   all) in the epoch of the previous delivery.
3. *Attempts.* The ``attempts`` of a code never decrease across epochs,
   and grow (with ``redelivered`` set) when the previous delivery was
   provably durable.
4. Every pushed payload is one the producer sent, under the code its
   ``puback`` gave when there was one; no ``error`` frame ever arrives.

The figures (published, confirmed, acked, delivered more than once,
recovered per restart, total time) are printed; run with ``-s`` or ``-rA``
to see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from kapok.launch import NodeProcess, start_node
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SEED = 20251121
KILLS = 20
TOPIC = "crash"
GROUP = "default"  # the shared group of a p2p topic
SETS = (
    "storage.fsync=always",
    "storage.snapshot_interval_s=0.5",
    "mq.ack_timeout_s=5",
    "mq.max_deliveries=0",
)
AUTH = {"Authorization": "Bearer test"}
BATCH = 20  # messages per pub frame
WINDOW = 4  # pub frames awaiting their puback at most
PUB_PAUSE_S = 0.005  # between pub frames: keeps the backlog (and the drain) small
PREFETCH = 50
STEP_S = scaled(10.0)  # bound of any single network step
DRAIN_IDLE_S = scaled(2.0)  # the drain ends after this long without a new message ...
DRAIN_MAX_S = scaled(30.0)  # ... or after this long in all
_RECOVERED = re.compile(r"recovered (\d+) messages in ([\d.]+) s .*?(\d+) deliveries requeued")


@dataclass(slots=True)
class Delivery:
    epoch: int
    tick: int  # logical time the push was received
    attempts: int
    redelivered: bool


@dataclass(slots=True)
class Ack:
    epoch: int
    sent_tick: int
    ok_tick: int | None = None


@dataclass
class Ledger:
    """Everything the clients saw, stamped with one logical clock."""

    clock: itertools.count[int] = field(default_factory=itertools.count)
    sent: dict[str, int] = field(default_factory=dict)  # payload -> epoch
    confirmed: dict[str, str] = field(default_factory=dict)  # payload -> code
    code_payload: dict[str, str] = field(default_factory=dict)  # code -> payload (from pushes)
    # epoch -> latest send tick of a pub frame whose puback arrived
    evidence: dict[int, int] = field(default_factory=dict)
    deliveries: dict[str, list[Delivery]] = field(default_factory=dict)
    acks: dict[str, list[Ack]] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    recovered: list[tuple[int, float, int]] = field(default_factory=list)  # per start

    def tick(self) -> int:
        return next(self.clock)

    def durable_before(self, epoch: int, tick: int | None) -> bool:
        """True if whatever the node did before the client saw ``tick`` is provably on disk."""
        return tick is not None and tick < self.evidence.get(epoch, -1)


def _frame(msg: aiohttp.WSMessage) -> dict[str, Any] | None:
    """The JSON frame in ``msg``; None for control messages (a dead connection ends the loops)."""
    if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
        frame = orjson.loads(msg.data)
        assert isinstance(frame, dict)
        return frame
    return None


_SEND_ERRORS = (ConnectionError, aiohttp.ClientError, RuntimeError)


class Producer:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, epoch: int, ledger: Ledger) -> None:
        self.ws = ws
        self.epoch = epoch
        self.led = ledger
        self.window = asyncio.Semaphore(WINDOW)
        self.pending: dict[int, tuple[int, list[str]]] = {}

    async def send_loop(self) -> None:
        for n in range(100_000):  # bounded; the kill (and a cancel) ends it much sooner
            await asyncio.wait_for(self.window.acquire(), STEP_S)
            payloads = [f"e{self.epoch:02d}-b{n:05d}-m{i:02d}-{'x' * 40}" for i in range(BATCH)]
            for payload in payloads:
                self.led.sent[payload] = self.epoch
            self.pending[n] = (self.led.tick(), payloads)
            frame = {"op": "pub", "id": n, "topic": TOPIC, "msgs": [{"data": p} for p in payloads]}
            try:
                await self.ws.send_bytes(orjson.dumps(frame))
            except _SEND_ERRORS:
                return
            await asyncio.sleep(PUB_PAUSE_S)

    async def read_loop(self) -> None:
        async for msg in self.ws:  # ends when the node dies
            if msg.type is aiohttp.WSMsgType.ERROR:
                return
            frame = _frame(msg)
            if frame is None:
                continue
            if frame.get("op") == "puback":
                sent_tick, payloads = self.pending.pop(frame["id"])
                codes = frame["codes"]
                assert len(codes) == len(payloads)
                for payload, code in zip(payloads, codes, strict=True):
                    self.led.confirmed[payload] = code
                self.led.evidence[self.epoch] = max(self.led.evidence.get(self.epoch, -1), sent_tick)
                self.window.release()
            elif frame.get("op") == "error":
                self.led.errors.append(frame)
                self.window.release()
            else:
                self.led.unexpected.append(f"producer got {frame!r:.200}")


class Consumer:
    def __init__(
        self, ws: aiohttp.ClientWebSocketResponse, epoch: int, ledger: Ledger, rng: random.Random
    ) -> None:
        self.ws = ws
        self.epoch = epoch
        self.led = ledger
        self.rng = rng
        self.sub: int | None = None
        self.ack_ids = itertools.count()
        self.unanswered: dict[int, list[Ack]] = {}
        self.last_push = time.monotonic()
        self.pushes = 0

    async def subscribe(self) -> None:
        frame = {"op": "sub", "id": "s", "topic": TOPIC, "prefetch": PREFETCH, "ack": "manual"}
        await self.ws.send_bytes(orjson.dumps(frame))
        reply = _frame(await self.ws.receive(timeout=STEP_S))
        assert reply is not None and reply.get("op") == "subok", reply
        self.sub = reply["sub"]

    async def handle(self, frame: dict[str, Any], *, pause: bool) -> bool:
        """Record one frame and ack pushes; False once the connection is gone."""
        op = frame.get("op")
        if op == "msg":
            assert frame["sub"] == self.sub
            tick = self.led.tick()
            codes = []
            for m in frame["msgs"]:
                code, payload = m["code"], m["data"]
                known = self.led.code_payload.setdefault(code, payload)
                if known != payload:
                    self.led.unexpected.append(f"code {code} carried {payload!r} and {known!r}")
                delivery = Delivery(self.epoch, tick, m["attempts"], m["redelivered"])
                self.led.deliveries.setdefault(code, []).append(delivery)
                codes.append(code)
            self.pushes += len(codes)
            self.last_push = time.monotonic()
            if pause and self.rng.random() < 0.3:
                await asyncio.sleep(self.rng.uniform(0.0, 0.02))  # "processing"
            rid = next(self.ack_ids)
            acks = [Ack(self.epoch, self.led.tick()) for _ in codes]
            for code, ack in zip(codes, acks, strict=True):
                self.led.acks.setdefault(code, []).append(ack)
            self.unanswered[rid] = acks
            try:
                await self.ws.send_bytes(
                    orjson.dumps({"op": "ack", "id": rid, "sub": self.sub, "codes": codes})
                )
            except _SEND_ERRORS:
                return False
        elif op == "ok":
            tick = self.led.tick()
            for ack in self.unanswered.pop(frame["id"]):
                ack.ok_tick = tick
        elif op == "error":
            self.led.errors.append(frame)
        else:
            self.led.unexpected.append(f"consumer got {frame!r:.200}")
        return True

    async def read_loop(self) -> None:
        async for msg in self.ws:  # ends when the node dies
            if msg.type is aiohttp.WSMsgType.ERROR:
                return
            frame = _frame(msg)
            if frame is not None and not await self.handle(frame, pause=True):
                return

    async def drain(self) -> None:
        """Consume and ack until nothing new arrives for DRAIN_IDLE_S (at most DRAIN_MAX_S)."""
        give_up = time.monotonic() + DRAIN_MAX_S
        while time.monotonic() < give_up:
            idle_for = time.monotonic() - self.last_push
            if idle_for >= DRAIN_IDLE_S and not self.unanswered:
                return
            try:
                msg = await self.ws.receive(timeout=max(0.05, DRAIN_IDLE_S - idle_for))
            except TimeoutError:
                continue
            frame = _frame(msg)
            if frame is None:
                raise AssertionError(f"the consumer's connection ended during the drain: {msg!r}")
            await self.handle(frame, pause=False)
        raise AssertionError(f"the drain did not settle in {DRAIN_MAX_S} s")


def _note_recovery(node: NodeProcess, ledger: Ledger) -> None:
    match = _RECOVERED.search(node.output)
    assert match, node.output[-2000:]
    ledger.recovered.append((int(match.group(1)), float(match.group(2)), int(match.group(3))))


async def _start(workdir: Path, ledger: Ledger) -> NodeProcess:
    node = await asyncio.to_thread(start_node, workdir, *SETS)
    _note_recovery(node, ledger)
    return node


async def _connect(
    session: aiohttp.ClientSession, node: NodeProcess, name: str
) -> aiohttp.ClientWebSocketResponse:
    return await asyncio.wait_for(
        session.ws_connect(f"{node.ws_url}/v1/ws?client={name}", headers=AUTH), STEP_S
    )


async def _one_life(
    session: aiohttp.ClientSession, node: NodeProcess, epoch: int, ledger: Ledger, rng: random.Random
) -> None:
    """Traffic for a random 0.2-1.0 s, then SIGKILL; returns once both clients saw the end."""
    prod_ws = await _connect(session, node, "producer")
    cons_ws = await _connect(session, node, "consumer")
    producer = Producer(prod_ws, epoch, ledger)
    consumer = Consumer(cons_ws, epoch, ledger, rng)
    await consumer.subscribe()
    sender = asyncio.create_task(producer.send_loop())
    readers = asyncio.gather(producer.read_loop(), consumer.read_loop())
    try:
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        await asyncio.to_thread(node.kill)
        # Frames the node wrote before it died are still read; then both sockets end.
        await asyncio.wait_for(readers, STEP_S)
    finally:
        sender.cancel()
        readers.cancel()
        for task in (sender, readers):
            with contextlib.suppress(asyncio.CancelledError, *_SEND_ERRORS):
                await task
        await prod_ws.close()
        await cons_ws.close()


async def _final_life(
    session: aiohttp.ClientSession, node: NodeProcess, epoch: int, ledger: Ledger, rng: random.Random
) -> dict[str, Any]:
    """Drain; check what is in doubt with the node; returns the topic's stats."""
    async with await _connect(session, node, "drain") as ws:
        consumer = Consumer(ws, epoch, ledger, rng)
        await consumer.subscribe()
        await consumer.drain()
        async with session.get(f"{node.url}/v1/topics/{TOPIC}", headers=AUTH) as resp:
            assert resp.status == 200
            stats: dict[str, Any] = await resp.json()
    return stats


async def _status(session: aiohttp.ClientSession, node: NodeProcess, code: str) -> str:
    async with session.get(f"{node.url}/v1/messages/{code}", headers=AUTH) as resp:
        if resp.status == 404:
            return "missing"
        body = await resp.json()
        return str(body["groups"][GROUP]["status"])


def _audit(ledger: Ledger, final_epoch: int) -> tuple[list[str], list[str]]:
    """Rules 2-4 (see the module docstring); returns (violations, codes in doubt for rule 1)."""
    bad: list[str] = []
    must_survive = set(ledger.confirmed.values())
    sent = ledger.sent
    for code, payload in ledger.code_payload.items():
        if payload not in sent:
            bad.append(f"code {code} carried a payload nobody sent: {payload!r:.80}")
        elif payload in ledger.confirmed and ledger.confirmed[payload] != code:
            bad.append(
                f"payload {payload!r:.40} was confirmed as {ledger.confirmed[payload]}, pushed as {code}"
            )
    for code, deliveries in ledger.deliveries.items():
        epochs = [d.epoch for d in deliveries]
        if len(set(epochs)) != len(epochs):
            bad.append(f"code {code} delivered twice within one epoch: epochs {epochs}")
        if any(ledger.durable_before(d.epoch, d.tick) for d in deliveries):
            must_survive.add(code)
        for prev, nxt in itertools.pairwise(deliveries):
            durable_acks = [a for a in ledger.acks.get(code, []) if a.epoch == prev.epoch]
            if any(ledger.durable_before(a.epoch, a.ok_tick) for a in durable_acks):
                bad.append(
                    f"code {code} was delivered again in epoch {nxt.epoch} "
                    f"after a durable ack in epoch {prev.epoch}"
                )
            if nxt.attempts < prev.attempts:
                bad.append(f"code {code}: attempts went down from {prev.attempts} to {nxt.attempts}")
            if ledger.durable_before(prev.epoch, prev.tick) and not (
                nxt.attempts > prev.attempts and nxt.redelivered
            ):
                bad.append(
                    f"code {code}: a durable delivery with attempts {prev.attempts} was followed by "
                    f"attempts {nxt.attempts}, redelivered={nxt.redelivered}"
                )
    doubtful: list[str] = []
    for code in sorted(must_survive):
        history = ledger.deliveries.get(code)
        if not history:
            bad.append(f"code {code} must survive but was never delivered")
            continue
        last = history[-1]
        acks = [a for a in ledger.acks.get(code, []) if a.epoch == last.epoch]
        if last.epoch == final_epoch:
            if not any(a.ok_tick is not None for a in acks):
                bad.append(f"code {code}: its ack in the drain was never answered")
        elif not any(ledger.durable_before(a.epoch, a.ok_tick) for a in acks):
            doubtful.append(code)  # ack in doubt and no redelivery: the node must say consumed
    return bad, doubtful


async def test_sigkill_twenty_times_loses_nothing(tmp_path: Path) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    ledger = Ledger()
    workdir = tmp_path / "n"
    node: NodeProcess | None = None
    try:
        async with aiohttp.ClientSession() as session:
            for epoch in range(KILLS):
                node = await _start(workdir, ledger)
                await _one_life(session, node, epoch, ledger, rng)
                assert not node.alive()
            final_epoch = KILLS
            node = await _start(workdir, ledger)
            stats = await _final_life(session, node, final_epoch, ledger, rng)
            bad, doubtful = _audit(ledger, final_epoch)
            statuses = {code: await _status(session, node, code) for code in doubtful}
            exit_code = await asyncio.to_thread(node.stop)
            assert exit_code == 0, node.output[-3000:]
            # A clean restart after the drain has nothing left to deliver.
            node = await _start(workdir, ledger)
            async with session.get(f"{node.url}/v1/topics/{TOPIC}", headers=AUTH) as resp:
                after_restart = await resp.json()
            exit_code = await asyncio.to_thread(node.stop)
            assert exit_code == 0, node.output[-3000:]
            node = None
    finally:
        if node is not None:
            await asyncio.to_thread(node.kill)
    elapsed = time.monotonic() - started

    redelivered = {c: d for c, d in ledger.deliveries.items() if len(d) > 1}
    acked = {c for c, acks in ledger.acks.items() if any(a.ok_tick is not None for a in acks)}
    proven = sum(
        1 for acks in ledger.acks.values() for a in acks if ledger.durable_before(a.epoch, a.ok_tick)
    )
    unconfirmed = set(ledger.sent) - set(ledger.confirmed)
    unconfirmed_delivered = sum(1 for p in ledger.code_payload.values() if p in unconfirmed)
    lines = [
        f"crash test: {KILLS} SIGKILLs, seed {SEED}, {elapsed:.1f} s in total",
        f"  messages published (sent)      {len(ledger.sent)}",
        f"  publishes confirmed (puback)   {len(ledger.confirmed)}",
        f"  sent, never confirmed          {len(unconfirmed)} "
        f"({unconfirmed_delivered} of them delivered anyway)",
        f"  codes acked (ok received)      {len(acked)}; acks provably durable before a kill: {proven}",
        f"  deliveries in total            {sum(len(d) for d in ledger.deliveries.values())}",
        f"  delivered more than once       {len(redelivered)} codes "
        f"(max {max((len(d) for d in redelivered.values()), default=1)} times)",
        f"  acks in doubt, not redelivered {len(doubtful)} (node says: "
        f"{sorted(set(statuses.values())) or '-'})",
        "  recovered per start (messages / seconds / deliveries requeued):",
        "    " + ", ".join(f"#{i}: {n}/{s:.3f}/{r}" for i, (n, s, r) in enumerate(ledger.recovered)),
    ]
    print("\n" + "\n".join(lines))

    assert not ledger.errors, ledger.errors[:5]
    assert not ledger.unexpected, ledger.unexpected[:5]
    assert not bad, f"{len(bad)} violations:\n" + "\n".join(bad[:20])
    lost = {code: status for code, status in statuses.items() if status != "consumed"}
    assert not lost, (
        f"{len(lost)} messages whose ack was in doubt are not consumed: {list(lost.items())[:10]}"
    )
    assert len(ledger.confirmed) > KILLS * BATCH, "too little traffic to mean anything"
    assert stats["live"] == 0 and all(g["ready"] == 0 and g["inflight"] == 0 for g in stats["groups"]), stats
    assert after_restart["live"] == 0, after_restart
    assert all(g["ready"] == 0 and g["inflight"] == 0 for g in after_restart["groups"]), after_restart
