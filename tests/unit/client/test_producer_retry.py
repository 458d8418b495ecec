"""The producer's failure handling over a fake transport: what goes elsewhere, what waits
for its pair, and that a retry never stores a message twice on a pair."""

from __future__ import annotations

import asyncio
import collections
import re
import time
from typing import Any, TypedDict

import pytest
from tests.unit.client.fakes import SEED, FakeCluster

from kapok.client import Producer, Status
from kapok.errors import BadRequestError, UnavailableError
from kapok.testing.slow import scaled


class Backoff(TypedDict):
    backoff_base_s: float
    backoff_cap_s: float
    refresh_interval_s: float


FAST: Backoff = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "refresh_interval_s": 0.1}


def _producer(cluster: FakeCluster, **options: Any) -> Producer:
    return Producer([SEED], topic="t", connector=cluster.connect, **{**FAST, **options})


async def _publish_all(producer: Producer, n: int) -> list[str]:
    futures = [await producer.send(f"m{i}") for i in range(n)]
    await producer.flush()
    return [f.result() for f in futures]


async def test_a_node_that_refuses_connections_is_skipped() -> None:
    cluster = FakeCluster("a", "b", "c")
    cluster.nodes["b"].refuse = True
    with cluster.serving():
        async with _producer(cluster, batch_size=10) as producer:
            codes = await _publish_all(producer, 600)
    assert len(set(codes)) == 600
    stored = {n: len(node.data) for n, node in cluster.nodes.items()}
    assert stored["b"] == 0 and stored["a"] + stored["c"] == 600
    assert producer.stats.confirmed == 600 and producer.stats.node("b").confirmed == 0
    assert producer.stats.node("b").failures >= 1


async def test_an_in_doubt_batch_goes_back_to_its_pair_and_is_not_stored_twice() -> None:
    cluster = FakeCluster("a", "b")
    a = cluster.nodes["a"]
    a.break_after_store = 1  # the first batch a stores is never confirmed
    with cluster.serving():
        async with _producer(cluster, batch_size=50) as producer:
            codes = await _publish_all(producer, 1000)
    everything = [d for node in cluster.nodes.values() for d in node.data]
    assert collections.Counter(everything) == collections.Counter(f"m{i}" for i in range(1000))
    assert len(codes) == 1000 and producer.stats.confirmed == 1000
    assert producer.stats.retried >= 50 and producer.stats.node("a").retried >= 50
    assert len(a.sessions) >= 2  # reconnected to the same pair to resend


async def test_in_doubt_batches_move_elsewhere_after_the_wait_when_the_pair_stays_away() -> None:
    cluster = FakeCluster("a", "b")
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    a.break_after_store = 1

    async def refuse_a_later(member: Any) -> Any:
        if member.name == "a" and a.sessions:
            a.refuse = True
        return await cluster.connect(member)

    with cluster.serving():
        producer = Producer([SEED], topic="t", connector=refuse_a_later, in_doubt_wait_s=0.2, **FAST)
        async with producer:
            codes = await asyncio.wait_for(_publish_all(producer, 200), scaled(5))
    assert len(codes) == 200 and len(a.in_doubt) == 1
    # The price of availability, documented: a stored its in-doubt batch, and b has it too.
    assert set(a.in_doubt[0]) <= set(b.data)
    assert set(a.data) | set(b.data) == {f"m{i}" for i in range(200)}


async def test_key_mode_keeps_a_key_on_its_pair_through_a_broken_connection() -> None:
    cluster = FakeCluster("a", "b", "c")
    for node in cluster.nodes.values():
        node.break_after_store = 1  # every pair loses its first connection after storing
    with cluster.serving():
        async with _producer(cluster, balance="key", batch_size=7) as producer:
            futures = [await producer.send(f"{k}:{i}", key=k) for i in range(30) for k in ("x", "y", "z")]
            await asyncio.wait_for(producer.flush(), scaled(5))
    assert all(f.exception() is None for f in futures)
    for key in ("x", "y", "z"):
        holders = [n for n, node in cluster.nodes.items() if any(d.startswith(key) for d in node.data)]
        assert len(holders) == 1  # one key, one pair
        data = [d for d in cluster.nodes[holders[0]].data if d.startswith(key)]
        assert data == [f"{key}:{i}" for i in range(30)]  # once each, in order


async def test_one_bad_message_does_not_fail_its_batch() -> None:
    cluster = FakeCluster("a")
    with cluster.serving():
        async with _producer(cluster, batch_size=10) as producer:
            futures = [await producer.send(d) for d in ["m0", "m1", "bad", "m3"]]
            await producer.flush()
    assert isinstance(futures[2].exception(), BadRequestError)
    assert [f.result() for i, f in enumerate(futures) if i != 2] and cluster.nodes["a"].data == [
        "m0",
        "m1",
        "m3",
    ]
    assert producer.stats.confirmed == 3 and producer.stats.failed == 1


async def test_nothing_waits_forever_when_no_node_takes_work() -> None:
    cluster = FakeCluster("a")
    cluster.nodes["a"].refuse = True
    with cluster.serving():
        async with _producer(cluster, publish_timeout_s=0.3) as producer:
            started = time.monotonic()
            with pytest.raises(UnavailableError):
                await producer.publish("m0")
            assert time.monotonic() - started < scaled(5)  # not forever: the 0.3 s time-out, and then some
            assert producer.status is Status.RECONNECTING


async def test_send_waits_while_max_pending_messages_are_unconfirmed() -> None:
    cluster = FakeCluster("a")
    gate = asyncio.Event()
    node = cluster.nodes["a"]

    async def gated_connect(member: Any) -> Any:
        session = await cluster.connect(member)
        publish = session.publish

        async def gated(msgs: list[dict[str, Any]], topic: str | None = None) -> Any:
            await gate.wait()
            return await publish(msgs, topic)

        session.publish = gated  # type: ignore[method-assign]
        return session

    with cluster.serving():
        async with Producer([SEED], topic="t", connector=gated_connect, max_pending=5, **FAST) as producer:
            for i in range(5):
                await producer.send(f"m{i}")
            blocked = asyncio.ensure_future(producer.send("m5"))
            await asyncio.sleep(scaled(0.05))
            assert not blocked.done() and producer._pending == 5
            gate.set()
            await asyncio.wait_for(blocked, scaled(5))
            await producer.flush()
    assert node.data == [f"m{i}" for i in range(6)]


async def test_a_closed_producer_refuses_work() -> None:
    cluster = FakeCluster("a")
    with cluster.serving():
        producer = _producer(cluster)
        async with producer:
            await producer.publish("m0")
    with pytest.raises(Exception, match="closed"):
        await producer.send("m1")
    assert producer.status is Status.CLOSED


def test_fake_view_pattern_is_for_fake_hosts_only() -> None:
    assert re.match(r"^http://[a-z0-9]+\.test:1/cluster/nodes$", SEED + "/cluster/nodes")
