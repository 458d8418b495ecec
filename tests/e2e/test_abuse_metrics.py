"""An attack on ``/metrics`` of a live node with many topics (issue 25), bounded like the
attacks of ``test_abuse`` (whose helpers it uses): eight scrapers without the key poll
``/metrics`` as fast as they are answered while a real producer and consumer work.

The pair must keep working, no confirmed message may be lost, the node's RSS stays under
the stated bound, and the node made at most one render a second, however many scrapes
it answered (``kapok_metrics_renders_total``). Speed is not asserted here: what the
scrapers cost a client's latency is measured by ``kapok bench --workload scrape``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from tests.e2e.test_abuse import AUTH, KEPT, T, after_attack, launch, pair_works, publish, rss_mb

from kapok.launch import NodeProcess
from kapok.protocol.native import decode_frame, encode_pub
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOPICS = 3000  # a render of these takes tens of ms: hammered without a cache, the loop stalls
SCRAPERS = 8
ATTACK_S = 8.0  # how long the scrapers poll (a window of the attack, not a timing bound)
RSS_GROWTH_MB = 150  # the bound: the node's RSS at most this much over its RSS before the attack


@pytest.fixture
def nodes() -> Iterator[list[NodeProcess]]:
    started: list[NodeProcess] = []
    yield started
    for node in started:
        node.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=scaled(60))) as s:
        yield s


async def make_topics(session: aiohttp.ClientSession, node: NodeProcess, count: int) -> None:
    """``count`` topics of one message each, through native ``pub`` frames of 500."""
    async with session.ws_connect(node.ws_url + "/v1/ws", headers=AUTH) as ws:
        for start in range(0, count, 500):
            msgs = [{"topic": f"many-{i}", "data": "x"} for i in range(start, min(count, start + 500))]
            await ws.send_bytes(encode_pub(start, msgs))
            assert decode_frame((await ws.receive(timeout=T)).data)["op"] == "puback"


async def renders(session: aiohttp.ClientSession, node: NodeProcess) -> float | None:
    """``kapok_metrics_renders_total``, read with the key (which never waits for the pace);
    None when the node does not count its renders."""
    async with session.get(node.url + "/metrics", headers=AUTH) as resp:
        assert resp.status == 200
        match = re.search(r"^kapok_metrics_renders_total (\S+)$", await resp.text(), re.M)
    return float(match.group(1)) if match else None


async def test_eight_scrapers_without_the_key_on_a_node_with_many_topics(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = launch(nodes, tmp_path)
    await make_topics(session, node, TOPICS)
    kept = await publish(session, node, "kept", KEPT)
    before = rss_mb(node)
    statuses: dict[int, int] = {}
    stop = asyncio.Event()
    attacker = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=0)  # not the real clients' address
    async with aiohttp.ClientSession(
        connector=attacker, timeout=aiohttp.ClientTimeout(total=scaled(60))
    ) as evil:

        async def scraper() -> None:
            while not stop.is_set():
                async with evil.get(node.url + "/metrics") as resp:
                    await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1

        t0 = time.monotonic()
        first = await renders(session, node)
        tasks = [asyncio.create_task(scraper()) for _ in range(SCRAPERS)]
        rounds = 0
        try:
            while time.monotonic() - t0 < ATTACK_S or rounds == 0:
                await pair_works(session, node)  # a real producer and consumer, meanwhile
                rounds += 1
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        last = await renders(session, node)
        elapsed = time.monotonic() - t0
    print(f"\n{sum(statuses.values())} scrapes {statuses} and {rounds} pair rounds in {elapsed:.1f} s, "
          f"renders {first} then {last}")  # fmt: skip
    assert statuses.get(200, 0) >= 1 and set(statuses) <= {200, 429}, statuses
    assert first is not None and last is not None, "the node does not count its renders"
    assert last - first <= elapsed + 1, "more than one render a second"
    await after_attack(session, node, kept, before + RSS_GROWTH_MB, before, "scrapers")
