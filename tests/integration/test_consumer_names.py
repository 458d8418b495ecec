"""How each protocol names a consumer (docs/protocol.md, "Consumer names"), read back from
the ``Delivered`` records the node wrote to its WAL.

Real sockets on 127.0.0.1 against an in-process node: a KapokMQ consumer is its path's
consumerId; a ``/v1/ws`` subscription is its ``sub``'s ``consumer``, else the connection's
``?client=``, else ``conn-<n>@<address>:<port>`` (the client's own socket address); an
HTTP pull is its ``X-Kapok-Consumer`` header, else ``http:<address>``. A name that is not
at most 255 printable characters is refused.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kapok.core import changes as ch
from kapok.testing.slow import scaled

T = scaled(5.0)  # upper bound of every single wait


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def consumers_of(node: Any) -> dict[str, str]:
    """Every delivered code's consumer, from the WAL the node wrote (flushed first)."""
    store = node.service.store
    await store.wal.flush()
    records = await asyncio.get_running_loop().run_in_executor(None, lambda: list(store.replay_from(0)))
    return {r.code: r.consumer for r in records if isinstance(r, ch.Delivered)}


async def publish(session: aiohttp.ClientSession, node: Any, auth: dict[str, str], topic: str) -> str:
    url = f"{node.url}/v1/topics/{topic}/messages"
    async with session.post(url, json={"data": topic}, headers=auth) as resp:
        assert resp.status == 200, await resp.text()
        (code,) = (await resp.json())["codes"]
        assert isinstance(code, str)
        return code


async def frame(ws: aiohttp.ClientWebSocketResponse, op: str) -> dict[str, Any]:
    while True:
        msg = await ws.receive(timeout=T)
        assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg
        got = json.loads(msg.data)
        assert isinstance(got, dict)
        if got.get("op") == op:
            return got


async def subscribe(ws: aiohttp.ClientWebSocketResponse, topic: str, **fields: Any) -> dict[str, Any]:
    await ws.send_str(json.dumps({"op": "sub", "id": 1, "topic": topic, **fields}))
    return await frame(ws, "subok")


async def test_a_native_subscription_is_named_by_sub_then_client_then_its_connection(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    named = await session.ws_connect(f"{node.ws_url}/v1/ws?client=billing-7", headers=auth)
    unnamed = await session.ws_connect(f"{node.ws_url}/v1/ws", headers=auth)
    try:
        await subscribe(named, "by-sub", consumer="alice")
        await subscribe(named, "by-client")
        await subscribe(unnamed, "by-connection")
        codes = {topic: await publish(session, node, auth, topic) for topic in ("by-sub", "by-client")}
        for _ in range(2):
            await frame(named, "msg")
        codes["by-connection"] = await publish(session, node, auth, "by-connection")
        await frame(unnamed, "msg")
        host, port = unnamed.get_extra_info("sockname")[:2]
    finally:
        await named.close()
        await unnamed.close()
    consumers = await consumers_of(node)
    assert consumers[codes["by-sub"]] == "alice"
    assert consumers[codes["by-client"]] == "billing-7"
    assert re.fullmatch(rf"conn-\d+@{re.escape(host)}:{port}", consumers[codes["by-connection"]])


@pytest.mark.parametrize("name", ["x" * 256, "tab\there", 7])
async def test_a_sub_with_a_bad_consumer_name_is_refused(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str], name: object
) -> None:
    async with session.ws_connect(f"{node.ws_url}/v1/ws", headers=auth) as ws:
        await ws.send_str(json.dumps({"op": "sub", "id": 1, "topic": "t", "consumer": name}))
        error = await frame(ws, "error")
    assert error["code"] == "bad_request" and "consumer" in error["message"], error


async def test_a_kapokmq_consumer_is_named_by_its_consumer_id(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    async with session.ws_connect(f"{node.ws_url}/Consumers/Conn/orders/go-consumer-1") as ws:
        assert (await ws.receive_str(timeout=T)) == "Please enter the secret key"
        await ws.send_str("test")
        assert (await ws.receive_str(timeout=T)) == "Secret key matching succeeded"
        code = await publish(session, node, auth, "orders")
        push = json.loads(await ws.receive_str(timeout=T))
        assert push["MessageCode"] == code
        await ws.send_str(code)
    assert (await consumers_of(node))[code] == "go-consumer-1"


async def test_a_kapokmq_consumer_id_that_is_not_printable_is_refused(
    node: Any, session: aiohttp.ClientSession
) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await session.ws_connect(f"{node.ws_url}/Consumers/Conn/orders/bad%0Aid")
    assert info.value.status == 400


async def test_a_pull_is_named_by_its_header_else_by_its_address(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    url = f"{node.url}/v1/topics/pulled/messages?lease_s=60"
    async with session.get(url, headers=auth) as resp:  # makes the default group
        assert resp.status == 200
    first = await publish(session, node, auth, "pulled")
    async with session.get(url, headers={**auth, "X-Kapok-Consumer": "reader-1"}) as resp:
        assert [m["code"] for m in (await resp.json())["messages"]] == [first]
    second = await publish(session, node, auth, "pulled")
    async with session.get(url, headers=auth) as resp:
        assert [m["code"] for m in (await resp.json())["messages"]] == [second]
    async with session.get(url, headers={**auth, "X-Kapok-Consumer": "x" * 256}) as resp:
        assert resp.status == 400
    consumers = await consumers_of(node)
    assert (consumers[first], consumers[second]) == ("reader-1", "http:127.0.0.1")
