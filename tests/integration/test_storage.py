"""The disk store under real nodes: real files in tmp_path, a real event loop, real sockets.

* fsync ordering: no producer ack (``puback``, KapokMQ ``ok``, HTTP
  answer) before the fsync that covers its record; one fsync covers every
  record written while the previous one ran (group commit);
* ``interval`` and ``never``: acks do not wait for fsync;
* recovery through a clean restart (final snapshot) and through a crash
  image (a copy of the data directory taken while the node runs: WAL only);
* torn and corrupt WAL tails, corrupt and half-written snapshots;
* fuzzy snapshots taken while the node keeps changing; segment rotation.

A crash image is taken only once every record the test waits for is
durable (``wal.flush()``) and no other writes are in progress, so the copy
is what a power cut at that instant would leave.

That an ack was *not* sent is checked after a round trip through the node
(``round_trip``), never after a pause: what the node wrote before it answered
has arrived by then.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from kapok.clock import Clock
from kapok.config import load_config
from kapok.core.broker import Broker, Draft
from kapok.core.changes import GroupCreated
from kapok.core.consumers import Consumer
from kapok.core.model import Entry
from kapok.node.app import make_app
from kapok.protocol.native import decode_frame, encode_pub
from kapok.service import BrokerService
from kapok.storage import disk as disk_module
from kapok.storage.disk import DiskStore
from kapok.storage.records import decode_frames, encode, encode_end
from kapok.storage.segments import list_segments
from kapok.storage.snapshot import list_snapshots
from kapok.storage.wal import WriteAheadLog
from kapok.testing import ManualClock, eventually
from kapok.testing.inprocess import InProcessNode
from kapok.testing.slow import scaled

SECRET = "test"
AUTH = {"Authorization": f"Bearer {SECRET}"}
T = scaled(5.0)  # upper bound of every single wait

Frame = dict[str, Any]


# ---------------------------------------------------------------- nodes


class Node(InProcessNode):
    def __init__(self, server: TestServer, app: web.Application, store: DiskStore, data_dir: Path) -> None:
        super().__init__(server, app)
        self.store = store
        self.dir = data_dir

    async def stop(self) -> None:
        """A clean shutdown: connections closed, final snapshot, WAL closed."""
        await self.server.close()

    async def crash_image(self, dest: Path) -> Path:
        """Copy the data directory as a power cut would leave it now (no final snapshot)."""
        await self.store.wal.flush()
        shutil.copytree(self.dir, dest)
        return dest


StartNode = Callable[..., Awaitable[Node]]


def no_fsync(fd: int) -> None:
    """Tests that are not about fsync skip it: a busy shared disk must not slow them down."""


@pytest.fixture
async def start_node(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> StartNode:
    async def start(
        data_dir: Path, *sets: str, fsync: Callable[[int], None] = no_fsync, clock: Clock | None = None
    ) -> Node:
        config = load_config(
            None, overrides=[f"storage.dir={data_dir}", "storage.archive=false", *sets], env={}
        )
        store = DiskStore(config.storage, fsync=fsync)
        app = make_app(config, store=store, clock=clock)
        server = await aiohttp_server(app, host="127.0.0.1", port=0)
        return Node(server, app, store, data_dir)

    return start


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


class GateFsync:
    """An fsync that can be held shut; counts calls on files and on directories separately."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self.file_calls = 0
        self.dir_calls = 0
        self.waiting = 0  # calls held at the gate right now
        self.timed_out = False

    def __call__(self, fd: int) -> None:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        with self._lock:
            if is_dir:
                self.dir_calls += 1
            else:
                self.file_calls += 1
            self.waiting += 1
        try:
            if not self._open.wait(timeout=scaled(10)):
                self.timed_out = True
            os.fsync(fd)
        finally:
            with self._lock:
                self.waiting -= 1

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()


# ---------------------------------------------------------------- clients


class Ws:
    """A raw ``/v1/ws`` client: replies matched by id, pushes collected per subscription."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.pending: list[Frame] = []
        self.inbox: dict[int, list[Frame]] = {}
        self._rid = 0

    async def send(self, op: str, **fields: Any) -> int:
        self._rid += 1
        await self.ws.send_str(json.dumps({"op": op, "id": self._rid, **fields}))
        return self._rid

    async def _pump(self, timeout: float) -> bool:
        """Read one frame into ``pending`` or ``inbox``; False on timeout."""
        try:
            msg = await self.ws.receive(timeout=max(timeout, 0.001))
        except TimeoutError:
            return False
        assert msg.type in (WSMsgType.TEXT, WSMsgType.BINARY), (msg.type, msg.data)
        frame = decode_frame(msg.data)
        if frame.get("op") == "msg":
            self.inbox.setdefault(frame["sub"], []).extend(frame["msgs"])
        else:
            self.pending.append(frame)
        return True

    async def poll(self, rid: int, timeout: float) -> Frame | None:
        deadline = time.monotonic() + timeout
        while True:
            for i, frame in enumerate(self.pending):
                if frame.get("id") == rid:
                    return self.pending.pop(i)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self._pump(remaining)

    async def reply(self, rid: int, timeout: float = T) -> Frame:
        frame = await self.poll(rid, timeout)
        assert frame is not None, f"no reply to request {rid} within {timeout}s; have {self.pending}"
        assert frame["op"] != "error", frame
        return frame

    async def request(self, op: str, **fields: Any) -> Frame:
        return await self.reply(await self.send(op, **fields))

    async def pub(self, topic: str, *msgs: str | Frame) -> list[str]:
        self._rid += 1
        await self.ws.send_bytes(
            encode_pub(self._rid, [m if isinstance(m, dict) else {"data": m} for m in msgs], topic)
        )
        frame = await self.reply(self._rid)
        assert frame["op"] == "puback", frame
        codes: list[str] = frame["codes"]
        return codes

    async def sub(self, topic: str, **options: Any) -> int:
        frame = await self.request("sub", topic=topic, **options)
        assert frame["op"] == "subok", frame
        sub: int = frame["sub"]
        return sub

    async def take(self, sub: int, n: int, timeout: float = T) -> list[Frame]:
        deadline = time.monotonic() + timeout
        box = self.inbox.setdefault(sub, [])
        while len(box) < n:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"sub {sub}: {len(box)} of {n} messages within {timeout}s"
            await self._pump(remaining)
        taken, box[:] = box[:n], box[n:]
        return taken

    async def nothing_more(self, sub: int) -> None:
        """Nothing was delivered to ``sub`` that was not taken: a connection's frames leave
        in the order they were queued, so a ping's pong comes after all of them."""
        assert (await self.request("ping"))["op"] == "pong"
        assert not self.inbox.get(sub), f"unexpected deliveries: {self.inbox.get(sub)}"


async def v1(session: aiohttp.ClientSession, node: Node) -> Ws:
    return Ws(await session.ws_connect(f"{node.ws_url}/v1/ws", headers=AUTH))


async def compat_producer(
    session: aiohttp.ClientSession, node: Node, topic: str, pid: str = "p1"
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(f"{node.ws_url}/Producers/Conn/{topic}/{pid}")
    assert (await ws.receive_str(timeout=T)) == "Please enter the secret key"
    await ws.send_str(SECRET)
    assert (await ws.receive_str(timeout=T)) == "Secret key matching succeeded"
    return ws


class RawRequest(asyncio.Protocol):
    """One HTTP request on a connection of its own. What came back is in ``received`` as soon
    as it arrives (no task has to run first), so a test can tell it was *not* answered yet."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def post(cls, node: Node, path: str, body: bytes, headers: dict[str, str]) -> RawRequest:
        assert node.server.port is not None
        transport, request = await asyncio.get_running_loop().create_connection(
            cls, "127.0.0.1", node.server.port
        )
        fields = {**headers, "Host": "127.0.0.1", "Content-Length": str(len(body)), "Connection": "close"}
        head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
        transport.write(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        return request

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    async def answer(self) -> tuple[int, Any]:
        """The status and JSON body, once the node has answered and hung up."""
        await asyncio.wait_for(self.closed, T)
        head, _, body = bytes(self.received).partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)


async def round_trip(session: aiohttp.ClientSession, node: Node) -> None:
    """A barrier: a request the node answers at once, without storage. Whatever the node wrote
    to any of its sockets before it answered this one has arrived by the time the answer has
    (one event loop serves every connection in turn; loopback delivers in order)."""
    async with session.get(f"{node.url}/health") as resp:
        assert resp.status == 200
        await resp.read()


async def http_pub(session: aiohttp.ClientSession, node: Node, topic: str, body: Frame) -> list[str]:
    async with session.post(f"{node.url}/v1/topics/{topic}/messages", json=body, headers=AUTH) as resp:
        assert resp.status == 200, await resp.text()
        codes: list[str] = (await resp.json())["codes"]
        return codes


def seq_of(code: str) -> int:
    return int(code[-12:], 16)


class Collect:
    """A sink for service-level consumers: remembers what was pushed."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def push(self, consumer: Consumer, entries: list[Entry], after: asyncio.Future[None] | None) -> None:
        self.entries.extend(entries)


def state_of(broker: Broker) -> dict[str, tuple[Any, ...]]:
    """What recovery must reproduce: per message, its content and per durable group its fate."""
    out: dict[str, tuple[Any, ...]] = {}
    for code, msg in broker.messages.items():
        entries = tuple(
            sorted(
                (name, e.status.value if e.status.final else "open", e.attempts)
                for name, e in msg.entries.items()
                if e.group.durable
            )
        )
        out[code] = (msg.topic, msg.data, msg.seq, msg.dedup_id, msg.deliver_at, msg.live, entries)
    return out


def dedup_of(broker: Broker) -> dict[tuple[str, str], str]:
    return {(topic, dedup_id): code for _, topic, dedup_id, code in broker.admission.dedup.items()}


async def wait_durable(awaitable: Awaitable[None] | None) -> None:
    if awaitable is not None:
        await asyncio.wait_for(awaitable, T)


# ================================================================ fsync ordering


async def test_always_no_ack_of_any_protocol_before_its_fsync_and_one_fsync_covers_the_rest(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    gate = GateFsync()
    node = await start_node(tmp_path / "d", "storage.fsync=always", fsync=gate)
    ws = await v1(session, node)
    kp = await compat_producer(session, node, "t")
    await ws.pub("t", "warm-up")  # opens the first segment (file + directory fsync)
    await kp.send_str(json.dumps({"MessageData": "warm-up", "DelayTime": 0}))
    assert await kp.receive_str(timeout=T) == "ok"
    base = gate.file_calls
    written = node.store.wal.records_written

    gate.hold()
    try:
        # One publish gets the writer thread stuck in its fsync ...
        first = await ws.send("pub", topic="t", msgs=[{"data": "first"}])
        await eventually(lambda: gate.waiting == 1, what="the first fsync to start")
        # ... and several more of every protocol arrive while it is stuck.
        batch = await ws.send("pub", topic="t", msgs=[{"data": "b1"}, {"data": "b2"}])
        await kp.send_str(json.dumps({"MessageData": "k1", "DelayTime": 0}))
        await kp.send_str(json.dumps({"messagedata": "k2"}))  # keys are case-insensitive
        http = await RawRequest.post(
            node, "/v1/topics/t/messages", b'{"data": "h1"}', {**AUTH, "Content-Type": "application/json"}
        )
        await eventually(lambda: node.store.wal.records_written == written + 6, what="all publishes")
        await round_trip(session, node)  # an ack sent early would have arrived by now
        assert await ws.poll(first, 0.01) is None, "puback before its fsync finished"
        assert await ws.poll(batch, 0.01) is None, "puback before its fsync finished"
        with pytest.raises(TimeoutError):
            msg = await kp.receive(timeout=0.01)
            pytest.fail(f"KapokMQ 'ok' before its fsync finished: {msg.data!r}")
        assert not http.received, "HTTP answer before its fsync finished"
        assert gate.file_calls == base + 1  # the rest wait; nothing else is fsynced meanwhile
        assert node.store.stats()["wal_fsyncs_total"] == base  # the stuck one has not completed
    finally:
        gate.release()

    assert (await ws.reply(first))["op"] == "puback"
    assert len((await ws.reply(batch))["codes"]) == 2
    assert await kp.receive_str(timeout=T) == "ok"
    assert await kp.receive_str(timeout=T) == "ok"
    status, answer = await http.answer()
    assert status == 200 and len(answer["codes"]) == 1
    # Group commit: everything that arrived during the stuck fsync took ONE more.
    assert gate.file_calls == base + 2
    assert node.store.stats()["wal_fsyncs_total"] == base + 2
    assert not gate.timed_out
    await kp.close()
    await ws.ws.close()


async def test_always_no_delivery_before_its_messages_fsync(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A consumer never sees a message the node could still lose: a crash before the WAL
    write would make it a message the node never had (and its producer would send it again)."""
    gate = GateFsync()
    node = await start_node(tmp_path / "d", "storage.fsync=always", fsync=gate)
    producer, consumer = await v1(session, node), await v1(session, node)
    sub = await consumer.sub("t")
    await producer.pub("t", "warm-up")
    await consumer.take(sub, 1)
    gate.hold()
    try:
        await producer.send("pub", topic="t", msgs=[{"data": "held"}])
        await eventually(lambda: gate.waiting == 1, what="the fsync to start")
        await round_trip(session, node)  # a push sent early would have arrived by now
        assert await consumer.poll(-1, 0.01) is None  # reads what arrived (a ping would queue behind it)
        assert not consumer.inbox.get(sub), "a message was delivered before its fsync finished"
    finally:
        gate.release()
    (pushed,) = await consumer.take(sub, 1)
    assert pushed["data"] == "held"
    await producer.ws.close()
    await consumer.ws.close()


async def test_wal_flush_waits_for_the_batch_being_written_too(tmp_path: Path) -> None:
    # Appends between two hand-offs share one future; flush() must also wait for
    # the batch already on the writer thread, not only for the ones still queued.
    gate = GateFsync()
    wal = WriteAheadLog(tmp_path, policy="always", interval_ms=1000, segment_max_bytes=1 << 20, fsync=gate)
    wal.start(0)
    try:
        await wal.append([GroupCreated("t", "g", 1.0)])  # opens the segment
        gate.hold()
        try:
            first = wal.append([GroupCreated("t", "a", 2.0)])
            assert wal.append([GroupCreated("t", "b", 3.0)]) is first
            await eventually(lambda: gate.waiting == 1, what="the fsync to start")
            done: list[str] = []
            first.add_done_callback(lambda _: done.append("batch"))
            flush = asyncio.create_task(wal.flush())
            flush.add_done_callback(lambda _: done.append("flush"))
            await asyncio.sleep(0)  # one turn: the flush task starts while the batch is stuck
            assert not first.done()
        finally:
            gate.release()
        await asyncio.wait_for(flush, T)
        assert first.exception() is None
        assert done == ["batch", "flush"]  # the flush ended only once the batch was durable
    finally:
        await wal.aclose()
    (segment,) = list_segments(tmp_path)
    assert len(decode_frames(segment.path.read_bytes()).records) == 3


async def test_always_producer_send_waits_for_fsync(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # The KapokMQ HTTP route (/Producer/Send) too.
    gate = GateFsync()
    node = await start_node(tmp_path / "d", "storage.fsync=always", fsync=gate)
    await http_pub(session, node, "t", {"data": "warm-up"})

    form = b"messageData=x&topic=t&delayTime=0"
    headers = {"secretKey": SECRET, "Content-Type": "application/x-www-form-urlencoded"}
    gate.hold()
    try:
        post = await RawRequest.post(node, "/Producer/Send", form, headers)
        await eventually(lambda: gate.waiting == 1, what="the fsync to start")
        await round_trip(session, node)  # an answer sent early would have arrived by now
        assert not post.received, "answer before its fsync finished"
    finally:
        gate.release()
    status, body = await post.answer()
    assert status == 200 and body["code"] == 0 and len(body["msg"]) == 32


async def test_interval_acks_do_not_wait_for_fsync_and_fsyncs_run_periodically(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    gate = GateFsync()
    node = await start_node(
        tmp_path / "d", "storage.fsync=interval", "storage.fsync_interval_ms=20", fsync=gate
    )
    ws = await v1(session, node)
    # Periodic: every interval with something written gets one fsync; an idle log gets none.
    for i in range(5):
        await ws.pub("t", f"m{i}")
        await asyncio.sleep(0.06)
    await eventually(lambda: not node.store.wal.files.dirty, what="the interval fsync")
    assert 2 <= gate.file_calls <= 6
    await eventually(lambda: node.store.wal.files.background_jobs == 0, what="the last fsync to end")
    idle = gate.file_calls
    # Back to its 0.02 s naps: the loop runs timers in deadline order, so the syncer has
    # looked at the idle log several times before this sleep ends.
    await asyncio.sleep(scaled(0.1))
    assert gate.file_calls == idle  # nothing written, nothing to sync

    gate.hold()
    try:
        # The ack needs only the write: it comes while every fsync is held ...
        codes = await asyncio.wait_for(ws.pub("t", "while held"), T)
        assert len(codes) == 1
        # ... and the timer then tries to fsync it.
        await eventually(lambda: gate.waiting == 1, what="the interval fsync of the new record")
    finally:
        gate.release()
    await eventually(lambda: gate.waiting == 0 and not node.store.wal.files.dirty, what="the fsync to finish")
    assert gate.file_calls == idle + 1
    assert not gate.timed_out
    await ws.ws.close()


async def test_interval_acks_never_wait_for_a_slow_fsync(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    gate = GateFsync()
    node = await start_node(
        tmp_path / "d", "storage.fsync=interval", "storage.fsync_interval_ms=10", fsync=gate
    )
    ws = await v1(session, node)
    await ws.pub("t", "warm-up")
    await eventually(lambda: not node.store.wal.files.dirty, what="the interval fsync")
    gate.hold()
    try:
        await ws.pub("t", "one")  # written; the timer's fsync of it now hangs
        await eventually(lambda: gate.waiting == 1, what="the interval fsync")
        rid = await ws.send("pub", topic="t", msgs=[{"data": "two"}])
        reply = await ws.poll(rid, T)  # at once; T only bounds a failure
    finally:
        gate.release()
    await ws.ws.close()
    assert reply is not None, "under fsync=interval the ack waited for an fsync in progress"


async def test_never_acks_do_not_wait_for_fsync(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    gate = GateFsync()
    node = await start_node(tmp_path / "d", "storage.fsync=never", fsync=gate)
    ws = await v1(session, node)
    kp = await compat_producer(session, node, "t")
    await ws.pub("t", "warm-up")  # opens the segment
    base = gate.file_calls
    gate.hold()
    try:
        for i in range(20):
            assert len(await asyncio.wait_for(ws.pub("t", f"m{i}"), T)) == 1
            await kp.send_str(json.dumps({"MessageData": f"k{i}"}))
            assert await kp.receive_str(timeout=T) == "ok"
        assert len(await asyncio.wait_for(http_pub(session, node, "t", {"data": "h"}), T)) == 1
        assert node.store.wal.files.background_jobs == 0  # no fsync even queued for later
        assert gate.file_calls == base
        assert gate.waiting == 0
    finally:
        gate.release()
    assert node.store.stats()["wal_fsyncs_total"] == base
    await kp.close()
    await ws.ws.close()


async def test_never_acks_do_not_wait_for_fsync_at_segment_rotation(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    gate = GateFsync()
    node = await start_node(
        tmp_path / "d", "storage.fsync=never", "storage.segment_max_bytes=4096", fsync=gate
    )
    ws = await v1(session, node)
    await ws.pub("t", "warm-up")
    gate.hold()
    acked = 0
    try:
        for i in range(20):  # 20 x 500 bytes: at least two rotations
            rid = await ws.send("pub", topic="t", msgs=[{"data": f"{i:04d}" + "x" * 496}])
            if await ws.poll(rid, T) is None:
                break
            acked += 1
    finally:
        gate.release()
    await ws.ws.close()
    assert acked == 20, f"ack {acked + 1} waited for an fsync under fsync=never"


# ================================================================ recovery: clean restart


async def test_clean_restart_keeps_every_state(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    data = tmp_path / "d"
    clock = ManualClock()  # both lives of the node run on it
    a = await start_node(data, fsync=os.fsync, clock=clock)
    ws = await v1(session, a)
    codes_before: list[str] = []

    # consumed
    done = await ws.pub("done", "d1", "d2")
    s = await ws.sub("done")
    got = await ws.take(s, 2)
    await ws.request("ack", sub=s, codes=[m["code"] for m in got])
    # delivered, one acked, two left unacked
    pend = await ws.pub("pend", "p1", "p2", "p3")
    s = await ws.sub("pend")
    got = await ws.take(s, 3)
    assert [m["code"] for m in got] == pend
    await ws.request("ack", sub=s, codes=[pend[0]])
    # nacked once (requeued: delivered again, attempts 2) and left unacked
    (nacked,) = await ws.pub("nack", "n1")
    s = await ws.sub("nack")
    await ws.take(s, 1)
    await ws.request("nack", sub=s, codes=[nacked], requeue=True)
    (again,) = await ws.take(s, 1)
    assert again["code"] == nacked and again["attempts"] == 2
    # rejected: dead-lettered to bad.dlq
    (bad,) = await ws.pub("bad", {"data": "b1", "key": "k.1", "priority": 4})
    s = await ws.sub("bad")
    await ws.take(s, 1)
    await ws.request("nack", sub=s, codes=[bad], requeue=False)
    # delayed
    (later,) = await ws.pub("later", {"data": "l1", "delay_s": 2.0})
    deliver_at = a.broker.messages[later].deliver_at
    # dedup
    (dd,) = await ws.pub("dd", {"data": "x", "dedup_id": "id-1"})
    # a named durable group that nobody listens to right now
    s = await ws.sub("fan", group="g1")
    await ws.request("unsub", sub=s)
    fan = await ws.pub("fan", "f1", "f2")
    codes_before += done + pend + [nacked, bad, later, dd] + fan
    codes_before += [c for c, m in a.broker.messages.items() if m.topic == "bad.dlq"]
    max_seq = max(seq_of(c) for c in codes_before)

    await ws.ws.close()
    await a.stop()
    assert list_snapshots(data / "snapshots"), "a clean shutdown writes a final snapshot"

    b = await start_node(data, fsync=os.fsync, clock=clock)
    ws = await v1(session, b)
    s_later = await ws.sub("later")  # first: nothing below may release it before its time
    # consumed stays consumed
    assert all(b.broker.messages[c].entries["default"].status.value == "consumed" for c in done)
    s_done = await ws.sub("done")
    # unacked ones come back, flagged
    s = await ws.sub("pend")
    back = await ws.take(s, 2)
    assert [m["code"] for m in back] == pend[1:]
    assert all(m["attempts"] == 2 and m["redelivered"] for m in back)
    s2 = await ws.sub("nack")
    (m,) = await ws.take(s2, 1)
    assert m["code"] == nacked and m["attempts"] == 3 and m["redelivered"]
    # the dead letter stays dead, its copy waits in the DLQ
    s3 = await ws.sub("bad")
    s4 = await ws.sub("bad.dlq")
    (dead,) = await ws.take(s4, 1)
    assert dead["data"] == "b1" and dead["key"] == "k.1" and dead["priority"] == 4
    assert dead["headers"]["original_code"] == bad and dead["headers"]["reason"] == "rejected"
    # dedup ids still dedup
    assert await ws.pub("dd", {"data": "other", "dedup_id": "id-1"}) == [dd]
    # the named group still exists and holds its messages; so does the default group
    s5 = await ws.sub("fan", group="g1")
    assert [m["code"] for m in await ws.take(s5, 2)] == fan
    s6 = await ws.sub("fan")
    assert [m["code"] for m in await ws.take(s6, 2)] == fan
    await ws.nothing_more(s_done)
    assert not ws.inbox.get(s3)
    # codes keep increasing: no sequence number is used twice
    (new,) = await ws.pub("fresh", "n")
    assert seq_of(new) > max_seq and new not in codes_before
    # the delayed message still waits for its time
    clock.advance(deliver_at - 0.01 - clock.now)
    await ws.nothing_more(s_later)
    clock.advance(0.02)
    (m,) = await ws.take(s_later, 1)
    assert m["code"] == later and m["attempts"] == 1
    await ws.ws.close()


# ================================================================ recovery: crash image (WAL only)


async def test_crash_image_recovers_everything_acked_from_the_wal_alone(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a = await start_node(tmp_path / "a", fsync=os.fsync)
    ws = await v1(session, a)
    kp = await compat_producer(session, a, "mixed", "kp")
    published: dict[str, bytes] = {}
    for code in await ws.pub("mixed", "w1", {"data": "AAEC/w==", "enc": "base64"}, {"data": "w3"}):
        published[code] = a.broker.messages[code].data
    for code in await http_pub(session, a, "mixed", {"messages": [{"data": "h1"}, {"data": "h2"}]}):
        published[code] = a.broker.messages[code].data
    for i in range(3):
        await kp.send_str(json.dumps({"MessageData": f"k{i}", "DelayTime": 0}))
        assert await kp.receive_str(timeout=T) == "ok"
    async with session.post(
        f"{a.url}/Producer/Send",
        data={"messageData": "form", "topic": "mixed", "delayTime": "30"},
        headers={"secretKey": SECRET},
    ) as resp:
        form_code = (await resp.json(content_type=None))["msg"]
    kapok_codes = [c for c, m in a.broker.messages.items() if m.data.startswith(b"k")]
    assert len(kapok_codes) == 3
    published.update({c: a.broker.messages[c].data for c in [*kapok_codes, form_code]})
    assert b"\x00\x01\x02\xff" in published.values()
    # Consume some: one acked, one held in flight when the "power" goes.
    s = await ws.sub("mixed", prefetch=2)
    first, second = await ws.take(s, 2)
    await ws.request("ack", sub=s, codes=[first["code"]])
    await ws.take(s, 1)  # the ack freed credit for the next one
    (dd,) = await ws.pub("dd", {"data": "x", "dedup_id": "once"})
    expected = state_of(a.broker)
    seq_a = a.broker.next_seq

    image = await a.crash_image(tmp_path / "image")
    assert not list_snapshots(image / "snapshots"), "the image holds no snapshot: WAL only"
    b = await start_node(image)
    got = state_of(b.broker)
    assert got == expected
    for code, data in published.items():
        assert b.broker.messages[code].data == data
    assert b.broker.next_seq >= seq_a
    assert b.broker.messages[first["code"]].entries["default"].status.value == "consumed"
    assert b.broker.messages[form_code].deliver_at > time.time() + 20  # still delayed
    assert dedup_of(b.broker)[("dd", "once")] == dd
    wsb = await v1(session, b)
    assert await wsb.pub("dd", {"data": "y", "dedup_id": "once"}) == [dd]
    s = await wsb.sub("mixed", prefetch=100)
    # everything unconsumed comes back, the two that were in flight flagged as redelivered
    back = await wsb.take(s, len(published) - 2)  # minus the acked one and the delayed one
    by_code = {m["code"]: m for m in back}
    assert set(by_code) == set(published) - {first["code"], form_code}
    assert by_code[second["code"]]["redelivered"] and by_code[second["code"]]["attempts"] == 2
    await wsb.nothing_more(s)
    await kp.close()
    await ws.ws.close()
    await wsb.ws.close()


async def test_disk_store_abandoned_without_close(tmp_path: Path) -> None:
    # The store alone, under a service, no HTTP: append, await durability, walk away.
    config = load_config(None, overrides=[f"storage.dir={tmp_path / 'a'}", "storage.archive=false"], env={})
    store = DiskStore(config.storage)
    service = BrokerService(config, store=store)
    await service.start()
    _, durable = service.publish([Draft("t", f"m{i}".encode()) for i in range(10)])
    await wait_durable(durable)
    sink = Collect()
    consumer = service.subscribe(sink, "t", prefetch=4)
    service.ack(consumer.id, [e.msg.code for e in sink.entries[:2]])
    await store.wal.flush()
    expected = state_of(service.broker)
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the crash image
    try:
        copy = load_config(None, overrides=[f"storage.dir={tmp_path / 'b'}", "storage.archive=false"], env={})
        fresh = DiskStore(copy.storage)
        broker = Broker(config.mq.settings(), service.broker.node_id, journal=True)
        await fresh.open(broker, time.time())
        try:
            assert state_of(broker) == expected
            assert fresh.stats()["recovery_corrupt_tails_total"] == 0
        finally:
            await fresh.aclose()
    finally:
        await service.aclose()


# ================================================================ torn and corrupt WAL tails


@pytest.mark.parametrize("damage", ["garbage", "cut-mid-frame", "bit-flip-in-last-frame", "zeros"])
async def test_torn_tail_keeps_every_record_before_it(
    start_node: StartNode,
    session: aiohttp.ClientSession,
    tmp_path: Path,
    damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = await start_node(tmp_path / "a")
    codes = [(await http_pub(session, a, "t", {"data": f"m{i}"}))[0] for i in range(10)]
    image = await a.crash_image(tmp_path / "image")
    (segment,) = list_segments(image / "wal")
    raw = segment.path.read_bytes()
    decoded = decode_frames(raw)
    assert decoded.problem is None and len(decoded.records) >= 10
    last_frame_start = len(raw) - len(encode(decoded.records[-1]))
    if damage == "garbage":
        segment.path.write_bytes(raw + b"\x40\x00\x00\x00\x12\x34\x56\x78 half a frame")
        kept, good_end = codes, len(raw)
    elif damage == "zeros":
        segment.path.write_bytes(raw + bytes(100))
        kept, good_end = codes, len(raw)
    elif damage == "cut-mid-frame":
        segment.path.write_bytes(raw[: len(raw) - 5])
        kept, good_end = codes[:-1], last_frame_start
    else:
        flipped = bytearray(raw)
        flipped[len(raw) - 3] ^= 0x10
        segment.path.write_bytes(bytes(flipped))
        kept, good_end = codes[:-1], last_frame_start

    caplog.set_level(logging.WARNING, "kapok.storage")
    b = await start_node(image)
    assert [c for c in codes if c in b.broker.messages] == kept
    assert b.store.stats()["recovery_corrupt_tails_total"] == 1
    assert segment.path.stat().st_size == good_end, "the damaged tail is cut off"
    assert any(segment.path.name in r.getMessage() for r in caplog.records), "the damage is logged"
    async with session.get(f"{b.url}/metrics") as resp:
        assert "kapok_storage_recovery_corrupt_tails_total 1.0" in await resp.text()
    # The node serves: new writes go to a new segment and recover next time too.
    more = [(await http_pub(session, b, "t", {"data": f"n{i}"}))[0] for i in range(3)]
    ws = await v1(session, b)
    s = await ws.sub("t")
    assert [m["code"] for m in await ws.take(s, len(kept) + 3)] == kept + more
    await ws.ws.close()
    image2 = await b.crash_image(tmp_path / "image2")
    c = await start_node(image2)
    assert all(code in c.broker.messages for code in kept + more)
    assert c.store.stats()["recovery_corrupt_tails_total"] == 0
    # and after a clean stop as well
    await c.stop()
    d = await start_node(image2)
    assert all(code in d.broker.messages for code in kept + more)
    assert d.store.stats()["recovery_corrupt_tails_total"] == 0


async def test_damage_in_an_older_segment_sets_later_ones_aside(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a = await start_node(tmp_path / "a", "storage.segment_max_bytes=4096")
    codes: list[str] = []
    for i in range(60):
        codes += await http_pub(session, a, "t", {"data": f"{i:03d}" + "x" * 200})
    image = await a.crash_image(tmp_path / "image")
    segments = list_segments(image / "wal")
    assert len(segments) >= 3
    victim = segments[1]
    raw = bytearray(victim.path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.path.write_bytes(bytes(raw))
    good = decode_frames(bytes(raw))

    b = await start_node(image)
    assert b.store.stats()["recovery_corrupt_tails_total"] == 1
    # Everything in the earlier segment and before the damage survives, in order
    # (the log's first record is the topic's GroupCreated, then one Published each) ...
    survivors = [c for c in codes if c in b.broker.messages]
    assert survivors == codes[: victim.first_lsn + len(good.records) - 1]
    # ... later segments are set aside, not replayed and not deleted
    orphans = sorted(p.name for p in (image / "wal").glob("*.orphan"))
    assert len(orphans) == len(segments) - 2
    assert victim.path.stat().st_size == good.good_end
    # and the node goes on writing after the good end
    more = await http_pub(session, b, "t", {"data": "after"})
    image2 = await b.crash_image(tmp_path / "image2")
    c = await start_node(image2)
    assert [x for x in codes + more if x in c.broker.messages] == survivors + more
    assert c.store.stats()["recovery_corrupt_tails_total"] == 0


# ================================================================ snapshots


async def test_snapshots_keep_two_and_drop_the_wal_the_older_one_covers(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a = await start_node(tmp_path / "a")
    snapshots, wal = tmp_path / "a" / "snapshots", tmp_path / "a" / "wal"
    codes: list[str] = []
    lsns: list[int] = []
    for round_ in range(3):
        codes += [(await http_pub(session, a, "t", {"data": f"{round_}-{i}"}))[0] for i in range(5)]
        await a.store.snapshot()
        lsns.append(list_snapshots(snapshots)[-1][0])
        if round_:  # the WAL was cut at the previous snapshot
            assert list_segments(wal)[-1].first_lsn == lsns[-2]
    assert lsns == sorted(set(lsns))
    # The two newest snapshots stay, each complete (END frame) ...
    kept = list_snapshots(snapshots)
    assert [lsn for lsn, _ in kept] == lsns[-2:]
    for _, path in kept:
        decoded = decode_frames(path.read_bytes())
        assert decoded.ended and decoded.problem is None
        assert path.read_bytes().endswith(encode_end())
    assert not list(snapshots.glob("*.tmp"))
    # ... and the WAL since the older of them; segments before it are deleted.
    segments = list_segments(wal)
    assert segments and all(s.first_lsn >= lsns[-2] for s in segments)
    assert a.store.stats()["snapshots_total"] == 3
    codes += await http_pub(session, a, "t", {"data": "after"})

    image = await a.crash_image(tmp_path / "image")
    b = await start_node(image)
    assert all(c in b.broker.messages for c in codes)
    assert state_of(b.broker) == state_of(a.broker)
    assert b.store.stats()["recovery_snapshots_skipped_total"] == 0


async def test_leftover_snapshot_temp_file_is_ignored(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a = await start_node(tmp_path / "a")
    codes = await http_pub(session, a, "t", {"messages": [{"data": "1"}, {"data": "2"}]})
    image = await a.crash_image(tmp_path / "image")
    # A crash in the middle of writing a newer snapshot: a temp file, even a
    # well-formed-looking one, under a higher LSN.
    snapshots = image / "snapshots"
    (snapshots / f"snapshot-{10**6:020d}.snap.tmp").write_bytes(b"\x05\x00\x00\x00junk and more")
    (snapshots / f"snapshot-{10**7:020d}.snap.tmp").write_bytes(encode_end())
    b = await start_node(image)
    assert all(c in b.broker.messages for c in codes)
    assert b.store.stats()["recovery_corrupt_tails_total"] == 0
    more = await http_pub(session, b, "t", {"data": "3"})
    await b.store.snapshot()
    await b.stop()
    c = await start_node(image)
    assert all(x in c.broker.messages for x in codes + more)


def damage_snapshot(path: Path, how: str) -> None:
    raw = bytearray(path.read_bytes())
    if how == "bit-flip":
        raw[len(raw) // 2] ^= 0x01
    elif how == "no-end":
        raw = raw[: -len(encode_end())]
    elif how == "torn":
        raw = raw[: len(raw) // 2]
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))


async def three_rounds(session: aiohttp.ClientSession, node: Node) -> tuple[str, str, str]:
    """ "old", snapshot, "mid", snapshot, "new": the WAL segment holding "old" is dropped."""
    (old,) = await http_pub(session, node, "t", {"data": "old"})
    await node.store.snapshot()
    (mid,) = await http_pub(session, node, "t", {"data": "mid"})
    await node.store.snapshot()
    (new,) = await http_pub(session, node, "t", {"data": "new"})
    await node.store.snapshot()
    assert len(list_snapshots(node.dir / "snapshots")) == 2
    return old, mid, new


@pytest.mark.parametrize("damage", ["bit-flip", "no-end", "torn", "empty"])
async def test_a_corrupt_newest_snapshot_falls_back_to_the_older_one(
    start_node: StartNode,
    session: aiohttp.ClientSession,
    tmp_path: Path,
    damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = await start_node(tmp_path / "a")
    codes = await three_rounds(session, a)
    (after,) = await http_pub(session, a, "t", {"data": "after"})
    image = await a.crash_image(tmp_path / "image")
    damage_snapshot(list_snapshots(image / "snapshots")[-1][1], damage)

    caplog.set_level(logging.ERROR, "kapok.storage")
    b = await start_node(image)
    assert any("snapshot not usable" in r.getMessage() for r in caplog.records)
    assert b.store.stats()["recovery_snapshots_skipped_total"] == 1
    async with session.get(f"{b.url}/metrics") as resp:
        assert "kapok_storage_recovery_snapshots_skipped_total 1.0" in await resp.text()
    # Nothing is lost: the older snapshot plus the WAL since it hold everything.
    assert all(c in b.broker.messages for c in [*codes, after])
    assert b.broker.next_seq > seq_of(after)
    (fresh,) = await http_pub(session, b, "t", {"data": "fresh"})
    assert seq_of(fresh) > seq_of(after)
    await b.store.snapshot()
    await b.stop()
    c = await start_node(image)
    assert all(x in c.broker.messages for x in [*codes, after, fresh])
    assert c.store.stats()["recovery_snapshots_skipped_total"] == 0


async def test_after_a_fallback_the_damaged_snapshot_is_not_kept_as_the_fallback(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a = await start_node(tmp_path / "a")
    codes = await three_rounds(session, a)
    image = await a.crash_image(tmp_path / "image")
    damaged_lsn = list_snapshots(image / "snapshots")[-1][0]
    damage_snapshot(list_snapshots(image / "snapshots")[-1][1], "bit-flip")
    b = await start_node(image)
    assert b.store.stats()["recovery_snapshots_skipped_total"] == 1
    (fresh,) = await http_pub(session, b, "t", {"data": "fresh"})
    await b.store.snapshot()
    usable = [
        lsn for lsn, path in list_snapshots(image / "snapshots") if decode_frames(path.read_bytes()).ended
    ]
    # Later the newest snapshot is damaged too: there must still be a good one to fall back to.
    image2 = await b.crash_image(tmp_path / "image2")
    damage_snapshot(list_snapshots(image2 / "snapshots")[-1][1], "bit-flip")
    c = await start_node(image2)
    missing = [x for x in [*codes, fresh] if x not in c.broker.messages]
    assert not missing, (
        f"{len(missing)} acked message(s) lost; usable snapshots were {usable}, "
        f"the damaged snapshot-{damaged_lsn} was kept instead of a good one"
    )


async def test_both_snapshots_corrupt_the_node_still_starts_from_what_the_wal_holds(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = await start_node(tmp_path / "a")
    old, mid, new = await three_rounds(session, a)
    image = await a.crash_image(tmp_path / "image")
    for _, path in list_snapshots(image / "snapshots"):
        damage_snapshot(path, "bit-flip")
    caplog.set_level(logging.ERROR, "kapok.storage")
    b = await start_node(image)
    assert b.store.stats()["recovery_snapshots_skipped_total"] == 2
    assert sum("snapshot not usable" in r.getMessage() for r in caplog.records) == 2
    # What the code does: empty state plus every WAL segment left (those since the
    # older snapshot: here only "new"). Messages only the snapshots held ("old",
    # "mid") are gone: a double fault; codes are still never reused.
    assert new in b.broker.messages
    assert old not in b.broker.messages and mid not in b.broker.messages
    (fresh,) = await http_pub(session, b, "t", {"data": "fresh"})
    assert seq_of(fresh) > seq_of(new)


async def test_fuzzy_snapshot_while_the_node_keeps_changing(
    start_node: StartNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tiny batches: the snapshot lets the event loop run after every record or two,
    # so publishes, deliveries, acks, nacks, dead letters and deletes land while
    # it walks the state.
    monkeypatch.setattr(disk_module, "SNAPSHOT_BATCH", 2)
    a = await start_node(tmp_path / "a", "mq.max_deliveries=0")
    service = a.service
    sink = Collect()
    consumer = service.subscribe(sink, "f", prefetch=40)
    service.subscribe(Collect(), "g", group="named", prefetch=1)
    n = 0

    def publish(k: int) -> Awaitable[None] | None:
        nonlocal n
        drafts = []
        for _ in range(k):
            n += 1
            dedup = f"d{n % 7}" if n % 5 == 0 else ""
            drafts.append(Draft("f" if n % 3 else "g", b"p%d" % n, delay_s=30.0 if n % 11 == 0 else 0.0,
                                dedup_id=dedup))  # fmt: skip
        return service.publish(drafts)[1]

    def churn(i: int) -> None:
        held = list(consumer.held)
        if not held:
            return
        if i % 4 == 0:
            service.ack(consumer.id, held[:3])
        elif i % 4 == 1:
            service.nack(consumer.id, held[:1], requeue=True)
        elif i % 4 == 2:
            service.nack(consumer.id, held[:1], requeue=False)  # to f.dlq
        else:
            service.delete(held[0])

    for _ in range(20):
        await wait_durable(publish(10))
    for i in range(10):
        churn(i)
    await a.store.wal.flush()

    snap = asyncio.create_task(a.store.snapshot())
    during = 0
    waiters = []
    while not snap.done():
        if during < 400:  # bounded, however slow the snapshot's file writes are
            waiters.append(publish(2))
            churn(during)
            during += 1
        await asyncio.sleep(0)
    await snap
    assert during >= 20, f"only {during} changes interleaved with the snapshot"
    for i in range(30):
        waiters.append(publish(1))
        churn(i)
        await asyncio.sleep(0)
    for w in waiters:
        await wait_durable(w)
    await a.store.wal.flush()
    expected = state_of(a.broker)
    dedup = dedup_of(a.broker)
    assert any(not live for *_, live, _ in expected.values())  # some consumed, kept for inspection

    image = await a.crash_image(tmp_path / "image")
    assert list_snapshots(image / "snapshots")
    b = await start_node(image, "mq.max_deliveries=0")
    # Recovery (snapshot + WAL after it) equals the final state: the same
    # messages, live or finished (consumed, dead-lettered), the same attempts.
    got = state_of(b.broker)
    assert set(got) == set(expected)
    assert {c for c, st in got.items() if st[5]} == {c for c, st in expected.items() if st[5]}
    assert got == expected
    # Dedup entries of messages that still exist are all there (for deleted
    # ones see test_dedup_id_of_a_deleted_message_survives_a_crash).
    assert {k: v for k, v in dedup.items() if v in expected}.items() <= dedup_of(b.broker).items()
    assert b.broker.next_seq >= a.broker.next_seq


async def test_dedup_id_survives_a_clean_restart_after_its_message_is_deleted(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a = await start_node(tmp_path / "a")
    (code,) = await http_pub(session, a, "t", {"data": "x", "dedup_id": "once"})
    async with session.delete(f"{a.url}/v1/messages/{code}", headers=AUTH) as resp:
        assert resp.status == 200
    assert await http_pub(session, a, "t", {"data": "y", "dedup_id": "once"}) == [code]
    await a.stop()  # the final snapshot holds the dedup entry
    b = await start_node(tmp_path / "a")
    assert await http_pub(session, b, "t", {"data": "z", "dedup_id": "once"}) == [code]


async def test_dedup_id_survives_a_crash_after_its_message_is_deleted(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a = await start_node(tmp_path / "a")
    (code,) = await http_pub(session, a, "t", {"data": "x", "dedup_id": "once"})
    async with session.delete(f"{a.url}/v1/messages/{code}", headers=AUTH) as resp:
        assert resp.status == 200
    assert await http_pub(session, a, "t", {"data": "y", "dedup_id": "once"}) == [code]
    image = await a.crash_image(tmp_path / "image")
    b = await start_node(image)
    assert await http_pub(session, b, "t", {"data": "z", "dedup_id": "once"}) == [code]


async def test_a_failing_fsync_never_confirms_and_the_node_stays_up(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    broken = threading.Event()

    def fsync(fd: int) -> None:
        if broken.is_set() and not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(5, "Input/output error")
        os.fsync(fd)

    node = await start_node(tmp_path / "a", fsync=fsync)
    ws = await v1(session, node)
    kept = await ws.pub("t", "before")
    broken.set()
    rid = await ws.send("pub", topic="t", msgs=[{"data": "lost"}])
    # No puback ever: an error frame answers it instead, and the connection stays open.
    msg = await ws.ws.receive(timeout=T)
    assert msg.type is WSMsgType.TEXT, (msg.type, msg.data)
    frame = json.loads(msg.data)
    assert frame["op"] == "error" and frame["id"] == rid and frame["code"] == "storage", frame
    assert not ws.ws.closed
    # Later writes get a clear error, not a hang and not a traceback.
    async with session.post(f"{node.url}/v1/topics/t/messages", json={"data": "x"}, headers=AUTH) as resp:
        assert resp.status >= 500
        body = await resp.json()
        assert body["error"] == "storage" and "Traceback" not in body["message"]
    async with session.get(f"{node.url}/health") as resp:
        assert resp.status == 200
    broken.clear()
    image = await node.crash_image(tmp_path / "image")
    b = await start_node(image)
    assert kept[0] in b.broker.messages


# ================================================================ segment rotation


async def test_small_segments_rotate_and_all_replay(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a = await start_node(tmp_path / "a", "storage.segment_max_bytes=4096")
    ws = await v1(session, a)
    codes: list[str] = []
    for i in range(40):
        codes += await ws.pub("t", *[{"data": f"{i:03d}-{j}-" + "y" * 150} for j in range(3)])
    s = await ws.sub("t", prefetch=50)
    got = await ws.take(s, 50)
    await ws.request("ack", sub=s, codes=[m["code"] for m in got[:30]])
    await ws.take(s, 30)
    await a.store.wal.flush()
    segments = list_segments(tmp_path / "a" / "wal")
    assert len(segments) >= 8
    # The names are the LSNs of their first records: consecutive, no gaps.
    total = 0
    for seg in segments:
        assert seg.first_lsn == total
        total += len(decode_frames(seg.path.read_bytes()).records)
    assert total == a.store.wal.next_lsn
    expected = state_of(a.broker)

    image = await a.crash_image(tmp_path / "image")
    b = await start_node(image, "storage.segment_max_bytes=4096")
    assert state_of(b.broker) == expected
    assert b.store.stats()["recovery_corrupt_tails_total"] == 0
    # and with a snapshot in the middle of many segments
    await b.store.snapshot()
    wsb = await v1(session, b)
    more = await wsb.pub("t", *[{"data": "z" * 300} for _ in range(30)])
    await wsb.ws.close()
    await ws.ws.close()
    image2 = await b.crash_image(tmp_path / "image2")
    c = await start_node(image2, "storage.segment_max_bytes=4096")
    assert all(x in c.broker.messages for x in codes + more)
    live = {x for x, m in c.broker.messages.items() if m.live}
    assert live == set(codes[30:] + more)


# ================================================================ bad input reaching the WAL


async def test_a_producer_id_that_is_not_utf8_cannot_break_persistence(
    start_node: StartNode, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a = await start_node(tmp_path / "a")
    await http_pub(session, a, "t", {"data": "before"})
    body = b'{"data":"x"}'
    reader, writer = await asyncio.open_connection("127.0.0.1", a.server.port)
    writer.write(
        b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test\r\n"
        b"X-Kapok-Producer: ab\xffcd\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), T)
    writer.close()
    await writer.wait_closed()
    # aiohttp hands the header over with the byte as a lone surrogate, which no
    # record can hold: refused up front, never half-stored.
    assert int(answer.split(b" ", 2)[1]) == 400, answer[:300]
    assert b"X-Kapok-Producer" in answer
    assert all(m.data != b"x" for m in a.broker.messages.values())
    await a.store.snapshot()  # the state is still journal-clean
    image = await a.crash_image(tmp_path / "image")
    b = await start_node(image)
    assert [m.data for m in b.broker.messages.values()] == [b"before"]
