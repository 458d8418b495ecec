"""The producer's ``balance="p2c"`` against three real masters joined by gossip.

1. Three equal masters: 6,000 publishes, a window of them unconfirmed at a time, are spread
   evenly: every master's share is within ``SHARE_SLACK`` of a third, the seed's (the node
   that answered discovery) included.
   Not a chi-square test of equal shares: p2c's draws are not independent. It joins the
   shorter of two queues, so its shares follow the masters' speeds, and three nodes on a
   shared two-core machine are equal only on average: one that gets a tenth less CPU for
   the run (another job on the machine) answers a tenth slower and rightly gets ~31 %, which
   a test of independent draws at this count calls unequal (p ~ 1e-4). A skew of the
   balancer itself, such as the seed favoured or nodes that speed up with their share, moves
   a share by much more (a skew of that kind gave 20 %).
2. One master is 20 ms away each way (its ``server.public_url`` is a TCP proxy in ``delay``
   mode, so gossip tells clients to reach it there): it gets clearly less than a third
   (under 25 %).

Counts are asserted; times and the spread are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from tests.chisquare import chi_square_uniform_p

from kapok.client import Producer
from kapok.launch import NodeProcess, nodes_view, start_node, stop_all, wait_for
from kapok.local_cluster import NodePlan, plan_cluster
from kapok.testing.slow import scaled
from kapok.testing.threadedproxy import ThreadedFaultProxy

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(180)]

DEADLINE_S = scaled(30.0)
N = 6000
WINDOW = 100  # messages unconfirmed at a time
DELAY_MS = 20.0  # each way, to the far master
SHARE_SLACK = 0.05  # of the publishes: equal masters each get a third, give or take this


def _start(base: Path, plans: list[NodePlan], public_url: Mapping[str, str]) -> list[NodeProcess]:
    """The planned masters, the first (everyone's gossip seed) first; a node named in
    ``public_url`` tells the cluster to reach it at that URL."""
    nodes: list[NodeProcess] = []
    try:
        for plan in plans:
            sets = [f"server.port={plan.http_port}"]
            if plan.name in public_url:
                sets.append(f"server.public_url={public_url[plan.name]}")
            config = plan.config(plans[0].gossip_port, None)
            nodes.append(start_node(base / plan.name, *sets, config_text=config))
    except BaseException:
        stop_all(nodes)
        raise
    return nodes


def _all_alive(nodes: list[NodeProcess]) -> bool:
    views = [nodes_view(n) for n in nodes]
    return all(
        len(v) == len(nodes) and all(r["state"] == "alive" and r.get("active") is True for r in v.values())
        for v in views
    )


async def _publish(producer: Producer, count: int, window: int) -> float:
    """Publish ``count`` messages, at most ``window`` of them unconfirmed; the seconds it took."""
    started = time.monotonic()
    unconfirmed: collections.deque[asyncio.Future[str]] = collections.deque()
    async with asyncio.timeout(scaled(120)):
        for i in range(count):
            unconfirmed.append(await producer.send(str(i)))
            while len(unconfirmed) >= window:
                await unconfirmed.popleft()
        for future in unconfirmed:
            await future
    return time.monotonic() - started


async def test_p2c_spreads_publishes_evenly_over_three_equal_masters(tmp_path: Path) -> None:
    plans = plan_cluster(3, slaves=False)
    names = [plan.name for plan in plans]
    nodes = _start(tmp_path, plans, {})
    try:
        wait_for(lambda: _all_alive(nodes), DEADLINE_S, 0.1)
        # A seeded balancer: the test checks one fixed sequence of draws, not its luck.
        producer = Producer(nodes[0].url, topic="p2c-even", balance="p2c", rng=random.Random(5))
        async with producer:
            assert sorted(m.name for m in producer.view.values()) == names
            elapsed = await _publish(producer, N, WINDOW)
        counts = [producer.stats.node(name).confirmed for name in names]
        spread = dict(zip(names, counts, strict=True))
        p = chi_square_uniform_p(counts)
        print(f"\np2c, three equal masters, seed {names[0]}: {N} publishes in {elapsed:.2f} s, "
              f"confirmed per master {spread}, chi-square p = {p:.4f}")  # fmt: skip
        assert producer.stats.confirmed == N and sum(counts) == N
        uneven = {
            name: f"{count / N:.1%}" for name, count in spread.items() if abs(count / N - 1 / 3) > SHARE_SLACK
        }
        assert not uneven, f"not an even spread: {spread} (chi-square p = {p:.2e}); off a third: {uneven}"
    finally:
        stop_all(nodes)


async def test_p2c_sends_clearly_less_to_a_master_20_ms_away(tmp_path: Path) -> None:
    plans = plan_cluster(3, slaves=False)
    names = [plan.name for plan in plans]
    far = plans[2]
    with ThreadedFaultProxy("127.0.0.1", far.http_port) as proxy:
        proxy.set_mode("delay", ms=DELAY_MS)
        nodes = _start(tmp_path, plans, {far.name: proxy.url})
        try:
            wait_for(lambda: _all_alive(nodes), DEADLINE_S, 0.1)
            # Gossip tells clients to reach the far master through the proxy.
            assert nodes_view(nodes[0])[far.name]["http_url"] == proxy.url
            producer = Producer(nodes[0].url, topic="p2c-far", balance="p2c", rng=random.Random(5))
            async with producer:
                urls = {m.name: m.url for m in producer.view.values()}
                assert sorted(urls) == names and urls[far.name] == proxy.url
                elapsed = await _publish(producer, N, WINDOW)
            counts = {name: producer.stats.node(name).confirmed for name in names}
            share = counts[far.name] / N
            went_through = proxy.counts().forwarded_to_server
        finally:
            stop_all(nodes)
    print(f"\np2c, {far.name} {DELAY_MS:g} ms away each way: {N} publishes in {elapsed:.2f} s, "
          f"confirmed per master {counts}, {far.name}'s share {share:.1%}")  # fmt: skip
    assert producer.stats.confirmed == N and sum(counts.values()) == N
    assert went_through > 0  # the producer did talk to the far master through the proxy
    assert share < 0.25, f"{far.name}, {DELAY_MS:g} ms away, got {share:.1%} of the publishes: {counts}"
