"""Headers travel from ``send(headers=...)`` to the consumer's ``Message.headers``, through
the node; bad headers are refused with a clear error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from kapok.client import Consumer, Producer
from kapok.errors import BadRequestError
from kapok.testing.slow import scaled

NodeFactory = Callable[..., Awaitable[Any]]
T = scaled(5.0)


async def test_headers_reach_the_consumer(make_node: NodeFactory) -> None:
    node = await make_node()
    sent = {"trace-id": "abc123", "content-type": "application/json"}
    async with Producer(node.url, topic="h") as producer, Consumer(node.url, topic="h") as consumer:
        await producer.publish('{"x": 1}', headers=sent)
        await producer.publish("plain")
        first, second = await consumer.get(T), await consumer.get(T)
        await first.ack()
        await second.ack()
    assert first.headers == sent
    assert second.headers == {}


@pytest.mark.parametrize(
    "headers",
    [
        {"": "empty name"},
        {"n": 5},
        {f"h{i}": "v" for i in range(33)},
        {"big": "v" * 5000},
        ["not", "an", "object"],
    ],
)
async def test_bad_headers_are_refused_with_a_clear_error(make_node: NodeFactory, headers: Any) -> None:
    node = await make_node()
    async with aiohttp.ClientSession() as http:
        body = {"data": "x", "headers": headers}
        async with http.post(f"{node.url}/v1/topics/h/messages", json=body,
                             headers={"Authorization": "Bearer test"}) as response:  # fmt: skip
            answer = await response.json()
    assert response.status == 400 and answer["error"] == "bad_request"
    assert "headers" in answer["message"] or "header" in answer["message"]
    async with Producer(node.url, topic="h") as producer:
        with pytest.raises(BadRequestError, match="header"):
            await producer.publish("x", headers={"n": "v" * 5000})
