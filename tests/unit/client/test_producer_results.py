"""The producer's per-message results, deadlines, cancellation, key order through a
takeover and p2c's own measurements, over the fake transport."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import pytest
from tests.unit.client.fakes import SEED, FakeCluster

from kapok.client import Producer
from kapok.errors import (
    ClientClosedError,
    ClientError,
    ClusterUnavailableError,
    PublishTimeoutError,
    QueueFullError,
    UnavailableError,
)
from kapok.testing.slow import scaled

FAST: dict[str, Any] = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "refresh_interval_s": 0.1}


def _producer(cluster: FakeCluster, **options: Any) -> Producer:
    return Producer([SEED], topic="t", connector=cluster.connect, **{**FAST, **options})


async def test_a_batch_refused_as_full_confirms_what_fits_and_fails_the_rest_each() -> None:
    cluster = FakeCluster("a")
    cluster.nodes["a"].max_length = 5
    with cluster.serving():
        async with _producer(cluster) as producer:
            futures = [await producer.send(f"m{i}") for i in range(8)]
            await producer.flush()
    outcomes = [f.exception() or f.result() for f in futures]
    assert all(isinstance(o, str) for o in outcomes[:5])
    assert all(isinstance(o, QueueFullError) for o in outcomes[5:])
    assert cluster.nodes["a"].data == [f"m{i}" for i in range(5)]
    assert (producer.stats.confirmed, producer.stats.failed) == (5, 3)


async def test_a_node_whose_disk_is_full_is_left_for_another_and_nothing_fails() -> None:
    cluster = FakeCluster("a", "b")
    cluster.nodes["a"].disk_full = True
    with cluster.serving():
        async with _producer(cluster, batch_size=10) as producer:
            futures = [await producer.send(f"m{i}") for i in range(200)]
            await asyncio.wait_for(producer.flush(), scaled(5))
    assert all(f.exception() is None for f in futures)
    assert not cluster.nodes["a"].data
    assert sorted(cluster.nodes["b"].data) == sorted(f"m{i}" for i in range(200))
    assert producer.stats.node("a").failures >= 1


async def test_a_rate_limited_batch_is_retried_in_order_until_stored() -> None:
    cluster = FakeCluster("a")
    node = cluster.nodes["a"]
    node.tokens = 20  # fewer than one batch of 100: refused whole, every time, on the old producer

    async def refill() -> None:
        while True:
            await asyncio.sleep(0.02)
            node.tokens = min((node.tokens or 0) + 10, 20)

    with cluster.serving():
        refiller = asyncio.create_task(refill())
        try:
            async with _producer(cluster, publish_timeout_s=scaled(20.0)) as producer:
                futures = [await producer.send(f"m{i}") for i in range(100)]
                await producer.flush()
        finally:
            refiller.cancel()
    assert all(f.exception() is None for f in futures)
    assert node.data == [f"m{i}" for i in range(100)]


async def test_a_node_that_never_answers_fails_the_publish_at_its_deadline() -> None:
    cluster = FakeCluster("a")
    cluster.nodes["a"].silent = True
    with cluster.serving():
        async with _producer(cluster, publish_timeout_s=0.5) as producer:
            started = time.monotonic()
            with pytest.raises(PublishTimeoutError, match="did not answer") as caught:
                await producer.publish("x")
            took = time.monotonic() - started
    assert isinstance(caught.value, UnavailableError)
    assert took < 0.5 + scaled(1.0)


async def test_cancelling_inside_async_with_returns_at_once() -> None:
    cluster = FakeCluster("a")
    cluster.nodes["a"].silent = True
    futures: list[asyncio.Future[str]] = []
    sent = asyncio.Event()
    with cluster.serving():

        async def work() -> None:
            async with _producer(cluster, publish_timeout_s=30.0) as producer:
                futures.append(await producer.send("x"))
                sent.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(work())
        await asyncio.wait_for(sent.wait(), scaled(5.0))
        await asyncio.sleep(0.05)  # the batch is written, unanswered
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        took = time.monotonic() - started
    assert took < scaled(1.0)
    assert isinstance(futures[0].exception(), ClientClosedError)


async def test_drain_waits_for_confirmations_and_close_does_not() -> None:
    cluster = FakeCluster("a")
    cluster.nodes["a"].delay_s = 0.2
    with cluster.serving():
        producer = await _producer(cluster).start()
        drained = [await producer.send(f"d{i}") for i in range(3)]
        await producer.drain()
        assert all(isinstance(f.result(), str) for f in drained)
        producer = await _producer(cluster).start()
        closed = [await producer.send(f"c{i}") for i in range(3)]
        await asyncio.sleep(0.05)
        await producer.close()
        assert all(isinstance(f.exception(), ClientClosedError) for f in closed)


async def test_keys_wait_for_their_pair_through_a_takeover_and_keep_their_order() -> None:
    cluster = FakeCluster("a", "b", "sa")
    a, slave = cluster.nodes["a"], cluster.nodes["sa"]
    slave.passive = True
    slave.view = {"role": "slave", "active": False, "pair": "a"}
    keys = [f"k{i}" for i in range(12)]
    sent: dict[str, list[str]] = collections.defaultdict(list)
    with cluster.serving():
        async with _producer(cluster, balance="key", publish_timeout_s=scaled(20.0)) as producer:
            futures = []
            for step in range(60):
                if step == 20:  # the master dies; its slave is alive but not yet active
                    a.refuse = True
                    a.view = {"state": "dead"}
                    await asyncio.sleep(0.3)  # several view refreshes while the pair fails over
                if step == 40:
                    slave.take_over_from(a)
                for key in keys:
                    data = f"{key}:{step}"
                    sent[key].append(data)
                    futures.append(await producer.send(data, key=key))
                await asyncio.sleep(0.01)
            await producer.flush()
    assert all(f.exception() is None for f in futures)
    by_pair = {"a": slave.data, "b": cluster.nodes["b"].data}  # the slave holds its master's log
    for key in keys:
        homes = [pair for pair, data in by_pair.items() if any(d.startswith(f"{key}:") for d in data)]
        assert len(homes) == 1, (key, homes)
        stored = [d for d in by_pair[homes[0]] if d.startswith(f"{key}:")]
        assert stored == sent[key]


@pytest.mark.parametrize("slow_b", [0.0, 0.02])
async def test_p2c_spreads_by_what_the_producer_measures(slow_b: float) -> None:
    cluster = FakeCluster("a", "b", "c")
    for node in cluster.nodes.values():
        node.delay_s = 0.002
    cluster.nodes["b"].delay_s += slow_b
    with cluster.serving():
        async with _producer(cluster, balance="p2c", batch_size=10, max_pending=200) as producer:
            for i in range(3000):
                await producer.send(f"m{i}")
            await producer.flush()
    shares = {n: len(node.data) / 3000 for n, node in cluster.nodes.items()}
    if slow_b:
        assert shares["b"] < 0.2, shares
    else:
        assert all(0.28 < share < 0.39 for share in shares.values()), shares


@pytest.mark.parametrize("seed", ["127.0.0.1:8011", "", "ws://127.0.0.1:8011"])
def test_a_bad_seed_fails_when_the_client_is_made_before_anything_opens(seed: str) -> None:
    with pytest.raises(ValueError, match="seed"):
        Producer(seed, topic="t")


async def test_lifecycle_callbacks_follow_a_lost_and_regained_connection() -> None:
    cluster = FakeCluster("a")
    events: list[str] = []
    with cluster.serving():
        down, up = (lambda: events.append("down")), (lambda: events.append("up"))
        async with _producer(cluster, on_disconnected=down, on_reconnected=up) as producer:
            await producer.publish("first")
            cluster.nodes["a"].break_after_store = 1  # the next batch is stored, its answer lost
            await producer.publish("second")  # resent on a new connection, stored once
    assert events == ["down", "up"]
    assert cluster.nodes["a"].data == ["first", "second"]


def test_the_clients_own_unavailability_errors_are_client_errors_too() -> None:
    for cls in (PublishTimeoutError, ClusterUnavailableError):
        assert issubclass(cls, ClientError) and issubclass(cls, UnavailableError)
