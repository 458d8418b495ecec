"""``/metrics`` at a bounded cost (issue 25): per-topic series capped, the rest summed;
one render reused for every scrape within a second, one render for concurrent scrapes;
the key when ``metrics.require_key`` is set; and ``/replication/state`` behind the key."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kapok.core.model import Draft
from kapok.server.routes.openapi import document
from kapok.testing.slow import scaled

KEY = {"Authorization": "Bearer test"}  # scrapes with the key do not wait for those without it
MANY = 2000  # topics: far more than CACHED_FROM_ROWS, so a render is reused
# kapok.server.routes.metrics's, spelled out: the scrapers' contract.
OTHER_TOPICS, ALL_GROUPS, MAX_AGE_S = "(other topics)", "(all groups)", 1.0


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=scaled(60))) as s:
        yield s


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, or None when absent."""
    for match in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or "")) == labels:
            return float(match.group(2))
    return None


def topics_in(text: str, name: str = "kapok_topic_live") -> set[str]:
    return set(re.findall(rf'^{name}\{{topic="([^"]*)"\}}', text, re.M))


async def fill(node: Any, topics: dict[str, int]) -> None:
    """Publish ``n`` messages to each topic (through the service: thousands of topics fast)."""
    drafts = [Draft(topic, b"x" * 10) for topic, n in topics.items() for _ in range(n)]
    for i in range(0, len(drafts), 1000):
        _, durable = node.service.publish(drafts[i : i + 1000])
        if durable is not None:
            await durable


async def scrape(session: aiohttp.ClientSession, node: Any, headers: dict[str, str] | None = None) -> str:
    async with session.get(node.url + "/metrics", headers=headers or {}) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.text()


async def test_topics_past_the_cap_are_summed_as_one_series(
    make_node: Any, session: Any, auth: dict[str, str]
) -> None:
    node = await make_node("metrics.max_topics=3")
    # The three busiest keep their series; ties (b1, b2) go by name.
    await fill(node, {"a": 5, "b2": 4, "b1": 4, "c": 1, "d": 2})
    async with session.get(
        f"{node.url}/v1/topics/d/messages?max=1", headers={"Authorization": "Bearer test"}
    ):
        pass  # one of d's messages in flight
    text = await scrape(session, node)
    assert topics_in(text) == {"a", "b1", "b2", OTHER_TOPICS}
    assert sample(text, "kapok_topic_live", topic="a") == 5
    assert sample(text, "kapok_topic_live", topic=OTHER_TOPICS) == 3  # c and d
    assert sample(text, "kapok_topic_live_bytes", topic=OTHER_TOPICS) == 30
    assert sample(text, "kapok_group_ready", topic=OTHER_TOPICS, group=ALL_GROUPS) == 2
    assert sample(text, "kapok_group_inflight", topic=OTHER_TOPICS, group=ALL_GROUPS) == 1
    assert sample(text, "kapok_group_ready", topic="b1", group="default") == 4
    assert sample(text, "kapok_metrics_topics_folded") == 2
    assert sample(text, "kapok_messages_published_total") == 16  # node-wide counters count everything
    # The label can never be a topic's: topic names have no spaces.
    async with session.post(
        f"{node.url}/v1/topics/{OTHER_TOPICS}/messages",
        json={"data": "x"},
        headers={"Authorization": "Bearer test"},
    ) as resp:
        assert resp.status == 400


async def test_a_node_with_few_topics_has_them_all_and_always_current(make_node: Any, session: Any) -> None:
    node = await make_node()
    await fill(node, {f"t{i}": 1 for i in range(20)})
    text = await scrape(session, node)
    assert topics_in(text) == {f"t{i}" for i in range(20)}
    assert sample(text, "kapok_metrics_topics_folded") == 0
    # Fewer than CACHED_FROM_ROWS topics: not reused, a scrape right after a publish shows it.
    await fill(node, {"m": 3})
    text = await scrape(session, node)
    assert sample(text, "kapok_topic_live", topic="m") == 3
    assert sample(text, "kapok_metrics_renders_total") == 2


async def test_scrapes_within_a_second_share_one_render(make_node: Any, session: Any) -> None:
    node = await make_node()
    await fill(node, {f"topic-{i:05d}": 1 for i in range(MANY)})
    first = await scrape(session, node, KEY)
    renders = sample(first, "kapok_metrics_renders_total")
    assert renders is not None and renders >= 1
    assert sample(first, "kapok_metrics_render_cpu_seconds") is not None
    # A publish right after: the next scrapes within the second still get the same body
    # (the render's own counter included), and eight at once make no new render.
    await fill(node, {"late": 1})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    again = await asyncio.gather(*(scrape(session, node, KEY) for _ in range(8)))
    in_time = loop.time() - t0 < MAX_AGE_S  # else the box was too slow for the window
    if in_time:
        assert all(text == first for text in again)
    # Once the body is older than the window, the next scrape renders again: the publish shows.
    # (A render that ran meanwhile may already have been that one.)
    deadline = loop.time() + scaled(30)
    while (text := await scrape(session, node, KEY)) == first:
        assert loop.time() < deadline, "the body was never rendered again"
        await asyncio.sleep(0.05)
    assert sample(text, "kapok_topic_live", topic="late") == 1
    if in_time:
        assert sample(text, "kapok_metrics_renders_total") == renders + 1


async def test_concurrent_scrapes_wait_for_the_render_under_way(make_node: Any, session: Any) -> None:
    node = await make_node()
    await fill(node, {f"topic-{i:05d}": 1 for i in range(MANY)})
    texts = await asyncio.gather(*(scrape(session, node, KEY) for _ in range(8)))  # the first scrape ever
    assert {sample(text, "kapok_metrics_renders_total") for text in texts} == {1}


async def test_scrapes_without_the_key_share_a_pace_that_the_key_skips(node: Any, session: Any) -> None:
    loop = asyncio.get_running_loop()

    async def anonymous() -> tuple[int, float]:
        async with session.get(node.url + "/metrics") as resp:
            if resp.status == 429:
                assert (await resp.json())["error"] == "rate_limited"
            return resp.status, loop.time()

    tasks = [asyncio.create_task(anonymous()) for _ in range(40)]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    await scrape(session, node, KEY)
    keyed_at = loop.time()
    answers = await asyncio.gather(*tasks)
    statuses = [status for status, _ in answers]
    assert set(statuses) == {200, 429}, statuses  # 40 at once: more than two seconds of turns
    assert max(t for status, t in answers if status == 200) > keyed_at  # the key jumped the queue

    # Scrapes with the key have a pace of their own: 20 a second, waiting at most 5 s.
    async def keyed(unlimited: aiohttp.ClientSession) -> int:
        async with unlimited.get(node.url + "/metrics", headers=KEY) as resp:
            return resp.status

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as unlimited:
        keyed_statuses = await asyncio.gather(*(keyed(unlimited) for _ in range(160)))  # 8 s of turns
    assert set(keyed_statuses) == {200, 429} and keyed_statuses.count(200) < 130, keyed_statuses
    # A wrong bearer token is refused, not paced.
    async with session.get(node.url + "/metrics", headers={"Authorization": "Bearer wrong"}) as resp:
        assert resp.status == 401


async def test_require_key_wants_the_bearer_token(make_node: Any, session: Any) -> None:
    open_node = await make_node()  # the default: open, for scrapers without configuration
    await scrape(session, open_node)
    assert document(open_node.service.config)["paths"]["/metrics"]["get"]["security"] == [{}, {"bearer": []}]
    node = await make_node("metrics.require_key=true", "server.auth_backoff_after=1000")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic dGVzdA=="}):
        async with session.get(node.url + "/metrics", headers=headers) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"] == "unauthorized"
    text = await scrape(session, node, KEY)
    assert sample(text, "kapok_auth_failures_total") == 3
    assert sample(text, "kapok_metrics_renders_total") == 1  # a refused scrape renders nothing
    bearer = document(node.service.config)["paths"]["/metrics"]["get"]
    assert bearer["security"] == [{"bearer": []}] and "401" in bearer["responses"]


async def test_replication_state_needs_the_key(node: Any, session: Any) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        async with session.get(node.url + "/replication/state", headers=headers) as resp:
            assert resp.status == 401
            body = await resp.json()
        assert body["error"] == "unauthorized" and "partner" not in body
    async with session.get(node.url + "/replication/state", headers={"Authorization": "Bearer test"}) as resp:
        assert resp.status == 200
        state = await resp.json()
    assert state["role"] and "partner_url" in state
    op = document(node.service.config)["paths"]["/replication/state"]["get"]
    assert op["security"] == [{"bearer": []}] and "401" in op["responses"]
