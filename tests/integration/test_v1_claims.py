"""Claims over the native HTTP API: ``claim=`` on a pull, ``"claim"`` in an ack, bad names,
and a claim kept through a restart of the node (its WAL, then its snapshot).

Leases end when the test moves the ``ManualClock``, not after a wait.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from kapok.testing import ManualClock

Json = dict[str, Any]


class Http:
    def __init__(self, session: aiohttp.ClientSession, base: str, headers: dict[str, str]) -> None:
        self.session = session
        self.base = base
        self.headers = headers

    async def call(self, method: str, path: str, expect: int = 200, **kw: Any) -> Any:
        async with self.session.request(method, self.base + path, headers=self.headers, **kw) as resp:
            text = await resp.text()
            assert resp.status == expect, (resp.status, text)
            assert resp.content_type == "application/json", text
            return await resp.json()

    async def publish(self, topic: str, n: int) -> list[str]:
        msgs = [{"data": f"m{i}"} for i in range(n)]
        body = await self.call("POST", f"/v1/topics/{topic}/messages", json={"messages": msgs})
        codes: list[str] = body["codes"]
        return codes

    async def pull(self, topic: str, **params: Any) -> Json:
        query = {k: str(v) for k, v in params.items()}
        body: Json = await self.call("GET", f"/v1/topics/{topic}/messages", params=query)
        return body

    async def codes(self, topic: str, **params: Any) -> list[str]:
        body = await self.pull(topic, **params)
        assert body.get("claim") == params.get("claim")
        return [m["code"] for m in body["messages"]]

    async def ack(self, topic: str, **body: Any) -> Json:
        out: Json = await self.call("POST", f"/v1/topics/{topic}/ack", json=body)
        return out


@pytest.fixture
async def http(make_node: Any, clock: ManualClock, auth: dict[str, str]) -> AsyncIterator[Http]:
    node = await make_node(clock=clock)
    async with aiohttp.ClientSession() as session:
        yield Http(session, node.url, auth)


async def test_a_claim_is_fetched_again_until_acked(http: Http, clock: ManualClock) -> None:
    await http.pull("jobs", group="g")  # makes the group
    codes = await http.publish("jobs", 6)
    body = await http.pull("jobs", group="g", max=3, lease_s=30, claim="q1:b0:p0")
    assert set(body) == {"messages", "claim"} and body["claim"] == "q1:b0:p0"
    first = [m["code"] for m in body["messages"]]
    assert first == codes[:3]
    assert [m["lease_until"] for m in body["messages"]] == [clock.time() + 30] * 3
    clock.advance(20)
    body = await http.pull("jobs", group="g", max=1000, lease_s=30, claim="q1:b0:p0")
    assert [m["code"] for m in body["messages"]] == first  # the same, none new, leases renewed
    assert [m["lease_until"] for m in body["messages"]] == [clock.time() + 30] * 3
    assert [m["attempts"] for m in body["messages"]] == [1, 1, 1]
    clock.advance(20)  # past the first lease: renewed, nothing is requeued
    assert await http.codes("jobs", group="g", max=1000, claim="q1:b0:p0") == first
    assert await http.ack("jobs", group="g", claim="q1:b0:p0") == {"settled": 3, "unknown": []}
    assert await http.ack("jobs", group="g", claim="q1:b0:p0") == {"settled": 0, "unknown": []}
    assert await http.codes("jobs", group="g", max=1000, claim="q1:b0:p0") == codes[3:]
    assert await http.codes("jobs", group="g", max=5) == []  # all leased


async def test_a_pull_without_a_claim_answers_as_before(http: Http) -> None:
    await http.publish("plain", 2)
    body = await http.pull("plain", max=5)
    assert set(body) == {"messages"} and len(body["messages"]) == 2


async def test_an_empty_claimed_pull_makes_no_claim(http: Http) -> None:
    await http.pull("e", group="g")
    assert await http.pull("e", group="g", claim="c") == {"messages": [], "claim": "c"}
    codes = await http.publish("e", 2)
    assert await http.codes("e", group="g", max=5, claim="c") == codes


async def test_ack_by_claim_and_codes_settles_both(http: Http) -> None:
    await http.pull("b", group="g")
    codes = await http.publish("b", 4)
    await http.codes("b", group="g", max=2, claim="c")
    await http.codes("b", group="g", max=1)
    out = await http.ack("b", group="g", claim="c", codes=[codes[2], codes[0], "0" * 32])
    assert out == {"settled": 3, "unknown": ["0" * 32]}


async def test_nack_by_claim_gives_them_back(http: Http) -> None:
    await http.pull("n", group="g")
    codes = await http.publish("n", 2)
    await http.codes("n", group="g", max=2, claim="c")
    out = await http.call("POST", "/v1/topics/n/nack", json={"group": "g", "claim": "c"})
    assert out == {"settled": 2, "unknown": []}
    assert sorted(await http.codes("n", group="g", max=5)) == codes


async def test_a_lease_that_ends_leaves_its_claim(http: Http, clock: ManualClock) -> None:
    await http.pull("t", group="g")
    codes = await http.publish("t", 2)
    await http.codes("t", group="g", max=1, lease_s=5, claim="c")
    clock.advance(6)  # the lease ends: requeued ("timeout"), out of the claim
    assert await http.codes("t", group="g", max=5, claim="c") == codes  # leased afresh, both
    assert await http.ack("t", group="g", claim="c") == {"settled": 2, "unknown": []}


@pytest.mark.parametrize("claim", ["", "a b", "x" * 201, "é", "a/b"])
async def test_a_bad_claim_is_a_bad_request(http: Http, claim: str) -> None:
    await http.pull("bad", group="g")
    body = await http.call("GET", "/v1/topics/bad/messages", 400, params={"group": "g", "claim": claim})
    assert body["error"] == "bad_request"
    body = await http.call("POST", "/v1/topics/bad/ack", 400, json={"group": "g", "claim": claim})
    assert body["error"] == "bad_request"


async def test_a_claim_must_be_a_string_and_codes_or_a_claim_are_needed(http: Http) -> None:
    await http.pull("bad", group="g")
    body = await http.call("POST", "/v1/topics/bad/ack", 400, json={"group": "g", "claim": 7})
    assert body["error"] == "bad_request"
    body = await http.call("POST", "/v1/topics/bad/ack", 400, json={"group": "g"})
    assert body["error"] == "bad_request"


# ---------------------------------------------------------------- a restart keeps a claim


Start = Callable[..., Awaitable[Any]]


@pytest.mark.parametrize("stop", ["graceful", "no snapshot"])
async def test_a_restart_keeps_the_claim(start: Start, auth: dict[str, str], stop: str) -> None:
    node = await start("n1")
    async with aiohttp.ClientSession() as session:
        http = Http(session, node.url, auth)
        await http.pull("jobs", group="g")
        codes = await http.publish("jobs", 5)
        claimed = await http.codes("jobs", group="g", max=2, lease_s=300, claim="q:b1:p0")
        plain = await http.codes("jobs", group="g", max=1, lease_s=300)
        if stop == "graceful":
            await node.stop()  # a snapshot at stop: the claim must be in it
        else:
            await node.service.store.aclose(snapshot=False)  # only the WAL holds it
            await node.stop()
        node = await start("n1")
        http = Http(session, node.url, auth)
        body = await http.pull("jobs", group="g", max=100, lease_s=60, claim="q:b1:p0")
        assert [m["code"] for m in body["messages"]] == claimed
        assert [m["attempts"] for m in body["messages"]] == [1, 1]  # not delivered again
        assert await http.ack("jobs", group="g", claim="q:b1:p0") == {"settled": 2, "unknown": []}
        rest = await http.codes("jobs", group="g", max=100, lease_s=60)
        assert sorted(rest) == sorted(plain + codes[3:])  # the unclaimed lease was requeued


# ---------------------------------------------------------------- start=earliest


async def test_start_earliest_gives_a_new_group_the_backlog(http: Http) -> None:
    codes = await http.publish("s", 3)  # before the group exists
    assert await http.codes("s", group="late", max=10) == []  # latest: the default
    assert await http.codes("s", group="reader", max=10, start="earliest") == codes
    assert await http.codes("s", group="reader", max=10, start="earliest") == []  # leased; exists
    body = await http.call("GET", "/v1/topics/s/messages", 400, params={"group": "x", "start": "first"})
    assert body["error"] == "bad_request"
