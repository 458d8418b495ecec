"""A ``SessionPool`` gives a producer and a consumer one connection to a node: both work on
it, the consumer's close cancels its subscription there and leaves the producer's traffic
alone, and the last user's close (or the pool's) ends the connection."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kapok.client import Consumer, Producer, SessionPool
from kapok.server.keys import CLIENTS
from kapok.testing import eventually
from kapok.testing.slow import scaled

NodeFactory = Callable[..., Awaitable[Any]]
T = scaled(5.0)


async def test_a_producer_and_a_consumer_share_one_connection(make_node: NodeFactory) -> None:
    node = await make_node()
    clients = node.app[CLIENTS]
    async with SessionPool() as pool:
        producer = await Producer(node.url, topic="shared", pool=pool).start()
        consumer = await Consumer(node.url, topic="shared", pool=pool).start()
        code = await producer.publish("one")
        message = await consumer.get(T)
        await message.ack(wait=True)
        assert message.code == code
        assert len(clients) == 1 and pool.connections == 1
        broker = node.service.broker
        assert len(broker.consumers) == 1
        await consumer.close()
        await eventually(lambda: not broker.consumers, timeout_s=T, what="the subscription cancelled")
        await producer.publish("two")  # the connection outlives the consumer
        assert len(clients) == 1
        await producer.drain()
        await eventually(lambda: len(clients) == 0, timeout_s=T, what="the connection closed")
        assert pool.connections == 0
