"""Attacks on a live node, each shown to be bounded.

Each test starts a real ``kapok serve``, publishes ``KEPT`` confirmed messages, attacks
it (in smaller, bounded loops than a real attacker would), and then checks three things: a normal
producer and consumer still work, the node's RSS stayed under the bound the test
states, and every confirmed message is still there. The RSS figures are printed (run
with ``-s``): before the attack, at its peak, after.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kapok.bench.proc import rss_bytes
from kapok.launch import NodeProcess, start_node, wait_for
from kapok.testing.nodehttp import scrape_metric
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

AUTH = {"Authorization": "Bearer test"}
KEPT = 300
MB = 1e6
T = scaled(10.0)  # seconds any single step may take
ENDED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[NodeProcess]]:
    started: list[NodeProcess] = []
    yield started
    for node in started:
        node.stop()


def launch(nodes: list[NodeProcess], tmp_path: Path, *sets: str, nofile: int | None = None) -> NodeProcess:
    launcher: tuple[str, ...] = ("-m", "kapok")
    if nofile is not None:  # what `ulimit -n` would do, for this process only
        launcher = (
            "-c",
            f"import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}));"
            " from kapok.cli import main; sys.exit(main())",
        )
    node = start_node(
        tmp_path / f"n{len(nodes)}", "storage.fsync=never", "storage.archive=false", *sets, launcher=launcher
    )
    nodes.append(node)
    return node


def rss_mb(node: NodeProcess) -> float:
    value = rss_bytes(node.pid, children=False)
    assert value is not None
    return value / MB


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=scaled(60))) as s:
        yield s


async def publish(
    session: aiohttp.ClientSession, node: NodeProcess, topic: str, n: int, size: int = 100
) -> list[str]:
    codes: list[str] = []
    while len(codes) < n:
        batch = [{"data": f"{len(codes) + i:08d}".ljust(size, "x")} for i in range(min(500, n - len(codes)))]
        async with session.post(
            f"{node.url}/v1/topics/{topic}/messages", json={"messages": batch}, headers=AUTH
        ) as resp:
            assert resp.status == 200, await resp.text()
            codes += (await resp.json())["codes"]
    return codes


async def drain(
    session: aiohttp.ClientSession, node: NodeProcess, topic: str, limit: int = 1_000_000
) -> set[str]:
    """Pull and ack everything a topic's default group holds (bounded by ``limit``)."""
    got: set[str] = set()
    for _ in range(limit // 1000 + 2):
        async with session.get(f"{node.url}/v1/topics/{topic}/messages?max=1000", headers=AUTH) as resp:
            assert resp.status == 200, await resp.text()
            codes = [m["code"] for m in (await resp.json())["messages"]]
        if not codes:
            return got
        got.update(codes)
        async with session.post(
            f"{node.url}/v1/topics/{topic}/ack", json={"codes": codes}, headers=AUTH
        ) as r:
            assert r.status == 200
    raise AssertionError(f"{topic} did not drain")


async def pair_works(session: aiohttp.ClientSession, node: NodeProcess, n: int = 50) -> None:
    """A native producer and consumer on their own connections: every message arrives."""
    topic = f"pair-{uuid.uuid4().hex[:8]}"
    async with (
        session.ws_connect(node.ws_url + "/v1/ws", headers=AUTH) as consumer,
        session.ws_connect(node.ws_url + "/v1/ws", headers=AUTH) as producer,
    ):
        await consumer.send_json({"op": "sub", "id": 1, "topic": topic})
        assert (await consumer.receive_json(timeout=T))["op"] == "subok"
        await producer.send_json(
            {"op": "pub", "id": 2, "topic": topic, "msgs": [{"data": str(i)} for i in range(n)]}
        )
        assert (await producer.receive_json(timeout=T))["op"] == "puback"
        seen: set[str] = set()
        while len(seen) < n:
            frame = await consumer.receive_json(timeout=T)
            assert frame["op"] == "msg", frame
            seen.update(m["data"] for m in frame["msgs"])
            await consumer.send_json(
                {"op": "ack", "sub": frame["sub"], "codes": [m["code"] for m in frame["msgs"]]}
            )
        assert seen == {str(i) for i in range(n)}


async def metric(session: aiohttp.ClientSession, node: NodeProcess, name: str) -> float:
    return await scrape_metric(session, node.url, name)


async def after_attack(
    session: aiohttp.ClientSession,
    node: NodeProcess,
    kept: list[str],
    bound_mb: float,
    before_mb: float,
    what: str,
) -> None:
    await pair_works(session, node)
    after = rss_mb(node)
    print(f"\n{what}: RSS {before_mb:.0f} MB before, {after:.0f} MB after (bound {bound_mb:.0f} MB)")
    assert after < bound_mb, f"{what}: RSS {after:.0f} MB over {bound_mb:.0f} MB"
    assert await drain(session, node, "kept") == set(kept), "a confirmed message was lost"
    assert "Traceback" not in node.output, node.output[-3000:]


# ---------------------------------------------------------------- 1. idle and slow HTTP


async def test_1_silent_and_slow_connections_are_timed_out_and_counted_from_accept(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    # ulimit -n 400: the node lowers max_connections to what it can open.
    node = launch(nodes, tmp_path, "server.header_timeout_s=1.5", "server.body_timeout_s=1.5", nofile=400)
    kept = await publish(session, node, "kept", KEPT)
    before = rss_mb(node)
    host, port = node.url.removeprefix("http://").split(":")
    silent = [await asyncio.open_connection(host, int(port)) for _ in range(500)]
    slow = [await asyncio.open_connection(host, int(port)) for _ in range(50)]
    for _, writer in slow[:40]:  # slow headers
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    for _, writer in slow[40:]:  # a slow body: the headers promise 100 bytes, 10 come
        writer.write(
            b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"data": '
        )
    for _ in range(3):  # slow-loris: a header byte now and then, never the end of the headers
        await asyncio.sleep(0.3)
        for _, writer in slow[:40]:
            writer.write(b"X")
    # While 550 sockets sit on a node that may hold 336, normal clients are served.
    await pair_works(session, node)
    async with session.get(node.url + "/health") as resp:
        assert resp.status == 200
    assert await metric(session, node, "kapok_connections_max") == 400 - 64

    async def all_closed_by_the_node() -> bool:
        for reader, _ in silent + slow:
            if not reader.at_eof():
                try:
                    await asyncio.wait_for(reader.read(1000), 0.01)
                except TimeoutError:
                    return False
        return True

    for _ in range(round(scaled(100))):  # 10 s of looking, more on a loaded machine
        if await all_closed_by_the_node():
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the node left idle connections open")
    for _, writer in silent + slow:
        writer.close()
    timed_out = await metric(session, node, 'kapok_connections_closed_total{reason="header_timeout"}')
    evicted = await metric(session, node, 'kapok_connections_closed_total{reason="evicted"}')
    slow_bodies = await metric(session, node, 'kapok_connections_closed_total{reason="body_timeout"}')
    assert timed_out + evicted + slow_bodies >= 550 and timed_out > 0 and evicted > 0 and slow_bodies == 10
    lines = [line for line in node.output.splitlines() if "connection(s)" in line]
    assert 0 < len(lines) < 40, lines  # a line per sweep and reason, not one per connection
    await after_attack(session, node, kept, before + 60, before, "silent and slow connections")


# ---------------------------------------------------------------- 2. unauthenticated handshakes


async def test_2_silent_handshakes_never_lock_out_a_client_with_the_key(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = launch(nodes, tmp_path, "server.max_connections=50", "server.auth_timeout_s=3")
    kept = await publish(session, node, "kept", KEPT)
    before = rss_mb(node)
    silent = []
    for i in range(50):
        ws = await session.ws_connect(f"{node.ws_url}/Producers/Conn/t/silent{i}")
        assert (await ws.receive(timeout=T)).data == "Please enter the secret key"
        silent.append(ws)
    # All 50 slots hold unauthenticated sockets; the right key still gets in at once.
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/kept/real") as ws:
        assert (await ws.receive(timeout=T)).data == "Please enter the secret key"
        await ws.send_str("test")
        assert (await ws.receive(timeout=T)).data == "Secret key matching succeeded"
        await ws.send_str(json.dumps({"MessageData": "with the key", "DelayTime": 0}))
        assert (await ws.receive(timeout=T)).data == "ok"
    assert await metric(session, node, 'kapok_connections_closed_total{reason="evicted"}') >= 1
    for ws in silent:  # the rest are closed by the handshake time-out (1008)
        msg = await ws.receive(timeout=T)
        assert msg.type in ENDED
        await ws.close()
    kept.append("")  # the KapokMQ message above is checked by its payload instead
    got = await drain(session, node, "kept")
    assert len(got) == KEPT + 1
    await after_attack(session, node, [], before + 40, before, "silent handshakes")
    assert set(kept[:-1]) <= got


# ---------------------------------------------------------------- 3. node-wide backlog


async def test_3_the_backlog_is_bounded_and_answered_with_queue_full(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    limit = 32 * 1024 * 1024
    node = launch(nodes, tmp_path, f"mq.max_backlog_bytes={limit}")
    kept = await publish(session, node, "kept", KEPT)
    before = rss_mb(node)
    confirmed = 0
    refusal: dict[str, Any] = {}
    async with session.ws_connect(node.ws_url + "/v1/ws", headers=AUTH) as ws:
        batch = [{"data": "x" * 100}] * 1000
        for i in range(200):  # 200,000 messages would be ~20 MB of payload and ~120 MB of node
            await ws.send_json({"op": "pub", "id": i, "topic": "flood", "msgs": batch})
            frame = await ws.receive_json(timeout=T)
            if frame["op"] == "error":
                refusal = frame
                break
            confirmed += len(frame["codes"])
    assert refusal.get("code") == "queue_full", refusal
    peak = rss_mb(node)
    print(f"\nbacklog: {confirmed} messages confirmed before queue_full; RSS {before:.0f} -> {peak:.0f} MB")
    assert 40_000 < confirmed < 60_000  # 32 MiB / (100 + 512) B ≈ 54,800
    for _ in range(1000):  # the last few hundred that fit, one at a time, then 507
        async with session.post(
            f"{node.url}/v1/topics/flood/messages", json={"data": "x" * 100}, headers=AUTH
        ) as resp:
            if resp.status == 507:
                assert (await resp.json())["error"] == "queue_full"
                break
            assert resp.status == 200
            confirmed += 1
    else:
        raise AssertionError("the backlog never filled up")
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/flood/p") as ws:
        await ws.receive(timeout=T)
        await ws.send_str("test")
        await ws.receive(timeout=T)
        await ws.send_str(json.dumps({"MessageData": "x", "DelayTime": 0}))
        answer = json.loads((await ws.receive(timeout=T)).data)
        assert answer["code"] == -1 and "backlog" in answer["msg"]
    assert len(await drain(session, node, "flood")) == confirmed  # every confirmed one is there
    await after_attack(session, node, kept, before + 150, before, "backlog flood")


# ---------------------------------------------------------------- 4. a consumer that stops reading


async def upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Make a raw socket a /v1/ws WebSocket (to send or read what no client library would)."""
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Authorization: Bearer test\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head


def masked(payload: bytes) -> bytes:
    """One client text frame (RFC 6455: masked), for a raw socket."""
    key = os.urandom(4)
    n = len(payload)
    head = bytes((0x81, 0x80 | n)) if n < 126 else bytes((0x81, 0x80 | 126)) + n.to_bytes(2, "big")
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


async def test_4_a_stalled_consumer_holds_a_bounded_send_queue_whatever_its_prefetch(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = launch(
        nodes,
        tmp_path,
        "mq.max_prefetch=1000000",
        "server.send_queue_max_bytes=1048576",
        "server.heartbeat_s=3",
    )
    kept = await publish(session, node, "kept", KEPT)
    backlog = await publish(session, node, "slow", 20_000, size=2000)  # 40 MB of payload
    before = rss_mb(node)
    host, port = node.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    await upgrade(reader, writer)
    writer.write(masked(json.dumps({"op": "sub", "id": 1, "topic": "slow", "prefetch": 1_000_000}).encode()))
    # ... and never reads again. Wait until the node has stopped delivering to it.
    last, steady = -1.0, 0
    for _ in range(100):
        await asyncio.sleep(0.3)
        now = await metric(session, node, "kapok_messages_delivered_total")
        steady = steady + 1 if now == last else 0
        last = now
        if steady >= 3:
            break
    stalled = rss_mb(node)
    print(
        f"\nstalled consumer, prefetch 1,000,000: {last:.0f} of 20,000 delivered; "
        f"RSS {before:.0f} -> {stalled:.0f} MB"
    )
    assert last < 10_000  # without the send room it took all 20,000 (~45 MB of frames)
    assert stalled - before < 25
    writer.close()  # its deliveries go back to the queue
    got = await drain(session, node, "slow")
    assert got == set(backlog)
    await after_attack(session, node, kept, before + 40, before, "stalled consumer")


# ---------------------------------------------------------------- 5. memory per handshake


async def test_5_refused_handshakes_give_their_memory_back(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = launch(nodes, tmp_path, "server.auth_timeout_s=0.3")
    kept = await publish(session, node, "kept", KEPT)
    gate = asyncio.Semaphore(200)

    async def refused_handshake(i: int) -> None:
        """The prompt, then silence until the node gives up (or, every other one, leave)."""
        async with gate, session.ws_connect(f"{node.ws_url}/Consumers/Conn/t/c{i}") as ws:
            await ws.receive(timeout=T)
            if i % 2:
                msg = await ws.receive(timeout=T)
                assert msg.type in ENDED

    await asyncio.gather(*(refused_handshake(i) for i in range(400)))  # warm-up
    before = rss_mb(node)
    rss = [before]
    for round_ in range(3):
        await asyncio.gather(*(refused_handshake(i) for i in range(1000)))
        rss.append(rss_mb(node))
        print(f"\nafter {(round_ + 1) * 1000} handshakes: RSS {rss[-1]:.0f} MB (from {before:.0f})")
    # Warm-up and the allocator's high-water mark come first; then the growth must stop.
    # (While each kept ~10 KB for heartbeat_s, every 1,000 more added 6-8 MB.)
    assert rss[3] - rss[2] < 4, rss
    assert rss[3] - before < 18, rss
    await after_attack(session, node, kept, before + 30, before, "3,000 unauthenticated handshakes")


# ---------------------------------------------------------------- 6. brute force


async def test_6_wrong_keys_make_their_address_wait_on_every_route(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = launch(nodes, tmp_path, "server.auth_backoff_s=30")
    kept = await publish(session, node, "kept", KEPT)
    before = rss_mb(node)
    attacker = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=0)  # not the real clients' address
    async with aiohttp.ClientSession(connector=attacker) as evil:

        async def guess(key: str, patience_s: float) -> int | None:
            """The status, or None if no answer came within ``patience_s`` (the guesser
            moves on: a right key would have been a 200 within a round trip)."""
            try:
                async with evil.get(
                    node.url + "/v1/topics",
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=aiohttp.ClientTimeout(total=patience_s),
                ) as resp:
                    if resp.status == 429:
                        assert int(resp.headers["Retry-After"]) > 0
                    return resp.status
            except TimeoutError:
                return None

        assert [await guess(f"guess{i}", T) for i in range(10)] == [401] * 10  # the free ones
        # 100 new guesses at once: 4 are compared and held (their 401s would come after 30,
        # 60, 120 and 240 s, whether or not anyone waits), the other 96 are refused unseen.
        patience_s = min(scaled(3.0), 20.0)  # for the 429s; well short of the held ones' 30 s
        statuses = await asyncio.gather(*(guess(f"parallel{i}", patience_s) for i in range(100)))
        assert statuses.count(None) == 4 and statuses.count(429) == 96, statuses
        # While those four hold the address's slots it may test no key on any route, not
        # even the right one: compared, the right key would pass and every 429 would say
        # "wrong" at once, as fast as guesses can be sent.
        async with evil.get(node.url + "/v1/topics", headers=AUTH) as resp:
            assert resp.status == 429
        async with evil.get(node.url + "/sync/v1", headers=AUTH) as resp:
            assert resp.status == 429
        async with evil.post(
            f"{node.url}/Producer/Send",
            headers={"secretKey": "test"},
            data={"messageData": "x", "topic": "t", "delayTime": "0"},
        ) as resp:
            assert (await resp.json())["code"] == -1
        async with evil.ws_connect(f"{node.ws_url}/Producers/Conn/t/p") as ws:
            assert (await ws.receive(timeout=T)).data == "Please enter the secret key"
            await ws.send_str("test")
            assert (await ws.receive(timeout=T)).data == "Secret key matching error"
            msg = await ws.receive(timeout=T)
            assert msg.type is aiohttp.WSMsgType.CLOSE and ws.close_code == 1008
    assert await metric(session, node, "kapok_auth_failures_total") == 14  # keys compared and wrong
    await after_attack(session, node, kept, before + 20, before, "brute force")  # 127.0.0.1 is not affected


async def test_6_a_wrong_key_hammering_from_the_clients_own_address_does_not_lock_them_out(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    # A slave with the wrong key (or clients not yet given a new key) on the same
    # host as clients with the right one. The back-off is long (30 s), so any wait shows.
    node = launch(nodes, tmp_path, "server.auth_backoff_s=30")
    kept = await publish(session, node, "kept", KEPT)
    before = rss_mb(node)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    hammered: list[int] = []

    async def hammer(path: str, headers: dict[str, str]) -> None:
        async with aiohttp.ClientSession() as peer:  # from 127.0.0.1, as fast as it is answered
            while not stop.is_set():
                async with peer.get(node.url + path, headers=headers) as resp:
                    hammered.append(resp.status)

    async def misconfigured_kapokmq_client() -> None:
        async with aiohttp.ClientSession() as peer:
            while not stop.is_set():
                async with peer.ws_connect(f"{node.ws_url}/Producers/Conn/t/p") as ws:
                    async for msg in ws:
                        if msg.data == "Please enter the secret key":
                            await ws.send_str("old-key")
                        else:
                            assert msg.data == "Secret key matching error", msg

    wrong = {"Authorization": "Bearer old-key"}
    peers = [
        *(asyncio.create_task(hammer("/sync/v1", wrong)) for _ in range(3)),  # the slave's link
        asyncio.create_task(hammer("/v1/topics", wrong)),
        asyncio.create_task(hammer("/v1/topics", {})),  # no key at all
        asyncio.create_task(misconfigured_kapokmq_client()),
    ]
    # Meanwhile a client with the key, also from 127.0.0.1, each time on a new connection.
    waits: list[float] = []
    until = loop.time() + 5.0
    while loop.time() < until or len(hammered) < 300:
        assert not any(task.done() for task in peers), [t.exception() for t in peers if t.done()]
        async with aiohttp.ClientSession() as client:
            started = loop.time()
            async with client.get(node.url + "/v1/topics", headers=AUTH) as resp:
                assert resp.status == 200, f"after {len(hammered)} wrong keys: {await resp.text()}"
            waits.append(loop.time() - started)
        if len(waits) % 10 == 0:  # and a KapokMQ producer with the key
            async with session.ws_connect(f"{node.ws_url}/Producers/Conn/compat/p") as ws:
                assert (await ws.receive(timeout=T)).data == "Please enter the secret key"
                await ws.send_str("test")
                assert (await ws.receive(timeout=T)).data == "Secret key matching succeeded"
    stop.set()
    await asyncio.gather(*peers)
    print(f"\n{len(hammered)} wrong keys; {len(waits)} right ones, the slowest in {max(waits) * 1000:.0f} ms")
    assert set(hammered) == {401}  # a repeated wrong key is answered at once and blocks nothing
    assert max(waits) < min(scaled(2.0), 10.0)  # none waited behind the wrong ones (the back-off is 30 s)
    await after_attack(session, node, kept, before + 20, before, "a misconfigured peer")


# ---------------------------------------------------------------- 7. the smaller ones


async def test_7_big_bodies_empty_frames_unmasked_frames_and_garbage_requests(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = launch(nodes, tmp_path)
    kept = await publish(session, node, "kept", KEPT)
    before = rss_mb(node)
    host, port = node.url.removeprefix("http://").split(":")
    # A 50 MB body: refused from its headers, before a byte of it is sent.
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test\r\n"
        b"Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n"
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), T)
    assert head.startswith(b"HTTP/1.1 413"), head
    writer.close()
    # A KapokMQ frame without MessageData: an error frame, nothing stored.
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/empty/p") as ws:
        await ws.receive(timeout=T)
        await ws.send_str("test")
        await ws.receive(timeout=T)
        await ws.send_str('{"DelayTime": 0}')
        assert json.loads((await ws.receive(timeout=T)).data)["code"] == -1
    async with session.get(f"{node.url}/v1/topics/empty", headers=AUTH) as resp:
        assert resp.status == 404 or (await resp.json())["live"] == 0
    # An unmasked client frame on /v1/ws: closed with 1002.
    reader, writer = await asyncio.open_connection(host, int(port))
    await upgrade(reader, writer)
    writer.write(b'\x81\x0f{"op": "ping"}')
    close = await asyncio.wait_for(reader.readexactly(4), T)
    assert close[0] == 0x88 and int.from_bytes(close[2:4], "big") == 1002
    writer.close()
    # 200 malformed request lines: counted, a few log lines, no traceback.
    for _ in range(200):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"\x16\x03\x01 not http at all\r\n\r\n")
        await asyncio.wait_for(reader.read(), T)
        writer.close()
    await asyncio.to_thread(wait_for, lambda: "(bad_request)" in node.output, scaled(5))
    assert await metric(session, node, 'kapok_connections_closed_total{reason="bad_request"}') == 200
    assert len([line for line in node.output.splitlines() if "bad_request" in line]) < 10
    await after_attack(session, node, kept, before + 20, before, "small ones")
