"""Per-message results against a real node: a batch the node refuses whole for some of its
messages (a topic with room for part of it, a producer over its token bucket) ends with
each message's own result, not the batch's."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from kapok.client import Consumer, Producer
from kapok.errors import QueueFullError
from kapok.testing.slow import scaled

NodeFactory = Callable[..., Awaitable[Any]]
T = scaled(5.0)


async def test_a_topic_with_room_for_five_of_eight_confirms_five(make_node: NodeFactory) -> None:
    node = await make_node("mq.topics.small.max_length=5")
    async with Producer(node.url, topic="small") as producer:
        futures = [await producer.send(f"m{i}") for i in range(8)]
        await producer.flush()
    outcomes = [f.exception() or f.result() for f in futures]
    assert [type(o) for o in outcomes] == [str] * 5 + [QueueFullError] * 3
    async with Consumer(node.url, topic="small", ack="auto") as consumer:
        got = [(await consumer.get(T)).text for _ in range(5)]
    assert got == [f"m{i}" for i in range(5)]


async def test_a_batch_larger_than_the_rate_limit_burst_is_stored_in_order(make_node: NodeFactory) -> None:
    node = await make_node("mq.producer_rate=200", "mq.producer_burst=20")
    started = time.monotonic()
    async with Producer(node.url, topic="paced", publish_timeout_s=scaled(30.0), name="paced") as producer:
        futures = [await producer.send(f"m{i}") for i in range(100)]  # one batch of 100 > burst 20
        await producer.flush()
    took = time.monotonic() - started
    assert all(f.exception() is None for f in futures)
    assert producer.stats.confirmed == 100
    async with Consumer(node.url, topic="paced", ack="auto") as consumer:
        got = [(await consumer.get(T)).text for _ in range(100)]
    assert got == [f"m{i}" for i in range(100)]
    print(f"100 messages at 200/s with a burst of 20: {took:.2f} s")
