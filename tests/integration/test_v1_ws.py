"""The native WebSocket protocol at ``/v1/ws``, over real sockets with a raw aiohttp client.

Frames of different ops are matched by ``op`` and ``id``, never by arrival
order: after a ``pub``, the ``msg`` push to a subscriber on the same
connection may come before the ``puback``. What is *not* pushed is checked
with a ping (``Ws.nothing_more``), and deadlines and delays are driven by a
``ManualClock``: no test waits to see that nothing arrives.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from kapok.protocol.native import decode_frame, encode_pub
from kapok.testing import ManualClock, eventually
from kapok.testing.slow import scaled

CODE_RE = re.compile(r"^[0-9a-f]{32}$")
T = scaled(3.0)  # upper bound of every single wait

Frame = dict[str, Any]


def pushed_to(sub: int) -> Callable[[Frame], bool]:
    """Matches the ``msg`` frames of subscription ``sub``."""
    return lambda f: f.get("op") == "msg" and f.get("sub") == sub


class Ws:
    """A raw ``/v1/ws`` client that buffers frames it was not asked for yet."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.pending: list[Frame] = []
        self._rid = 0

    async def send(self, op: str, **fields: Any) -> int:
        self._rid += 1
        rid = self._rid
        await self.ws.send_str(json.dumps({"op": op, "id": rid, **fields}))
        return rid

    async def _read(self, timeout: float) -> Frame:
        msg = await self.ws.receive(timeout=timeout)
        if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            text = msg.data if isinstance(msg.data, str) else msg.data.decode()
            assert "Traceback" not in text
            return decode_frame(text)
        raise AssertionError(f"connection ended: {msg.type} {msg.data!r} {msg.extra!r}")

    async def poll(self, pred: Callable[[Frame], bool], timeout: float) -> Frame | None:
        """The first frame matching ``pred`` (buffered or new), or None after ``timeout``."""
        for i, frame in enumerate(self.pending):
            if pred(frame):
                return self.pending.pop(i)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (remaining := deadline - loop.time()) > 0:
            try:
                frame = await self._read(remaining)
            except TimeoutError:
                return None
            if pred(frame):
                return frame
            self.pending.append(frame)
        return None

    async def expect(self, pred: Callable[[Frame], bool], timeout: float = T) -> Frame:
        frame = await self.poll(pred, timeout)
        assert frame is not None, f"no matching frame within {timeout}s; unmatched: {self.pending}"
        return frame

    async def reply(self, rid: int, timeout: float = T) -> Frame:
        return await self.expect(lambda f: f.get("id") == rid and f.get("op") != "msg", timeout)

    async def request(self, op: str, **fields: Any) -> Frame:
        return await self.reply(await self.send(op, **fields))

    async def pub(self, topic: str, *msgs: str | Frame) -> list[str]:
        self._rid += 1
        await self.ws.send_bytes(
            encode_pub(self._rid, [m if isinstance(m, dict) else {"data": m} for m in msgs], topic)
        )
        answer = await self.reply(self._rid)
        assert answer["op"] == "puback", answer
        codes: list[str] = answer["codes"]
        return codes

    async def sub(self, topic: str, **opts: Any) -> int:
        answer = await self.request("sub", topic=topic, **opts)
        assert answer["op"] == "subok", answer
        sub: int = answer["sub"]
        return sub

    async def msgs(self, sub: int, n: int, timeout: float = T) -> list[Frame]:
        """At least ``n`` pushed messages of ``sub``, in arrival order."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Frame] = []
        while len(out) < n:
            frame = await self.poll(pushed_to(sub), deadline - loop.time())
            assert frame is not None, f"got {len(out)} of {n} messages within {timeout}s"
            out.extend(frame["msgs"])
        return out

    async def nothing_more(self, sub: int) -> None:
        """Assert that the node has pushed nothing to ``sub`` that was not taken yet.

        A connection's frames leave the node in the order they were queued, so the
        answer to a ping comes after everything queued before the ping was read: what
        the requests sent before it pushed, and what a ``ManualClock`` advanced before
        it released. No waiting on a guess: the pong is the proof.
        """
        pong = await self.request("ping")
        assert pong["op"] == "pong", pong
        unexpected = [f for f in self.pending if pushed_to(sub)(f)]
        assert not unexpected, f"unexpected push: {unexpected}"

    async def ack(self, sub: int, codes: list[str]) -> None:
        answer = await self.request("ack", sub=sub, codes=codes)
        assert answer["op"] == "ok", answer


Connect = Callable[..., Awaitable[Ws]]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def connect(session: aiohttp.ClientSession, auth: dict[str, str]) -> AsyncIterator[Connect]:
    opened: list[aiohttp.ClientWebSocketResponse] = []

    async def _connect(node: Any, client: str | None = None) -> Ws:
        url = node.ws_url + "/v1/ws" + (f"?client={client}" if client else "")
        ws = await session.ws_connect(url, headers=auth)
        opened.append(ws)
        return Ws(ws)

    yield _connect
    for ws in opened:
        await ws.close()


def datas(msgs: list[Frame]) -> list[str]:
    return [m["data"] for m in msgs]


# ---------------------------------------------------------------- auth


def _upgrade_headers() -> dict[str, str]:
    return {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
    }


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic test", "Bearer"])
async def test_upgrade_without_right_bearer_is_401_json(
    node: Any, session: aiohttp.ClientSession, authorization: str | None
) -> None:
    headers = _upgrade_headers()
    if authorization is not None:
        headers["Authorization"] = authorization
    async with session.get(node.url + "/v1/ws", headers=headers) as resp:
        assert resp.status == 401
        assert resp.content_type == "application/json"
        body = await resp.json()
    assert body["error"] == "unauthorized"
    assert isinstance(body["message"], str) and body["message"]
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        extra = {"Authorization": authorization} if authorization else {}
        await session.ws_connect(node.ws_url + "/v1/ws", headers=extra)
    assert info.value.status == 401


# ---------------------------------------------------------------- publish and subscribe


async def test_pub_batch_gets_codes_in_order(node: Any, connect: Connect) -> None:
    c = await connect(node)
    codes = await c.pub("orders", "a", "b", "c")
    assert len(codes) == 3 and len(set(codes)) == 3
    assert all(CODE_RE.match(code) for code in codes)
    assert codes == sorted(codes)  # sortable by creation
    sub = await c.sub("orders")
    got = await c.msgs(sub, 3)
    assert [m["code"] for m in got] == codes
    assert datas(got) == ["a", "b", "c"]
    first = got[0]
    assert first["topic"] == "orders" and first["attempts"] == 1 and first["redelivered"] is False
    assert first["priority"] == 0 and first["key"] == ""


async def test_pub_with_per_message_topics(node: Any, connect: Connect) -> None:
    c = await connect(node)
    answer = await c.request("pub", msgs=[{"topic": "t1", "data": "x"}, {"topic": "t2", "data": "y"}])
    assert answer["op"] == "puback" and len(answer["codes"]) == 2
    s1 = await c.sub("t1")
    s2 = await c.sub("t2")
    assert datas(await c.msgs(s1, 1)) == ["x"]
    assert datas(await c.msgs(s2, 1)) == ["y"]


async def test_subok_comes_before_the_first_msg(node: Any, connect: Connect) -> None:
    c = await connect(node)
    await c.pub("jobs", "1", "2", "3")
    rid = await c.send("sub", topic="jobs", prefetch=10)
    first = await c._read(3.0)
    assert first == {"op": "subok", "id": rid, "sub": first["sub"], "group": "default", "prefetch": 10}
    got = await c.msgs(first["sub"], 3)
    assert datas(got) == ["1", "2", "3"]


async def test_pushes_are_batched_into_few_frames(node: Any, connect: Connect) -> None:
    c = await connect(node)
    await c.pub("bulk", *[str(i) for i in range(50)])
    sub = await c.sub("bulk", prefetch=100)
    frames = 0
    got: list[Frame] = []
    while len(got) < 50:
        frame = await c.expect(lambda f: f.get("op") == "msg" and f.get("sub") == sub)
        frames += 1
        got.extend(frame["msgs"])
    assert datas(got) == [str(i) for i in range(50)]
    assert frames < 50


async def test_prefetch_limits_unacked_and_credit_raises_it(node: Any, connect: Connect) -> None:
    c = await connect(node)
    await c.pub("flow", *[str(i) for i in range(20)])
    sub = await c.sub("flow", prefetch=5)
    first = await c.msgs(sub, 5)
    assert datas(first) == ["0", "1", "2", "3", "4"]
    await c.nothing_more(sub)
    answer = await c.request("credit", sub=sub, prefetch=8)
    assert answer == {"op": "ok", "id": answer["id"], "prefetch": 8}
    more = await c.msgs(sub, 3)
    assert datas(more) == ["5", "6", "7"]
    await c.nothing_more(sub)
    await c.ack(sub, [m["code"] for m in first + more])
    rest = await c.msgs(sub, 8)
    assert datas(rest) == [str(i) for i in range(8, 16)]
    await c.nothing_more(sub)


async def test_ack_unknown_code_reports_it_and_settles_the_rest(node: Any, connect: Connect) -> None:
    c = await connect(node)
    await c.pub("acks", "a", "b", "c", "d")
    sub = await c.sub("acks", prefetch=2)
    held = await c.msgs(sub, 2)
    bogus = "f" * 32
    rid = await c.send("ack", sub=sub, codes=[held[0]["code"], bogus, held[1]["code"]])
    err = await c.reply(rid)
    assert err["op"] == "error" and err["code"] == "unknown_code"
    assert err["codes"] == [bogus]
    assert err["id"] == rid and err["message"]
    # Both real codes were settled: credit came back and the next two arrive.
    assert datas(await c.msgs(sub, 2)) == ["c", "d"]


async def test_nack_requeue_redelivers(node: Any, connect: Connect) -> None:
    c = await connect(node)
    (code,) = await c.pub("retry", "x")
    sub = await c.sub("retry")
    (m,) = await c.msgs(sub, 1)
    assert m["attempts"] == 1 and m["redelivered"] is False
    answer = await c.request("nack", sub=sub, codes=[code])
    assert answer["op"] == "ok"
    (again,) = await c.msgs(sub, 1)
    assert again["code"] == code
    assert again["attempts"] == 2 and again["redelivered"] is True


async def test_nack_without_requeue_dead_letters(node: Any, connect: Connect) -> None:
    c = await connect(node)
    (code,) = await c.pub("mail", "poison")
    sub = await c.sub("mail")
    await c.msgs(sub, 1)
    answer = await c.request("nack", sub=sub, codes=[code], requeue=False)
    assert answer["op"] == "ok"
    await c.nothing_more(sub)
    dlq = await c.sub("mail.dlq")
    (dead,) = await c.msgs(dlq, 1)
    assert dead["topic"] == "mail.dlq" and dead["data"] == "poison"
    assert dead["headers"]["original_code"] == code
    assert dead["headers"]["original_topic"] == "mail"
    assert dead["headers"]["reason"] == "rejected"


async def test_max_deliveries_dead_letters(make_node: Any, connect: Connect) -> None:
    node = await make_node("mq.max_deliveries=2")
    c = await connect(node)
    (code,) = await c.pub("flaky", "boom")
    sub = await c.sub("flaky")
    for attempt in (1, 2):
        (m,) = await c.msgs(sub, 1)
        assert m["attempts"] == attempt
        assert (await c.request("nack", sub=sub, codes=[code]))["op"] == "ok"
    await c.nothing_more(sub)
    dlq = await c.sub("flaky.dlq")
    (dead,) = await c.msgs(dlq, 1)
    assert dead["headers"]["original_code"] == code
    assert dead["headers"]["reason"] == "max_deliveries"
    assert dead["headers"]["attempts"] == "2"


async def test_ack_timeout_redelivers(make_node: Any, connect: Connect, clock: ManualClock) -> None:
    node = await make_node("mq.ack_timeout_s=5", clock=clock)
    c = await connect(node)
    (code,) = await c.pub("slow", "x")
    sub = await c.sub("slow")
    await c.msgs(sub, 1)
    clock.advance(4.9)
    await c.nothing_more(sub)  # not before the ack deadline
    clock.advance(0.2)
    (again,) = await c.msgs(sub, 1)
    assert again["code"] == code and again["attempts"] == 2


async def test_touch_extends_the_deadline(make_node: Any, connect: Connect, clock: ManualClock) -> None:
    node = await make_node("mq.ack_timeout_s=10", clock=clock)
    c = await connect(node)
    touched, untouched = await c.pub("work", "touched", "untouched")
    sub = await c.sub("work")
    await c.msgs(sub, 2)  # delivered at t0: both due back at t0 + 10
    clock.advance(6)
    answer = await c.request("touch", sub=sub, codes=[touched])
    assert answer["op"] == "ok"  # touched: one ack_timeout_s from now, t0 + 16
    # The untouched one times out at the original deadline; the touched one does not.
    clock.advance(4.1)
    (redo,) = await c.msgs(sub, 1)
    assert redo["code"] == untouched and redo["attempts"] == 2
    clock.advance(5.8)
    await c.nothing_more(sub)
    clock.advance(0.2)
    (late,) = await c.msgs(sub, 1)
    assert late["code"] == touched and late["attempts"] == 2


async def test_touch_of_unknown_code_is_reported(node: Any, connect: Connect) -> None:
    c = await connect(node)
    sub = await c.sub("t")
    err = await c.request("touch", sub=sub, codes=["nope"])
    assert err["op"] == "error" and err["code"] == "unknown_code" and err["codes"] == ["nope"]


async def test_auto_ack_consumes_without_acks(
    node: Any, connect: Connect, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    c = await connect(node)
    codes = await c.pub("fire", *[str(i) for i in range(5)])
    sub = await c.sub("fire", ack="auto", prefetch=2)
    got = await c.msgs(sub, 5)  # more than the prefetch: no acks were needed
    assert [m["code"] for m in got] == codes

    async def consumed(code: str) -> Frame | None:
        async with session.get(f"{node.url}/v1/messages/{code}", headers=auth) as resp:
            assert resp.status == 200
            body: Frame = await resp.json()
        return body if body["groups"]["default"]["status"] == "consumed" else None

    for code in codes:
        body = await eventually(functools.partial(consumed, code), what=f"{code} consumed")
        assert body is not None  # eventually returns only a true result
        assert body["finished_at"]
    # Acking an auto-acked message is an unknown code: nothing is held.
    err = await c.request("ack", sub=sub, codes=[codes[0]])
    assert err["code"] == "unknown_code"


# ---------------------------------------------------------------- groups and modes


@pytest.mark.parametrize("ack", ["auto", "manual"])
async def test_named_groups_each_get_every_message(node: Any, connect: Connect, ack: str) -> None:
    a = await connect(node)
    b = await connect(node)
    sa = await a.sub("events", group="billing", ack=ack)
    sb = await b.sub("events", group="audit", ack=ack)
    producer = await connect(node)
    codes = await producer.pub("events", "1", "2", "3")
    for c, sub in ((a, sa), (b, sb)):
        got = await c.msgs(sub, 3)
        assert [m["code"] for m in got] == codes
        if ack == "manual":
            await c.ack(sub, codes)


async def test_named_group_is_durable(node: Any, connect: Connect) -> None:
    c = await connect(node)
    sub = await c.sub("durable", group="g")
    assert (await c.request("unsub", sub=sub))["op"] == "ok"
    await c.pub("durable", "kept")
    again = await c.sub("durable", group="g")
    assert datas(await c.msgs(again, 1)) == ["kept"]


async def test_consumers_in_one_group_share(node: Any, connect: Connect) -> None:
    a = await connect(node)
    b = await connect(node)
    sa = await a.sub("tasks", group="workers")
    sb = await b.sub("tasks", group="workers")
    producer = await connect(node)
    codes = await producer.pub("tasks", *[str(i) for i in range(10)])
    got_a: list[Frame] = []
    got_b: list[Frame] = []

    async def all_delivered() -> bool:
        for c, sub, got in ((a, sa, got_a), (b, sb, got_b)):
            if (f := await c.poll(pushed_to(sub), 0.01)) is not None:
                got.extend(f["msgs"])
        return len(got_a) + len(got_b) >= 10

    await eventually(all_delivered, what="the 10 messages delivered")
    codes_a = {m["code"] for m in got_a}
    codes_b = {m["code"] for m in got_b}
    assert codes_a and codes_b
    assert not codes_a & codes_b
    assert codes_a | codes_b == set(codes)
    await a.nothing_more(sa)
    await b.nothing_more(sb)


@pytest.mark.parametrize("ack", ["auto", "manual"])
async def test_pubsub_topic_anonymous_subscribers_each_get_a_copy(
    make_node: Any, connect: Connect, ack: str
) -> None:
    node = await make_node("mq.topics.news.push_type=2")
    a = await connect(node)
    b = await connect(node)
    answer_a = await a.request("sub", topic="news", ack=ack)
    answer_b = await b.request("sub", topic="news", ack=ack)
    assert answer_a["group"].startswith("~") and answer_b["group"].startswith("~")
    assert answer_a["group"] != answer_b["group"]
    producer = await connect(node)
    codes = await producer.pub("news", "h1", "h2")
    for c, answer in ((a, answer_a), (b, answer_b)):
        got = await c.msgs(answer["sub"], 2)
        assert [m["code"] for m in got] == codes
        if ack == "manual":
            await c.ack(answer["sub"], codes)
    # A subscriber that joins later does not get what was published before.
    late = await connect(node)
    sub = await late.sub("news")
    await late.nothing_more(sub)


ROUTED = [("1", "eu.de"), ("2", "us.x"), ("3", "eu.de.berlin"), ("4", "")]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [("eu.*", ["1"]), ("#", ["1", "2", "3", "4"]), ("eu.#", ["1", "3"]), ("us.x", ["2"])],
)
async def test_routing_key_patterns(node: Any, connect: Connect, pattern: str, expected: list[str]) -> None:
    # One group per topic here: see test_named_groups_each_get_every_message for several.
    c = await connect(node)
    sub = await c.sub("geo", group="g", key=pattern)
    await c.pub("geo", *[{"data": d, "key": k} for d, k in ROUTED])
    got = await c.msgs(sub, len(expected))
    assert datas(got) == expected
    assert all(m["key"] == dict(ROUTED)[m["data"]] for m in got)
    await c.nothing_more(sub)
    # What matched nothing is not dropped: it waits for a matching subscription.
    rest = [d for d, _ in ROUTED if d not in expected]
    if rest:
        other = await c.sub("geo", group="g", key="#")
        assert sorted(datas(await c.msgs(other, len(rest)))) == rest


async def test_priority_first(node: Any, connect: Connect) -> None:
    c = await connect(node)
    await c.pub("prio", {"data": "low", "priority": 0}, {"data": "mid", "priority": 5})
    await c.pub("prio", {"data": "high", "priority": 9})
    sub = await c.sub("prio", prefetch=1)
    (first,) = await c.msgs(sub, 1)
    assert first["data"] == "high" and first["priority"] == 9
    await c.ack(sub, [first["code"]])
    (second,) = await c.msgs(sub, 1)
    assert second["data"] == "mid"
    await c.ack(sub, [second["code"]])
    assert datas(await c.msgs(sub, 1)) == ["low"]


async def test_delayed_message_waits(make_node: Any, connect: Connect, clock: ManualClock) -> None:
    node = await make_node(clock=clock)
    c = await connect(node)
    sub = await c.sub("later")
    await c.pub("later", {"data": "soon", "delay_s": 0.5}, {"data": "now"})
    (now,) = await c.msgs(sub, 1)
    assert now["data"] == "now"
    clock.advance(0.49)
    await c.nothing_more(sub)  # not before its time
    clock.advance(0.02)
    (soon,) = await c.msgs(sub, 1)
    assert soon["data"] == "soon"
    assert soon["deliver_at"] == pytest.approx(soon["create_time"] + 0.5)


async def test_dedup_id_returns_the_same_code(node: Any, connect: Connect) -> None:
    c = await connect(node)
    (first,) = await c.pub("dedup", {"data": "x", "dedup_id": "order-1"})
    (again,) = await c.pub("dedup", {"data": "x", "dedup_id": "order-1"})
    assert again == first
    both = await c.pub("dedup", {"data": "y", "dedup_id": "order-2"}, {"data": "y", "dedup_id": "order-2"})
    assert both[0] == both[1] != first
    sub = await c.sub("dedup")
    assert datas(await c.msgs(sub, 2)) == ["x", "y"]
    await c.nothing_more(sub)


async def test_queue_full(make_node: Any, connect: Connect) -> None:
    node = await make_node("mq.max_length=3")
    c = await connect(node)
    await c.pub("small", "1", "2", "3")
    rid = await c.send("pub", topic="small", msgs=[{"data": "4"}])
    err = await c.reply(rid)
    assert err["op"] == "error" and err["code"] == "queue_full" and err["id"] == rid
    assert "small" in err["message"]
    # Consuming one makes room again.
    sub = await c.sub("small", prefetch=1)
    (m,) = await c.msgs(sub, 1)
    await c.ack(sub, [m["code"]])
    assert len(await c.pub("small", "4")) == 1


async def test_rate_limited_per_producer(make_node: Any, connect: Connect) -> None:
    node = await make_node("mq.producer_rate=5", "mq.producer_burst=5")
    c = await connect(node, client="fast-producer")
    assert len(await c.pub("rl", *"abcde")) == 5
    rid = await c.send("pub", topic="rl", msgs=[{"data": "x"}] * 3)
    err = await c.reply(rid)
    assert err["op"] == "error" and err["code"] == "rate_limited" and err["id"] == rid
    # Another producer has its own bucket.
    other = await connect(node, client="other-producer")
    assert len(await other.pub("rl", "y")) == 1
    # The refused batch was not stored.
    sub = await other.sub("rl")
    assert datas(await other.msgs(sub, 6)) == ["a", "b", "c", "d", "e", "y"]
    await other.nothing_more(sub)


async def test_disconnect_requeues_unacked_to_another_connection(node: Any, connect: Connect) -> None:
    a = await connect(node)
    codes = await a.pub("handoff", "1", "2", "3")
    sa = await a.sub("handoff")
    await a.msgs(sa, 3)
    b = await connect(node)
    sb = await b.sub("handoff")
    await b.nothing_more(sb)  # everything is held by a
    await a.ws.close()
    got = await b.msgs(sb, 3)
    assert [m["code"] for m in got] == codes
    assert all(m["attempts"] == 2 and m["redelivered"] for m in got)


async def test_ping_pong(node: Any, connect: Connect) -> None:
    c = await connect(node)
    rid = await c.send("ping")
    assert await c.reply(rid) == {"op": "pong", "id": rid}
    await c.ws.send_str(json.dumps({"op": "ping", "id": "abc"}))
    assert await c.expect(lambda f: f.get("id") == "abc") == {"op": "pong", "id": "abc"}
    # A pong from the client is accepted silently.
    await c.send("pong")
    rid = await c.send("ping")
    assert (await c.reply(rid))["op"] == "pong"
    assert c.pending == []


async def test_unsub_stops_pushes(node: Any, connect: Connect) -> None:
    c = await connect(node)
    sub = await c.sub("stop")
    await c.pub("stop", "before")
    assert datas(await c.msgs(sub, 1)) == ["before"]
    answer = await c.request("unsub", sub=sub)
    assert answer["op"] == "ok"
    await c.pub("stop", "after")
    await c.nothing_more(sub)
    err = await c.request("ack", sub=sub, codes=[])
    assert err["op"] == "error" and err["code"] == "bad_subscription"
    # The unacked "before" and the new "after" wait for the next consumer.
    other = await connect(node)
    sub2 = await other.sub("stop")
    assert sorted(datas(await other.msgs(sub2, 2))) == ["after", "before"]


async def test_binary_frames_are_accepted(node: Any, connect: Connect) -> None:
    c = await connect(node)
    await c.ws.send_bytes(
        json.dumps({"op": "pub", "id": 7, "topic": "bin", "msgs": [{"data": "b"}]}).encode()
    )
    answer = await c.reply(7)
    assert answer["op"] == "puback" and len(answer["codes"]) == 1
    await c.ws.send_bytes(json.dumps({"op": "ping", "id": 8}).encode())
    assert await c.reply(8) == {"op": "pong", "id": 8}


async def test_base64_payload_round_trips(
    node: Any, connect: Connect, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    raw = b"\xff\xfe\x00\x80binary\xc3"
    c = await connect(node)
    (code,) = await c.pub("bytes", {"data": base64.b64encode(raw).decode(), "enc": "base64"})
    (text_code,) = await c.pub("bytes", {"data": "héllo"})
    sub = await c.sub("bytes")
    binary, text = await c.msgs(sub, 2)
    assert binary["code"] == code and binary["enc"] == "base64"
    assert base64.b64decode(binary["data"]) == raw
    assert text["code"] == text_code and text["data"] == "héllo" and "enc" not in text
    async with session.get(f"{node.url}/v1/messages/{code}", headers=auth) as resp:
        body = await resp.json()
    assert body["enc"] == "base64" and base64.b64decode(body["data"]) == raw


async def test_prefetch_is_capped_at_max_prefetch(make_node: Any, connect: Connect) -> None:
    node = await make_node("mq.max_prefetch=50", "mq.prefetch=10")
    c = await connect(node)
    rid = await c.send("sub", topic="capped", prefetch=1_000_000)
    subok = await c.expect(lambda f: f.get("id") == rid)
    assert subok["op"] == "subok" and subok["prefetch"] == 50
    answer = await c.request("credit", sub=subok["sub"], prefetch=999)
    assert answer["prefetch"] == 50
    await c.pub("capped", *[str(i) for i in range(60)])
    assert len(await c.msgs(subok["sub"], 50)) == 50
    await c.nothing_more(subok["sub"])
