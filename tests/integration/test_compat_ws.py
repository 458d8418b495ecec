"""KapokMQ-compatible WebSocket routes over real sockets, with a raw aiohttp client.

Covers the in-band handshake (exact strings, limits, timeout), the producer
route (raw ``ok``, Go-style case-insensitive keys, pipelining) and the consumer
route (PascalCase pushes, raw-code acks, p2p and pub/sub, redelivery, delays),
including the KapokMQ bugs Kapok fixes (reference §10 items 14, 15, 16).

Ack deadlines and delays are driven by a ``ManualClock``. That nothing (more) was
sent is proven by a marker, never by waiting: a socket's frames leave in the order
they were queued, so the marker's answer being the next frame shows nothing came
before it.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType

from kapok.testing import ManualClock, eventually
from kapok.testing.nodehttp import scrape_metric
from kapok.testing.slow import scaled

SECRET = "test"
ASK_KEY = "Please enter the secret key"
KEY_OK = "Secret key matching succeeded"
KEY_ERROR = "Secret key matching error"
POLICY_VIOLATION = 1008
T = scaled(5.0)  # upper bound of every single wait
CODE_RE = re.compile(r"[0-9a-f]{32}")
PUSH_KEYS = {"MessageCode", "MessageData", "Topic", "CreateTime", "ConsumedTime", "DelayTime", "Status"}


# ---------------------------------------------------------------- helpers


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def recv_text(ws: aiohttp.ClientWebSocketResponse, timeout: float = T) -> str:
    msg = await ws.receive(timeout=timeout)
    assert msg.type is WSMsgType.TEXT, f"expected a TEXT frame, got {msg.type!r} {msg.data!r}"
    assert isinstance(msg.data, str)
    return msg.data


async def recv_push(ws: aiohttp.ClientWebSocketResponse, timeout: float = T) -> dict[str, Any]:
    push = json.loads(await recv_text(ws, timeout))
    assert isinstance(push, dict)
    return push


async def expect_closed(ws: aiohttp.ClientWebSocketResponse, code: int, timeout: float = T) -> None:
    msg = await ws.receive(timeout=timeout)
    assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED), (msg.type, msg.data)
    assert ws.close_code == code


async def handshake(ws: aiohttp.ClientWebSocketResponse, key: str = SECRET) -> None:
    assert await recv_text(ws) == ASK_KEY
    await ws.send_str(key)
    assert await recv_text(ws) == KEY_OK


@asynccontextmanager
async def producer(
    session: aiohttp.ClientSession, node: Any, topic: str, pid: str = "p1"
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/{topic}/{pid}") as ws:
        await handshake(ws)
        yield ws


@asynccontextmanager
async def consumer(
    session: aiohttp.ClientSession, node: Any, topic: str, cid: str = "c1"
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    async with session.ws_connect(f"{node.ws_url}/Consumers/Conn/{topic}/{cid}") as ws:
        await handshake(ws)
        yield ws


async def publish(ws: aiohttp.ClientWebSocketResponse, data: str, delay: int = 0) -> None:
    await ws.send_str(json.dumps({"MessageData": data, "DelayTime": delay}))
    assert await recv_text(ws) == "ok"


async def no_more_replies(ws: aiohttp.ClientWebSocketResponse) -> None:
    """The producer socket ``ws`` has no reply left to send: the answer to a marker (a
    binary frame, whose answer no other frame gets) is the next frame."""
    await ws.send_bytes(b"marker")
    reply = json.loads(await recv_text(ws))
    assert reply["code"] == -1 and "must be text" in reply["msg"], f"unexpected frame: {reply}"


async def nothing_more_pushed(
    session: aiohttp.ClientSession, node: Any, topic: str, *consumers: aiohttp.ClientWebSocketResponse
) -> None:
    """Nothing was sent to ``consumers`` since their last frame read (no push, no answer to
    an ack): a marker published to ``topic`` now is the next frame each of them gets.

    Each must be able to take it: a pub/sub subscriber, or the only consumer of a p2p topic.
    """
    async with producer(session, node, topic, "marker") as prod:
        await publish(prod, "marker")
    for ws in consumers:
        push = await recv_push(ws)
        assert push["MessageData"] == "marker", f"unexpected frame before the marker: {push}"
        await ws.send_str(push["MessageCode"])


def held(node: Any, consumer_id: str) -> int:
    """How many messages the consumer named ``consumer_id`` holds unacked (broker state)."""
    (consumer,) = [c for c in node.broker.consumers.values() if c.name == consumer_id]
    return len(consumer.held)


async def console(session: aiohttp.ClientSession, node: Any, path: str, **form: str) -> Any:
    async with session.post(f"{node.url}/Console/{path}", data=form, headers={"secretKey": SECRET}) as resp:
        assert resp.status == 200
        return await resp.json(content_type=None)


async def messages(session: aiohttp.ClientSession, node: Any, topic: str) -> list[dict[str, Any]]:
    body = await console(session, node, "GetMessageList", status="3", topic=topic)
    assert body["code"] == 0
    return list(body["data"] or [])


async def get_message(session: aiohttp.ClientSession, node: Any, code: str) -> dict[str, Any]:
    body = await console(session, node, "GetMessage", messageCode=code)
    assert body["code"] == 0, body
    return dict(body["data"])


async def count(session: aiohttp.ClientSession, node: Any) -> dict[str, int]:
    body = await console(session, node, "CountMessage")
    assert body["code"] == 0
    return dict(body["data"])


async def metric(session: aiohttp.ClientSession, node: Any, name: str) -> float:
    return await scrape_metric(session, node.url, name)


async def wait_consumers(session: aiohttp.ClientSession, node: Any, n: int) -> None:
    async def ready() -> bool:
        body = await console(session, node, "GetClients")
        return len(body["consumers"] or []) == n

    await eventually(ready, what=f"{n} consumers registered")


# ---------------------------------------------------------------- handshake


@pytest.mark.parametrize("route", ["Producers", "Consumers"])
async def test_handshake_exact_strings_and_text_frames(
    node: Any, session: aiohttp.ClientSession, route: str
) -> None:
    async with session.ws_connect(f"{node.ws_url}/{route}/Conn/jobs/x1") as ws:
        first = await ws.receive(timeout=T)
        assert first.type is WSMsgType.TEXT and first.data == ASK_KEY
        await ws.send_str("wrong")
        err = await ws.receive(timeout=T)
        assert err.type is WSMsgType.TEXT and err.data == KEY_ERROR
        again = await ws.receive(timeout=T)
        assert again.type is WSMsgType.TEXT and again.data == ASK_KEY
        await ws.send_str(SECRET)
        ok = await ws.receive(timeout=T)
        assert ok.type is WSMsgType.TEXT and ok.data == KEY_OK
        assert not ws.closed


@pytest.mark.parametrize("route", ["Producers", "Consumers"])
async def test_handshake_closes_after_max_attempts(
    make_node: Any, session: aiohttp.ClientSession, route: str
) -> None:
    node = await make_node("server.auth_max_attempts=2")
    async with session.ws_connect(f"{node.ws_url}/{route}/Conn/jobs/x1") as ws:
        assert await recv_text(ws) == ASK_KEY
        await ws.send_str("wrong-1")
        assert await recv_text(ws) == KEY_ERROR
        assert await recv_text(ws) == ASK_KEY
        await ws.send_str("wrong-2")
        assert await recv_text(ws) == KEY_ERROR
        await expect_closed(ws, POLICY_VIOLATION)
    # the right key on a fresh connection still works
    async with session.ws_connect(f"{node.ws_url}/{route}/Conn/jobs/x2") as ws:
        await handshake(ws)


@pytest.mark.parametrize("route", ["Producers", "Consumers"])
async def test_handshake_times_out(make_node: Any, session: aiohttp.ClientSession, route: str) -> None:
    node = await make_node("server.auth_timeout_s=0.5")
    async with session.ws_connect(f"{node.ws_url}/{route}/Conn/jobs/x1") as ws:
        started = time.monotonic()
        assert await recv_text(ws) == ASK_KEY
        await expect_closed(ws, POLICY_VIOLATION, timeout=T)
        assert time.monotonic() - started >= 0.4


@pytest.mark.parametrize("route", ["Producers", "Consumers"])
async def test_binary_key_counts_as_wrong_key(
    make_node: Any, session: aiohttp.ClientSession, route: str
) -> None:
    node = await make_node("server.auth_max_attempts=2")
    async with session.ws_connect(f"{node.ws_url}/{route}/Conn/jobs/x1") as ws:
        assert await recv_text(ws) == ASK_KEY
        await ws.send_bytes(SECRET.encode())  # even the right key, as binary, is refused
        assert await recv_text(ws) == KEY_ERROR
        assert await recv_text(ws) == ASK_KEY
        await ws.send_bytes(b"\x00\xff")
        assert await recv_text(ws) == KEY_ERROR
        await expect_closed(ws, POLICY_VIOLATION)


async def test_producer_frame_before_auth_is_not_stored(node: Any, session: aiohttp.ClientSession) -> None:
    frame = json.dumps({"MessageData": "sneaky", "DelayTime": 0})
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/jobs/p1") as ws:
        assert await recv_text(ws) == ASK_KEY
        await ws.send_str(frame)
        assert await recv_text(ws) == KEY_ERROR
        assert await recv_text(ws) == ASK_KEY
        assert (await count(session, node))["all"] == 0
        # after auth the same frame is accepted: exactly one message, never the pre-auth one
        await ws.send_str(SECRET)
        assert await recv_text(ws) == KEY_OK
        await publish(ws, "fine")
    stored = await messages(session, node, "jobs")
    assert len(stored) == 1
    assert (await get_message(session, node, stored[0]["MessageCode"]))["MessageData"] == "fine"


async def test_consumer_gets_nothing_before_auth(node: Any, session: aiohttp.ClientSession) -> None:
    async with producer(session, node, "jobs") as prod:
        await publish(prod, "waiting")
    async with session.ws_connect(f"{node.ws_url}/Consumers/Conn/jobs/c1") as ws:
        assert await recv_text(ws) == ASK_KEY
        await ws.send_str("wrong")
        # the very next frames are the handshake's, not the waiting message
        assert await recv_text(ws) == KEY_ERROR
        assert await recv_text(ws) == ASK_KEY
        assert (await console(session, node, "GetClients"))["consumers"] in (None, [])
        await ws.send_str(SECRET)
        assert await recv_text(ws) == KEY_OK
        assert (await recv_push(ws))["MessageData"] == "waiting"


# ---------------------------------------------------------------- producer route


async def test_producer_ok_is_raw_two_bytes_and_message_stored(
    node: Any, session: aiohttp.ClientSession
) -> None:
    async with producer(session, node, "jobs") as ws:
        await ws.send_str('{"MessageData": "hello", "DelayTime": 0}')
        reply = await ws.receive(timeout=T)
        assert reply.type is WSMsgType.TEXT
        assert reply.data == "ok" and len(reply.data.encode()) == 2
    assert await count(session, node) == {"all": 1, "consumed": 0, "delay": 0, "unconsumed": 1}
    (row,) = await messages(session, node, "jobs")
    full = await get_message(session, node, row["MessageCode"])
    assert full["MessageData"] == "hello"
    assert full["Topic"] == "jobs"
    assert full["Status"] == -1
    assert full["DelayTime"] == 0
    assert CODE_RE.fullmatch(full["MessageCode"])


@pytest.mark.parametrize(
    "frame",
    [
        '{"messageData": "ci", "delaytime": 0}',
        '{"MESSAGEDATA": "ci", "DELAYTIME": 0}',
        '{"messagedata": "ci"}',
        '{"MessageData": "ci", "DelayTime": 0, "Topic": "elsewhere", "extra": [1, {"a": null}]}',
    ],
)
async def test_producer_keys_case_insensitive_unknown_ignored(
    node: Any, session: aiohttp.ClientSession, frame: str
) -> None:
    async with producer(session, node, "jobs") as ws:
        await ws.send_str(frame)
        assert await recv_text(ws) == "ok"
    (row,) = await messages(session, node, "jobs")
    full = await get_message(session, node, row["MessageCode"])
    assert full["MessageData"] == "ci" and full["Topic"] == "jobs" and full["DelayTime"] == 0
    assert await messages(session, node, "elsewhere") == []


async def test_producer_delay_key_case_insensitive(node: Any, session: aiohttp.ClientSession) -> None:
    async with producer(session, node, "jobs") as ws:
        await ws.send_str('{"messageData": "later", "delaytime": 30}')
        assert await recv_text(ws) == "ok"
    (row,) = await messages(session, node, "jobs")
    assert row["DelayTime"] == 30 and row["Status"] == 0


async def test_producer_empty_message_data_accepted(node: Any, session: aiohttp.ClientSession) -> None:
    async with producer(session, node, "jobs") as ws:
        await publish(ws, "")
    (row,) = await messages(session, node, "jobs")
    assert (await get_message(session, node, row["MessageCode"]))["MessageData"] == ""


async def test_producer_pipelined_frames_one_reply_each_in_order(
    node: Any, session: aiohttp.ClientSession
) -> None:
    frames = [json.dumps({"MessageData": f"m{i}", "DelayTime": 0}) for i in range(30)]
    frames.insert(10, "{not json")
    frames.insert(20, '{"MessageData": 5}')
    async with producer(session, node, "jobs") as ws:
        for frame in frames:
            await ws.send_str(frame)
        replies = [await recv_text(ws) for _ in frames]
        await no_more_replies(ws)
    for i, reply in enumerate(replies):
        if i in (10, 20):
            body = json.loads(reply)
            assert body["code"] == -1 and isinstance(body["msg"], str) and body["msg"]
        else:
            assert reply == "ok", (i, reply)
    stored = await messages(session, node, "jobs")
    assert len(stored) == 30
    datas = [(await get_message(session, node, r["MessageCode"]))["MessageData"] for r in reversed(stored)]
    assert datas == [f"m{i}" for i in range(30)]


@pytest.mark.parametrize(
    ("setting", "words"),
    [("mq.max_length=5", ("full",)), ("mq.producer_rate=0.001", ("rate",))],
)
async def test_pipelined_frames_over_a_limit_answered_one_by_one(
    make_node: Any, session: aiohttp.ClientSession, setting: str, words: tuple[str, ...]
) -> None:
    # Frames that arrive together are published as one batch, and the broker refuses
    # a batch as a whole; each frame must still get the answer it would have had alone.
    node = await make_node(setting, "mq.producer_burst=5")
    frames = [json.dumps({"MessageData": f"m{i}", "DelayTime": 0}) for i in range(8)]
    async with producer(session, node, "small") as ws:
        for frame in frames:
            await ws.send_str(frame)
        replies = [await recv_text(ws) for _ in frames]
        await no_more_replies(ws)
    assert replies[:5] == ["ok"] * 5
    for reply in replies[5:]:
        body = json.loads(reply)
        assert body["code"] == -1 and any(w in body["msg"].lower() for w in words), body
    stored = await messages(session, node, "small")
    datas = [(await get_message(session, node, r["MessageCode"]))["MessageData"] for r in reversed(stored)]
    assert datas == [f"m{i}" for i in range(5)]


async def test_acks_sent_together_settle_together_and_unknown_ones_are_counted(
    node: Any, session: aiohttp.ClientSession
) -> None:
    async with producer(session, node, "jobs") as prod:
        for i in range(20):
            await publish(prod, f"m{i}")
    async with consumer(session, node, "jobs") as cons:
        codes = [(await recv_push(cons))["MessageCode"] for _ in range(20)]
        for code in [*codes[:10], "no-such-code", *codes[10:]]:
            await cons.send_str(code)

        async def all_acked() -> bool:
            return (await count(session, node))["consumed"] == 20

        await eventually(all_acked, what="the 20 acks applied")
        assert await metric(session, node, 'kapok_bad_input_total{kind="compat_unknown_ack"}') == 1


async def test_producer_listed_in_get_clients_while_connected(
    node: Any, session: aiohttp.ClientSession
) -> None:
    async with producer(session, node, "jobs", "prod-7"):
        body = await console(session, node, "GetClients")
        (prod,) = body["producers"]
        assert set(prod) == {"ProducerId", "Topic", "ProducerIp", "JoinTime"}
        assert prod["ProducerId"] == "prod-7" and prod["Topic"] == "jobs"
        assert prod["ProducerIp"] == "127.0.0.1"

    async def gone() -> bool:
        return not (await console(session, node, "GetClients"))["producers"]

    await eventually(gone, what="producer unregistered")


# ---------------------------------------------------------------- consumer route


async def test_consumer_push_shape_and_ack(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    node = await make_node(clock=clock)
    async with consumer(session, node, "jobs") as cons, producer(session, node, "jobs") as prod:
        await publish(prod, '{"order": 1}')
        raw = await cons.receive(timeout=T)
        assert raw.type is WSMsgType.TEXT
        push = json.loads(raw.data)
        assert set(push) == PUSH_KEYS
        assert CODE_RE.fullmatch(push["MessageCode"])
        assert push["MessageData"] == '{"order": 1}'
        assert push["Topic"] == "jobs"
        assert type(push["CreateTime"]) is int and push["CreateTime"] == int(clock.now)
        assert push["ConsumedTime"] == 0 and type(push["ConsumedTime"]) is int
        assert push["DelayTime"] == 0 and type(push["DelayTime"]) is int
        assert push["Status"] == -1
        code = push["MessageCode"]
        assert (await get_message(session, node, code))["Status"] == -1

        await cons.send_str(code)  # the ack is the raw code, no JSON

        async def consumed() -> bool:
            return bool((await get_message(session, node, code))["Status"] == 1)

        await eventually(consumed, what="message consumed after ack")
        full = await get_message(session, node, code)
        assert full["ConsumedTime"] > 0 and full["ConsumedTime"] >= full["CreateTime"]
        assert await count(session, node) == {"all": 1, "consumed": 1, "delay": 0, "unconsumed": 0}
        clock.advance(node.service.config.mq.ack_timeout_s + 1)  # past the ack deadline it had
        await nothing_more_pushed(session, node, "jobs", cons)  # no reply to an ack, no redelivery


async def test_consumer_listed_in_get_clients(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    node = await make_node(clock=clock)
    async with consumer(session, node, "jobs", "cons-9"):
        await wait_consumers(session, node, 1)
        (row,) = (await console(session, node, "GetClients"))["consumers"]
        assert set(row) == {"ConsumerId", "Topic", "ConsumerIp", "JoinTime"}
        assert row["ConsumerId"] == "cons-9" and row["Topic"] == "jobs"
        assert row["ConsumerIp"] == "127.0.0.1"
        assert type(row["JoinTime"]) is int and row["JoinTime"] == int(clock.now)
    await wait_consumers(session, node, 0)


async def test_messages_published_before_consumer_are_delivered(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """KapokMQ bug 14: messages with no online consumer waited for the 300 s retry timer.

    The node's clock never moves here: the delivery owes nothing to a timer."""
    node = await make_node(clock=clock)
    async with producer(session, node, "jobs") as prod:
        for i in range(3):
            await publish(prod, f"early-{i}")
    async with consumer(session, node, "jobs") as cons:
        got = [await recv_push(cons) for _ in range(3)]
        assert [p["MessageData"] for p in got] == ["early-0", "early-1", "early-2"]
        for p in got:
            await cons.send_str(p["MessageCode"])

        async def all_consumed() -> bool:
            return (await count(session, node))["consumed"] == 3

        await eventually(all_consumed, what="all three consumed")


async def test_disconnect_redelivers_at_once_to_another_consumer(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """KapokMQ bug 14: unacked messages of a dropped consumer waited for the retry timer.

    The node's clock never moves here: the redelivery owes nothing to a timer."""
    node = await make_node(clock=clock)
    async with producer(session, node, "jobs") as prod, consumer(session, node, "jobs", "a") as first:
        await publish(prod, "one")
        await publish(prod, "two")
        pushed = [await recv_push(first) for _ in range(2)]
        async with consumer(session, node, "jobs", "b") as second:
            await wait_consumers(session, node, 2)
            assert (held(node, "a"), held(node, "b")) == (2, 0)  # everything is held by the first
            await first.close()
            again = [await recv_push(second) for _ in range(2)]
            assert [p["MessageCode"] for p in again] == [p["MessageCode"] for p in pushed]
            assert [p["MessageData"] for p in again] == ["one", "two"]
            assert all(p["Status"] == -1 and p["DelayTime"] == 0 for p in again)


async def test_ack_timeout_redelivers(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    node = await make_node("mq.ack_timeout_s=5", clock=clock)
    async with consumer(session, node, "jobs") as cons, producer(session, node, "jobs") as prod:
        await publish(prod, "slow")
        first = await recv_push(cons)
        clock.advance(5.1)
        second = await recv_push(cons)  # no ack: it comes back
        assert second["MessageCode"] == first["MessageCode"]
        assert second["MessageData"] == "slow"
        assert second["DelayTime"] == 0  # KapokMQ bug 16: retries rewrote DelayTime
        await cons.send_str(second["MessageCode"])

        async def consumed() -> bool:
            return bool((await get_message(session, node, first["MessageCode"]))["Status"] == 1)

        await eventually(consumed, what="consumed after ack of the redelivery")
        full = await get_message(session, node, first["MessageCode"])
        assert full["DelayTime"] == 0
        clock.advance(10.1)  # past every deadline it had
        await nothing_more_pushed(session, node, "jobs", cons)  # acked: no more redeliveries


async def test_p2p_each_message_to_exactly_one_consumer(node: Any, session: aiohttp.ClientSession) -> None:
    n = 20
    async with (
        consumer(session, node, "jobs", "a") as a,
        consumer(session, node, "jobs", "b") as b,
        producer(session, node, "jobs") as prod,
    ):
        await wait_consumers(session, node, 2)
        for i in range(n):
            await publish(prod, f"m{i}")
        seen: dict[str, list[str]] = {"a": [], "b": []}

        async def all_pushed() -> bool:
            for name, ws in (("a", a), ("b", b)):
                with contextlib.suppress(TimeoutError):
                    push = await recv_push(ws, timeout=0.01)
                    seen[name].append(push["MessageData"])
                    await ws.send_str(push["MessageCode"])
            return len(seen["a"]) + len(seen["b"]) >= n

        await eventually(all_pushed, what=f"all {n} messages pushed")

        async def all_consumed() -> bool:
            return (await count(session, node))["consumed"] == n

        await eventually(all_consumed, what=f"all {n} acks applied")
        assert (held(node, "a"), held(node, "b")) == (0, 0)  # nothing else is out
    assert seen["a"] and seen["b"], seen  # both got work
    assert not set(seen["a"]) & set(seen["b"])
    assert sorted(seen["a"] + seen["b"]) == sorted(f"m{i}" for i in range(n))


async def test_pubsub_every_consumer_gets_every_message_and_acks_separately(
    make_node: Any, session: aiohttp.ClientSession
) -> None:
    """KapokMQ bug 15: one subscriber's ack completed the message for every subscriber."""
    node = await make_node("mq.push_type=2")
    async with (
        consumer(session, node, "news", "a") as a,
        consumer(session, node, "news", "b") as b,
        producer(session, node, "news") as prod,
    ):
        await wait_consumers(session, node, 2)
        await publish(prod, "headline")
        push_a, push_b = await recv_push(a), await recv_push(b)
        assert push_a == push_b
        assert push_a["MessageData"] == "headline" and push_a["Status"] == -1
        code = push_a["MessageCode"]

        acked = await metric(session, node, "kapok_messages_acked_total")
        await a.send_str(code)

        async def a_acked() -> bool:
            return await metric(session, node, "kapok_messages_acked_total") == acked + 1

        await eventually(a_acked, what="first subscriber's ack processed")
        full = await get_message(session, node, code)
        assert full["Status"] == -1 and full["ConsumedTime"] == 0
        assert (held(node, "a"), held(node, "b")) == (0, 1)

        await b.send_str(code)

        async def consumed() -> bool:
            return bool((await get_message(session, node, code))["Status"] == 1)

        await eventually(consumed, what="consumed once both subscribers acked")
        assert (await get_message(session, node, code))["ConsumedTime"] > 0
        await nothing_more_pushed(session, node, "news", a, b)  # no answer to either ack


async def test_pubsub_unacked_subscriber_still_redelivered(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    node = await make_node("mq.push_type=2", "mq.ack_timeout_s=5", clock=clock)
    async with (
        consumer(session, node, "news", "a") as a,
        consumer(session, node, "news", "b") as b,
        producer(session, node, "news") as prod,
    ):
        await wait_consumers(session, node, 2)
        await publish(prod, "x")
        code = (await recv_push(a))["MessageCode"]
        assert (await recv_push(b))["MessageCode"] == code
        await a.send_str(code)
        await eventually(lambda: held(node, "a") == 0, what="a's ack applied")
        clock.advance(5.1)
        again = await recv_push(b)  # b never acked: b gets it again
        assert again["MessageCode"] == code
        await b.send_str(code)
        await nothing_more_pushed(session, node, "news", a, b)  # a acked: a does not


async def test_delayed_message_pushed_after_delay(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    node = await make_node(clock=clock)
    async with consumer(session, node, "jobs") as cons, producer(session, node, "jobs") as prod:
        await publish(prod, "later", delay=1)
        (row,) = await messages(session, node, "jobs")
        assert row["Status"] == 0 and row["DelayTime"] == 1
        assert (await count(session, node))["delay"] == 1
        clock.advance(0.99)
        await nothing_more_pushed(session, node, "jobs", cons)  # not before its time
        clock.advance(0.02)
        push = await recv_push(cons)
        assert push["MessageData"] == "later"
        assert push["DelayTime"] == 1 and push["Status"] == -1
        assert (await get_message(session, node, push["MessageCode"]))["Status"] == -1


async def test_negative_delay_time_is_delivered_at_once_and_kept(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """KapokMQ stores a negative DelayTime as given and treats it as "now" (the node's clock
    never moves here: the delivery owes nothing to a timer)."""
    node = await make_node(clock=clock)
    async with consumer(session, node, "jobs") as cons, producer(session, node, "jobs") as prod:
        await publish(prod, "past", delay=-5)
        push = await recv_push(cons)
        assert push["MessageData"] == "past" and push["DelayTime"] == -5 and push["Status"] == -1
        assert (await get_message(session, node, push["MessageCode"]))["DelayTime"] == -5


async def test_delayed_message_redelivery_keeps_delay_time(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    """KapokMQ bug 16: a retry set DelayTime to now - CreateTime."""
    node = await make_node("mq.ack_timeout_s=5", clock=clock)
    async with consumer(session, node, "jobs") as cons, producer(session, node, "jobs") as prod:
        await publish(prod, "later", delay=1)
        clock.advance(1.1)
        first = await recv_push(cons)
        clock.advance(5.1)
        second = await recv_push(cons)
        clock.advance(5.1)
        third = await recv_push(cons)
        assert first["MessageCode"] == second["MessageCode"] == third["MessageCode"]
        assert first["DelayTime"] == second["DelayTime"] == third["DelayTime"] == 1
        assert first["CreateTime"] == third["CreateTime"]
        await cons.send_str(third["MessageCode"])
        full = await get_message(session, node, first["MessageCode"])
        assert full["DelayTime"] == 1


async def test_deleted_message_is_never_delivered(
    make_node: Any, session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    node = await make_node(clock=clock)
    async with producer(session, node, "jobs") as prod:
        await publish(prod, "doomed-now")
        await publish(prod, "doomed-later", delay=1)
        codes = {r["MessageCode"] for r in await messages(session, node, "jobs")}
        assert len(codes) == 2
        for code in codes:
            assert await console(session, node, "DelMessage", messageCode=code) == {"code": 0}
            assert (await console(session, node, "GetMessage", messageCode=code))["code"] == -1
        assert await count(session, node) == {"all": 0, "consumed": 0, "delay": 0, "unconsumed": 0}
        # a sentinel due after the deleted delayed one: it must be the first push seen
        clock.advance(0.5)
        await publish(prod, "sentinel", delay=1)
        async with consumer(session, node, "jobs") as cons:
            clock.advance(1.1)  # past both
            push = await recv_push(cons)
            assert push["MessageData"] == "sentinel"
            await cons.send_str(push["MessageCode"])
            await nothing_more_pushed(session, node, "jobs", cons)
