"""The client library against a real node (in-process, real sockets on 127.0.0.1, port 0):
both protocols, acks, nacks and touches, key patterns, errors mapped back to their classes,
the blocking wrappers."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kapok.client import Consumer, Producer, Status
from kapok.client.sync import SyncConsumer, SyncProducer
from kapok.errors import AuthError, MessageTooLargeError, QueueFullError, UnsupportedError
from kapok.testing import eventually
from kapok.testing.slow import scaled

NodeFactory = Callable[..., Awaitable[Any]]
T = scaled(5.0)  # upper bound of every single wait


def status_of(producer: Producer) -> Status:
    """``producer.status``, read through a call: after ``assert producer.status is ...``
    mypy would hold it to that value across the awaits that change it."""
    return producer.status


async def test_publish_and_consume_with_manual_acks(make_node: NodeFactory) -> None:
    node = await make_node()
    async with (
        Consumer(node.url, topic="orders", prefetch=50) as consumer,
        Producer(node.url, topic="orders") as producer,
    ):
        assert status_of(producer) is Status.CONNECTING  # no connection until the first batch
        code = await producer.publish("first")
        assert producer.status is Status.CONNECTED and len(code) == 32
        futures = [await producer.send(f"m{i}".encode()) for i in range(499)]
        await producer.flush()
        codes = [code, *(f.result() for f in futures)]
        got: list[str] = []
        while len(got) < 500:
            msg = await consumer.get(T)
            got.append(msg.code)
            await msg.ack()
    assert got == codes  # one node: FIFO
    assert producer.stats.confirmed == producer.stats.sent == 500
    assert producer.stats.node(node.service.node_name).confirmed == 500
    assert consumer.stats.acked == 500 and consumer.status is Status.CLOSED


async def test_nack_requeues_or_dead_letters_and_touch_extends(make_node: NodeFactory) -> None:
    node = await make_node()
    async with Producer(node.url, topic="jobs") as producer, Consumer(node.url, topic="jobs") as consumer:
        await producer.publish("retry me")
        await producer.publish("kill me")
        first = await consumer.get(T)
        await first.touch()
        await first.nack()  # requeue
        second = await consumer.get(T)
        assert second.text == "kill me"
        await second.nack(requeue=False)
        again = await consumer.get(T)
        assert again.code == first.code and again.redelivered and again.attempts == 2
        await again.ack()
        async with Consumer(node.url, topic="jobs.dlq") as dlq:
            dead = await dlq.get(T)
            assert dead.text == "kill me"
            await dead.ack()


async def test_key_patterns_priorities_binary_payloads_and_delays(make_node: NodeFactory) -> None:
    node = await make_node()
    async with (
        Producer(node.url, topic="ev") as producer,
        Consumer(node.url, topic="ev", key="eu.*") as consumer,
    ):
        await producer.publish(b"\x00\xffbinary", key="eu.fr")
        await producer.publish("elsewhere", key="us.ny")
        await producer.publish("later", key="eu.de", delay_s=0.3)
        msg = await consumer.get(T)
        assert (msg.data, msg.key) == (b"\x00\xffbinary", "eu.fr")
        await msg.ack()
        later = await consumer.get(T)
        assert later.text == "later"
        await later.ack()


async def test_broker_errors_come_back_as_their_classes(make_node: NodeFactory) -> None:
    node = await make_node("mq.topics.small.max_length=1")
    async with Producer(node.url, topic="small", max_message_bytes=100) as producer:
        with pytest.raises(MessageTooLargeError):
            await producer.publish("x" * 101)
        await producer.publish("fits")
        with pytest.raises(QueueFullError):
            await producer.publish("no room")
        assert producer.stats.failed == 1


async def test_a_wrong_key_is_an_auth_error(make_node: NodeFactory) -> None:
    node = await make_node()
    async with Producer(node.url, topic="t", secret="wrong") as producer:
        with pytest.raises(AuthError):
            await producer.publish("m")
    with pytest.raises(AuthError):
        await Consumer(node.url, topic="t", secret="wrong").start()


async def test_duplicate_ids_return_the_original_code(make_node: NodeFactory) -> None:
    node = await make_node()
    async with Producer(node.url, topic="t") as producer:
        a = await producer.publish("once", dedup_id="order-1")
        b = await producer.publish("once again", dedup_id="order-1")
    assert a == b and node.broker.stats.duplicates == 1


async def test_kapokmq_protocol_mode(make_node: NodeFactory) -> None:
    node = await make_node()
    opts: dict[str, Any] = {"protocol": "kapokmq", "topic": "legacy"}
    async with Producer(node.url, **opts) as producer, Consumer(node.url, **opts) as consumer:
        assert await producer.publish("hello") == ""  # KapokMQ's ok carries no code
        futures = [await producer.send(f"m{i}") for i in range(50)]
        await producer.flush()
        assert all(f.result() == "" for f in futures)
        with pytest.raises(UnsupportedError):
            await producer.send(b"\xff")  # the protocol carries text only
        got = []
        for _ in range(51):
            msg = await consumer.get(T)
            got.append(msg.text)
            await msg.ack()
        with pytest.raises(UnsupportedError):
            await msg.nack()
    assert got == ["hello", *(f"m{i}" for i in range(50))]
    with pytest.raises(UnsupportedError):
        await Consumer(node.url, protocol="kapokmq", topic="legacy", group="g").start()
    await eventually(lambda: node.broker.topic("legacy").live_count == 0, what="every ack to arrive")


async def test_blocking_wrappers(make_node: NodeFactory) -> None:
    node = await make_node()

    def script() -> list[str]:
        with SyncProducer(node.url, topic="sync") as producer:
            codes = [producer.publish(f"s{i}") for i in range(3)]
            producer.send("s3")
            producer.flush()
            assert producer.stats.confirmed == 4
        with SyncConsumer(node.url, topic="sync") as consumer:
            out = []
            for msg in consumer:
                out.append(msg.text)
                msg.ack()
                if len(out) == 4:
                    break
        assert len(set(codes)) == 3
        return out

    assert await asyncio.to_thread(script) == ["s0", "s1", "s2", "s3"]


async def test_p2c_and_key_modes_work_on_one_node(make_node: NodeFactory) -> None:
    node = await make_node()
    for balance in ("p2c", "key"):
        async with Producer(node.url, topic=f"b-{balance}", balance=balance) as producer:
            futures = [await producer.send(f"m{i}", key=f"k{i % 3}") for i in range(30)]
            await producer.flush()
        assert collections.Counter(len(f.result()) for f in futures) == {32: 30}
