"""The consumer over real sockets on 127.0.0.1.

A *stand-in* node (a tiny aiohttp app that answers ``/cluster/nodes`` with itself as the one
master, and whose ``/v1/ws`` misbehaves in one way per test) shows that failures do not
pass in silence: a node that closes every WebSocket, one that sends garbage, one that
refuses the subscription, one that stops answering. A real node shows ``process()``,
confirmed acks, the callback style and a close under cancellation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from kapok.client import Consumer, Message, Producer, Status
from kapok.errors import ConnectionLostError, KapokError, NotActiveError, UnknownCodeError
from kapok.testing import ManualClock, eventually
from kapok.testing.slow import scaled

NodeFactory = Callable[..., Awaitable[Any]]
Behaviour = Callable[[web.WebSocketResponse], Awaitable[None]]
StandIn = Callable[[Behaviour], Awaitable[str]]

T = scaled(5.0)  # upper bound of every single wait
NAME = "standin"
FAST: dict[str, Any] = {"connect_timeout_s": 1.0, "backoff_base_s": 0.01, "backoff_cap_s": 0.1}


@pytest.fixture
async def stand_in(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> AsyncIterator[StandIn]:
    """``await stand_in(behaviour)``: the URL of a node whose ``/v1/ws`` runs ``behaviour``
    on each accepted WebSocket (whatever it leaves open is closed after the test)."""
    release = asyncio.Event()

    async def make(behaviour: Behaviour) -> str:
        async def nodes(request: web.Request) -> web.Response:
            row = {"name": NAME, "http_url": f"http://{request.host}", "state": "alive", "role": "master",
                   "active": True, "pair": None, "epoch": 0, "load": 0.0}  # fmt: skip
            return web.json_response([row])

        async def ws(request: web.Request) -> web.WebSocketResponse:
            sock = web.WebSocketResponse()
            await sock.prepare(request)
            await behaviour(sock)
            if not sock.closed:
                await release.wait()
            return sock

        app = web.Application()
        app.router.add_get("/cluster/nodes", nodes)
        app.router.add_get("/v1/ws", ws)
        server = await aiohttp_server(app, host="127.0.0.1", port=0)
        return str(server.make_url("")).rstrip("/")

    yield make
    release.set()


async def closes_at_once(ws: web.WebSocketResponse) -> None:
    await ws.close()


async def sends_garbage(ws: web.WebSocketResponse) -> None:
    await ws.send_str("not json")


async def answers_nonsense(ws: web.WebSocketResponse) -> None:
    sub = await read_sub(ws)
    await ws.send_bytes(orjson.dumps({"op": "ok", "id": sub["id"]}))  # an ok where a subok is due


async def read_sub(ws: web.WebSocketResponse) -> dict[str, Any]:
    msg = await ws.receive()
    assert msg.type is WSMsgType.BINARY or msg.type is WSMsgType.TEXT, msg
    frame: dict[str, Any] = orjson.loads(msg.data)
    assert frame["op"] == "sub"
    return frame


async def subok(ws: web.WebSocketResponse) -> None:
    sub = await read_sub(ws)
    ok = {"op": "subok", "id": sub["id"], "sub": 1, "group": "g", "prefetch": 10}
    await ws.send_bytes(orjson.dumps(ok))


async def refuses(ws: web.WebSocketResponse) -> None:
    sub = await read_sub(ws)
    error = {"op": "error", "id": sub["id"], "code": "not_active", "message": "a passive slave; use m1"}
    await ws.send_bytes(orjson.dumps(error))


def about_the_node(errors: list[KapokError], *words: str) -> None:
    assert errors, "on_error was never called"
    for exc in errors:
        text = str(exc)
        assert NAME in text, text
        assert any(w in text for w in words), text


# ---------------------------------------------------------------- failures are reported


@pytest.mark.parametrize(
    ("behaviour", "words"),
    [
        (closes_at_once, ("closed",)),
        (sends_garbage, ("malformed", "JSON")),
        (answers_nonsense, ("no subscription id",)),
    ],
    ids=["closes-every-websocket", "sends-garbage", "answers-nonsense"],
)
async def test_start_fails_and_each_attempt_is_reported_when_no_feed_can_subscribe(
    stand_in: StandIn, behaviour: Behaviour, words: tuple[str, ...]
) -> None:
    url = await stand_in(behaviour)
    errors: list[KapokError] = []
    consumer = Consumer(url, topic="t", on_error=errors.append, **FAST)
    began = time.monotonic()
    with pytest.raises(ConnectionLostError, match=NAME):
        await consumer.start()
    assert time.monotonic() - began < FAST["connect_timeout_s"] + scaled(2.0)
    assert consumer.status is Status.CLOSED  # what start() opened is closed again
    about_the_node(errors, *words)
    assert all(isinstance(e, ConnectionLostError) for e in errors)
    assert len(errors) == consumer.stats.node(NAME).failures  # one report per attempt, not a flood


async def test_a_refused_subscription_is_reported_with_the_nodes_error(stand_in: StandIn) -> None:
    url = await stand_in(refuses)
    errors: list[KapokError] = []
    with pytest.raises(ConnectionLostError):
        await Consumer(url, topic="t", on_error=errors.append, **FAST).start()
    about_the_node(errors, "refused the subscription")
    assert isinstance(errors[0], NotActiveError) and "passive slave" in str(errors[0])


class FirstSubscribesThenAllClose:
    """A stand-in node's ``/v1/ws``: the first connection subscribes, then every one closes."""

    def __init__(self) -> None:
        self.connections = 0

    async def __call__(self, ws: web.WebSocketResponse) -> None:
        self.connections += 1
        if self.connections == 1:
            await subok(ws)
        await ws.close()


async def test_get_raises_once_every_feed_keeps_failing_and_no_on_error_is_set(stand_in: StandIn) -> None:
    node = FirstSubscribesThenAllClose()
    url = await stand_in(node)
    async with Consumer(url, topic="t", **FAST) as consumer:
        with pytest.raises(ConnectionLostError, match=NAME):
            await consumer.get(T)
        assert node.connections >= 2


async def test_with_on_error_set_get_keeps_waiting_while_the_errors_are_reported(stand_in: StandIn) -> None:
    url = await stand_in(FirstSubscribesThenAllClose())
    errors: list[KapokError] = []
    async with Consumer(url, topic="t", on_error=errors.append, **FAST) as consumer:
        await eventually(lambda: len(errors) >= 3, what="three failed attempts reported")
        with pytest.raises(TimeoutError):
            await consumer.get(0.2)
    about_the_node(errors, "closed")


# ---------------------------------------------------------------- close


async def test_cancelling_a_get_inside_async_with_ends_at_once_even_if_the_node_stops_answering(
    stand_in: StandIn,
) -> None:
    url = await stand_in(subok)  # subscribes, then never reads again: our close frame goes unanswered
    got_in = asyncio.Event()

    async def consume() -> None:
        async with Consumer(url, topic="t", **FAST) as consumer:
            got_in.set()
            await consumer.get()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_in.wait(), T)  # consume() went on into get() before this returns
    began = time.monotonic()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=scaled(1.0))
    assert task in done and task.cancelled(), f"still closing after {time.monotonic() - began:.2f} s"


async def test_cancelling_a_get_inside_async_with_ends_at_once_on_a_real_node(make_node: NodeFactory) -> None:
    node = await make_node()
    got_in = asyncio.Event()

    async def consume() -> None:
        async with Consumer(node.url, topic="t") as consumer:
            got_in.set()
            await consumer.get()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_in.wait(), T)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=scaled(1.0))
    assert task in done and task.cancelled()


# ---------------------------------------------------------------- settling, against a real node


async def test_process_acks_on_success_and_requeues_on_an_exception(make_node: NodeFactory) -> None:
    node = await make_node()
    async with Producer(node.url, topic="p") as producer, Consumer(node.url, topic="p") as consumer:
        await producer.publish("fails once")
        msg = await consumer.get(T)
        with pytest.raises(ValueError, match="boom"):
            async with msg.process(requeue=True):
                raise ValueError("boom")
        again = await consumer.get(T)
        assert again.code == msg.code and again.redelivered and again.attempts == 2
        async with again.process():
            pass
    await eventually(lambda: node.broker.topic("p").live_count == 0, what="the ack to arrive")


async def test_confirmed_acks_wait_for_the_node_and_raise_its_error(make_node: NodeFactory) -> None:
    clock = ManualClock()
    node = await make_node("mq.ack_timeout_s=5", "mq.max_deliveries=1", clock=clock)
    async with Producer(node.url, topic="w") as producer, Consumer(node.url, topic="w") as consumer:
        await producer.publish("one")
        await producer.publish("two")
        await producer.publish("three")
        first = await consumer.get(T)
        await first.touch(wait=True)
        await first.ack(wait=True)  # returns once the node has acked it
        assert node.broker.topic("w").live_count == 2
        second = await consumer.get(T)
        await second.nack(requeue=False, wait=True)  # dead-lettered at once
        third = await consumer.get(T)
        clock.advance(5.1)  # its ack deadline passes: the node dead-letters it (max_deliveries=1)
        await eventually(lambda: node.broker.topic("w").live_count == 0, what="the third to be dead-lettered")
        with pytest.raises(UnknownCodeError) as caught:
            await third.ack(wait=True)  # the node no longer holds it
        assert caught.value.codes == [third.code]
        assert consumer.stats.acked == 1 and consumer.stats.server_errors == 0  # raised, not reported


async def test_confirmed_acks_over_the_kapokmq_protocol_wait_for_the_write(make_node: NodeFactory) -> None:
    node = await make_node()
    opts: dict[str, Any] = {"protocol": "kapokmq", "topic": "legacy"}
    async with Producer(node.url, **opts) as producer, Consumer(node.url, **opts) as consumer:
        await producer.publish("hello")
        msg = await consumer.get(T)
        await msg.ack(wait=True)
    await eventually(lambda: node.broker.topic("legacy").live_count == 0, what="the ack to arrive")


async def test_a_callback_gets_every_message_in_order_and_a_failure_is_requeued(
    make_node: NodeFactory,
) -> None:
    node = await make_node()
    seen: list[str] = []
    errors: list[KapokError] = []
    failed_once = False

    async def handle(message: Message) -> None:
        nonlocal failed_once
        if message.text == "m3" and not failed_once:
            failed_once = True
            raise RuntimeError("not now")
        seen.append(message.text)

    async with (
        Producer(node.url, topic="cb") as producer,
        Consumer(node.url, topic="cb", on_error=errors.append) as consumer,
    ):
        await consumer.subscribe(handle)
        for i in range(6):
            await producer.publish(f"m{i}")
        await eventually(lambda: len(seen) == 6, what="every message handled")
        with pytest.raises(KapokError, match="callback"):
            await consumer.get(0.1)
    assert sorted(seen) == [f"m{i}" for i in range(6)] and seen[:3] == ["m0", "m1", "m2"]
    assert len(errors) == 1 and "not now" in str(errors[0])
    await eventually(lambda: node.broker.topic("cb").live_count == 0, what="every ack to arrive")
