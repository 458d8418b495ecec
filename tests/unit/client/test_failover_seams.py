"""The seams replication will use, over a fake view and transport: a slave that takes over
serves its master's pair (in-doubt batches, keys and subscriptions follow it there, not to
another shard), and a passive slave's ``not_active`` is treated like a node that is down.

The end-to-end takeover with real slaves belongs to the replication tests; these pin the
client's half of the contract (see the README's "Python client" section).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, TypedDict

from tests.unit.client.fakes import SEED, FakeCluster

from kapok.client import Consumer, Producer
from kapok.testing.slow import scaled


class Backoff(TypedDict):
    backoff_base_s: float
    backoff_cap_s: float
    refresh_interval_s: float


FAST: Backoff = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "refresh_interval_s": 0.1}


def _pair_cluster() -> FakeCluster:
    cluster = FakeCluster("m1", "m2", "s1")
    s1 = cluster.nodes["s1"]
    s1.passive = True
    s1.view = {"role": "slave", "active": False, "pair": "m1"}
    cluster.nodes["m1"].view = {"pair": "s1"}
    return cluster


async def _until(condition: Any, what: str) -> None:
    for _ in range(round(scaled(500))):  # 5 s at most (more on a loaded machine)
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_an_in_doubt_batch_follows_its_pair_to_the_slave_that_took_over() -> None:
    cluster = _pair_cluster()
    m1, m2, s1 = (cluster.nodes[n] for n in ("m1", "m2", "s1"))
    m1.break_after_store = 1
    m1.on_break = lambda: s1.take_over_from(m1)
    with cluster.serving():
        producer = Producer([SEED], topic="t", connector=cluster.connect, in_doubt_wait_s=30, **FAST)
        async with producer:
            assert set(producer.view) == {"m1", "m2"}  # the passive slave is not a target
            futures = [await producer.send(f"m{i}") for i in range(400)]
            await asyncio.wait_for(producer.flush(), scaled(5))
            assert producer.view["m1"].name == "s1"
    assert all(f.exception() is None for f in futures)
    in_doubt = set(m1.in_doubt[0])
    assert in_doubt <= set(s1.data) and not in_doubt & set(m2.data)  # resent to the pair, not elsewhere
    everything = collections.Counter([*s1.data, *m2.data])
    assert everything == collections.Counter(f"m{i}" for i in range(400))  # none twice
    assert producer.stats.node("s1").confirmed >= len(in_doubt)


async def test_key_mode_keeps_a_pairs_keys_through_a_takeover() -> None:
    cluster = _pair_cluster()
    m1, m2, s1 = (cluster.nodes[n] for n in ("m1", "m2", "s1"))
    keys = [f"k{i}" for i in range(40)]
    with cluster.serving():
        async with Producer([SEED], topic="t", connector=cluster.connect, balance="key", **FAST) as producer:
            for key in keys:
                await producer.publish(f"{key}:before", key=key)
            on_m1 = {d.split(":")[0] for d in m1.data}
            assert on_m1 and on_m1 != set(keys)
            s1.take_over_from(m1)
            await _until(lambda: producer.view["m1"].name == "s1", "the takeover in the view")
            for key in keys:
                await producer.publish(f"{key}:after", key=key)
    assert {d.split(":")[0] for d in s1.data if d.endswith(":after")} == on_m1
    assert {d.split(":")[0] for d in m2.data if d.endswith(":after")} == set(keys) - on_m1


async def test_a_passive_slave_that_says_not_active_is_skipped() -> None:
    cluster = _pair_cluster()
    s1 = cluster.nodes["s1"]
    s1.view = {"role": "slave", "active": True, "pair": "s1"}  # a stale view: s1 claims a pair of its own
    with cluster.serving():
        async with Producer([SEED], topic="t", connector=cluster.connect, batch_size=10, **FAST) as producer:
            assert "s1" in producer.view
            futures = [await producer.send(f"m{i}") for i in range(300)]
            await asyncio.wait_for(producer.flush(), scaled(5))
    assert all(f.exception() is None for f in futures)
    assert not s1.data and producer.stats.node("s1").failures >= 1
    assert len(cluster.nodes["m1"].data) + len(cluster.nodes["m2"].data) == 300


async def test_the_consumer_moves_its_subscription_to_the_slave() -> None:
    cluster = _pair_cluster()
    m1, s1 = cluster.nodes["m1"], cluster.nodes["s1"]
    with cluster.serving():
        async with Consumer([SEED], topic="t", connector=cluster.connect, **FAST) as consumer:
            m1.sessions[-1].push("from-m1")
            assert (await consumer.get(1)).node == "m1"
            s1.take_over_from(m1)
            await m1.sessions[-1].close()  # the master died
            await _until(lambda: s1.sessions and s1.sessions[-1].deliver is not None, "a subscription on s1")
            s1.sessions[-1].push("from-s1")
            msg = await consumer.get(1)
    assert (msg.code, msg.node) == ("from-s1", "s1")
