"""The native HTTP API (``/v1/...``): publish, pull with leases and long-poll, ack/nack, stats.

The node runs on a ``ManualClock``: leases end and long polls time out when the test
moves the clock, not after a wait.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kapok.testing import ManualClock, eventually
from kapok.testing.slow import scaled

CODE_RE = re.compile(r"^[0-9a-f]{32}$")

Json = dict[str, Any]


class Http:
    """A raw aiohttp client bound to one node, with the Bearer key."""

    def __init__(self, session: aiohttp.ClientSession, base: str, headers: dict[str, str]) -> None:
        self.session = session
        self.base = base
        self.headers = headers

    async def call(self, method: str, path: str, expect: int = 200, **kw: Any) -> Any:
        async with self.session.request(method, self.base + path, headers=self.headers, **kw) as resp:
            text = await resp.text()
            assert "Traceback" not in text
            assert resp.status == expect, (resp.status, text)
            assert resp.content_type == "application/json", text
            return await resp.json()

    async def publish(self, topic: str, *datas: str, **extra: Any) -> list[str]:
        if len(datas) == 1:
            body = await self.call("POST", f"/v1/topics/{topic}/messages", json={"data": datas[0], **extra})
        else:
            msgs = [{"data": d, **extra} for d in datas]
            body = await self.call("POST", f"/v1/topics/{topic}/messages", json={"messages": msgs})
        codes: list[str] = body["codes"]
        return codes

    async def pull(self, topic: str, **params: Any) -> list[Json]:
        query = {k: str(v) for k, v in params.items()}
        body = await self.call("GET", f"/v1/topics/{topic}/messages", params=query)
        assert set(body) == {"messages"}
        messages: list[Json] = body["messages"]
        return messages

    async def settle(self, topic: str, how: str, codes: list[str], **extra: Any) -> Json:
        body: Json = await self.call("POST", f"/v1/topics/{topic}/{how}", json={"codes": codes, **extra})
        return body


@pytest.fixture
async def timed_node(make_node: Any, clock: ManualClock) -> Any:
    return await make_node(clock=clock)


@pytest.fixture
async def http(timed_node: Any, auth: dict[str, str]) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession() as session:
        yield Http(session, timed_node.url, auth)


async def parked(node: Any, topic: str, group: str = "default") -> None:
    """Wait until a long poll waits on ``group`` for a message to arrive."""

    def waiting() -> bool:
        grp = node.broker.topics.get(topic) and node.broker.topics[topic].groups.get(group)
        return bool(grp) and grp.waiters == 1

    await eventually(waiting, what=f"a long poll parked on {topic}/{group}")


# ---------------------------------------------------------------- publish


async def test_publish_single_object(http: Http) -> None:
    body = await http.call(
        "POST", "/v1/topics/orders/messages", json={"data": "one", "key": "k", "priority": 3}
    )
    assert set(body) == {"codes"}
    (code,) = body["codes"]
    assert CODE_RE.match(code)
    msg = await http.call("GET", f"/v1/messages/{code}")
    assert msg["code"] == code and msg["topic"] == "orders" and msg["data"] == "one"
    assert msg["key"] == "k" and msg["priority"] == 3
    assert msg["groups"] == {"default": {"status": "ready", "attempts": 0}}
    assert msg["finished_at"] is None


async def test_publish_batch(http: Http) -> None:
    body = await http.call(
        "POST", "/v1/topics/orders/messages", json={"messages": [{"data": "a"}, {"data": "b"}, {"data": "c"}]}
    )
    codes = body["codes"]
    assert len(codes) == 3 and len(set(codes)) == 3 and codes == sorted(codes)
    pulled = await http.pull("orders", max=10)
    assert [m["code"] for m in pulled] == codes
    assert [m["data"] for m in pulled] == ["a", "b", "c"]


async def test_publish_dedup_id(http: Http) -> None:
    (first,) = await http.publish("d", "x", dedup_id="once")
    (again,) = await http.publish("d", "x", dedup_id="once")
    assert first == again
    assert len(await http.pull("d", max=10)) == 1


# ---------------------------------------------------------------- pull, leases, ack, nack


async def test_pull_leases_messages(http: Http, clock: ManualClock) -> None:
    assert await http.pull("jobs", group="workers") == []  # creates the durable group
    codes = await http.publish("jobs", "1", "2", "3")
    first = await http.pull("jobs", group="workers", max=2, lease_s=30)
    assert [m["code"] for m in first] == codes[:2]
    for m in first:
        assert m["group"] == "workers" and m["attempts"] == 1 and m["redelivered"] is False
        assert m["lease_until"] == clock.now + 30
    rest = await http.pull("jobs", group="workers", max=5, lease_s=30)
    assert [m["code"] for m in rest] == codes[2:]
    assert await http.pull("jobs", group="workers", max=5) == []  # all leased
    # The default group of this p2p topic got its own copy.
    assert [m["code"] for m in await http.pull("jobs", max=5)] == codes


async def test_unacked_lease_expires_and_comes_back(http: Http, timed_node: Any, clock: ManualClock) -> None:
    (code,) = await http.publish("lease", "x")
    (m,) = await http.pull("lease", lease_s=2)
    assert m["code"] == code and m["attempts"] == 1
    clock.advance(1.9)
    assert await http.pull("lease") == []  # still leased just before the lease ends
    # A long poll is woken by the lease's end (before its own time-out, a second later).
    poll = asyncio.create_task(http.pull("lease", wait=1.5, lease_s=30))
    await parked(timed_node, "lease")
    clock.advance(0.2)
    (again,) = await asyncio.wait_for(poll, scaled(5))
    assert again["code"] == code and again["attempts"] == 2 and again["redelivered"] is True


async def test_ack_settles_and_lists_unknown(http: Http) -> None:
    codes = await http.publish("acks", "a", "b")
    pulled = await http.pull("acks", group="default", max=2)
    assert len(pulled) == 2
    bogus = "0" * 32
    body = await http.settle("acks", "ack", [codes[0], bogus, codes[1]], group="default")
    assert body == {"settled": 2, "unknown": [bogus]}
    for code in codes:
        msg = await http.call("GET", f"/v1/messages/{code}")
        assert msg["groups"]["default"]["status"] == "consumed"
        assert msg["finished_at"]
    # Acking again: no longer held.
    body = await http.settle("acks", "ack", codes)
    assert body == {"settled": 0, "unknown": codes}


@pytest.mark.parametrize("how", ["ack", "nack"])
async def test_settling_an_unknown_group_or_topic_is_404_and_creates_nothing(http: Http, how: str) -> None:
    (code,) = await http.publish("jobs", "x")
    url = f"/v1/topics/jobs/{how}"
    body = await http.call("POST", url, json={"group": "wokers", "codes": [code]}, expect=404)
    assert body["error"] == "not_found" and "wokers" in body["message"]
    body = await http.call("POST", "/v1/topics/never/ack", json={"codes": [code]}, expect=404)
    assert body["error"] == "not_found" and "never" in body["message"]
    stats = await http.call("GET", "/v1/topics/jobs")
    assert [g["name"] for g in stats["groups"]] == ["default"]
    assert "never" not in [t["name"] for t in (await http.call("GET", "/v1/topics"))["topics"]]
    (later,) = await http.publish("jobs", "y")
    assert [m["code"] for m in await http.pull("jobs", max=5)] == [code, later]
    assert [g["name"] for g in (await http.call("GET", "/v1/topics/jobs"))["groups"]] == ["default"]


async def test_nack_requeue(http: Http) -> None:
    (code,) = await http.publish("nq", "x")
    await http.pull("nq")
    body = await http.settle("nq", "nack", [code])
    assert body == {"settled": 1, "unknown": []}
    (again,) = await http.pull("nq")
    assert again["code"] == code and again["attempts"] == 2


async def test_nack_without_requeue_dead_letters(http: Http) -> None:
    (code,) = await http.publish("nd", "poison")
    await http.pull("nd")
    body = await http.settle("nd", "nack", [code], requeue=False)
    assert body == {"settled": 1, "unknown": []}
    assert await http.pull("nd") == []
    (dead,) = await http.pull("nd.dlq")
    assert dead["data"] == "poison" and dead["topic"] == "nd.dlq"
    assert dead["headers"]["original_code"] == code and dead["headers"]["reason"] == "rejected"
    msg = await http.call("GET", f"/v1/messages/{code}")
    assert msg["groups"]["default"]["status"] == "dead"


async def test_long_poll_returns_when_a_message_arrives(
    http: Http, timed_node: Any, clock: ManualClock
) -> None:
    poll = asyncio.create_task(http.pull("lp", wait=3))
    await parked(timed_node, "lp")
    clock.advance(2.9)  # just before its time-out: still waiting
    (code,) = await http.publish("lp", "wake")
    pulled = await asyncio.wait_for(poll, scaled(5))
    assert [m["code"] for m in pulled] == [code]


async def test_long_poll_times_out_empty(http: Http, timed_node: Any, clock: ManualClock) -> None:
    poll = asyncio.create_task(http.call("GET", "/v1/topics/empty/messages", params={"wait": "0.3"}))
    await parked(timed_node, "empty")
    clock.advance(0.3)
    assert await asyncio.wait_for(poll, scaled(5)) == {"messages": []}


async def test_pull_on_pubsub_topic_needs_a_group(make_node: Any, auth: dict[str, str]) -> None:
    node = await make_node("mq.topics.news.push_type=2")
    async with aiohttp.ClientSession() as session:
        http = Http(session, node.url, auth)
        body = await http.call("GET", "/v1/topics/news/messages", expect=400)
        assert body["error"] == "bad_subscription" and "group" in body["message"]
        assert await http.pull("news", group="reader") == []
        (code,) = await http.publish("news", "hello")
        assert [m["code"] for m in await http.pull("news", group="reader")] == [code]


# ---------------------------------------------------------------- topics and messages


async def test_topic_stats(http: Http) -> None:
    await http.publish("stats", "1", "2", "3")
    await http.publish("stats", "later", delay_s=30)
    (leased,) = await http.pull("stats", max=1)
    body = await http.call("GET", "/v1/topics/stats")
    assert body["name"] == "stats" and body["mode"] == "p2p"
    assert body["live"] == 4 and body["delayed"] == 1
    assert body["live_bytes"] == len("123") + len("later")
    (group,) = body["groups"]
    assert group == {"name": "default", "durable": True, "ready": 2, "inflight": 1, "consumers": 0}
    await http.settle("stats", "ack", [leased["code"]])
    body = await http.call("GET", "/v1/topics/stats")
    assert body["groups"][0]["ready"] == 2 and body["groups"][0]["inflight"] == 0 and body["live"] == 3
    listing = await http.call("GET", "/v1/topics")
    assert [t["name"] for t in listing["topics"]] == ["stats"]
    assert listing["topics"][0] == body


async def test_get_and_delete_message(http: Http) -> None:
    (code,) = await http.publish("del", "bye")
    msg = await http.call("GET", f"/v1/messages/{code}")
    assert msg["data"] == "bye"
    assert await http.call("DELETE", f"/v1/messages/{code}") == {"deleted": code}
    body = await http.call("GET", f"/v1/messages/{code}", expect=404)
    assert body["error"] == "not_found"
    body = await http.call("DELETE", f"/v1/messages/{code}", expect=404)
    assert body["error"] == "not_found"
    assert await http.pull("del") == []  # a deleted message is not delivered


async def test_unknown_topic_and_message_are_404_json(http: Http) -> None:
    body = await http.call("GET", "/v1/topics/never-used", expect=404)
    assert body["error"] == "not_found" and "never-used" in body["message"]
    body = await http.call("GET", "/v1/messages/" + "a" * 32, expect=404)
    assert body["error"] == "not_found" and body["message"]
