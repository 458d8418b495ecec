"""The consumer's bounded buffer over a fake transport: what fits is handed out, what does
not is given back (manual ack) or dropped (auto ack) with an explicit SlowConsumerError."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.unit.client.fakes import SEED, FakeCluster, FakeSession

from kapok.client import Consumer, Status
from kapok.errors import ConnectionLostError, SlowConsumerError, UnknownCodeError, UnsupportedError
from kapok.testing.slow import scaled

FAST = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "refresh_interval_s": 0.1}


def _consumer(cluster: FakeCluster, **options: Any) -> Consumer:
    return Consumer([SEED], topic="t", connector=cluster.connect, **{**FAST, **options})


def _session(cluster: FakeCluster, name: str = "a") -> FakeSession:
    return cluster.nodes[name].sessions[-1]


async def test_subscribes_on_every_active_pair_and_merges_their_pushes() -> None:
    cluster = FakeCluster("a", "b", "c")
    with cluster.serving():
        async with _consumer(cluster) as consumer:
            assert consumer.status is Status.CONNECTED
            for name in "abc":
                _session(cluster, name).push(f"{name}1", f"{name}2")
            got = [await consumer.get(1) for _ in range(6)]
            assert sorted(m.code for m in got) == ["a1", "a2", "b1", "b2", "c1", "c2"]
            assert {m.node for m in got} == {"a", "b", "c"}
            for m in got:
                await m.ack()
            await asyncio.sleep(0)
            assert _session(cluster, "b").settled == [("ack", ["b1"], True), ("ack", ["b2"], True)]
            assert consumer.stats.received == 6 and consumer.stats.node("c").received == 2


async def test_manual_mode_requeues_what_does_not_fit_and_says_so() -> None:
    cluster = FakeCluster("a")
    with cluster.serving():
        async with _consumer(cluster, max_buffered=3) as consumer:
            session = _session(cluster)
            session.push("c1", "c2", "c3", "c4", "c5")
            assert consumer.buffered == 3
            assert session.settled == [("nack", ["c4", "c5"], True)]  # back to the node, not lost
            with pytest.raises(SlowConsumerError, match="2 message"):
                await consumer.get(1)
            assert [(await consumer.get(1)).code for _ in range(3)] == ["c1", "c2", "c3"]  # then goes on
            assert consumer.stats.dropped == 2


async def test_the_byte_limit_counts_too_and_one_large_message_still_fits_an_empty_buffer() -> None:
    cluster = FakeCluster("a")
    reports: list[Exception] = []
    with cluster.serving():
        async with _consumer(cluster, max_buffered_bytes=25, on_error=reports.append) as consumer:
            session = _session(cluster)
            session.push("big", size=100)
            session.push("s1", "s2", "s3", size=10)
            assert [(await consumer.get(1)).code for _ in range(1)] == ["big"]
            session.push("s4", "s5", "s6", size=10)
            assert consumer.buffered == 2
    assert len(reports) == 2 and all(isinstance(r, SlowConsumerError) for r in reports)


async def test_auto_ack_mode_drops_what_does_not_fit() -> None:
    cluster = FakeCluster("a")
    reports: list[Exception] = []
    with cluster.serving():
        async with _consumer(cluster, ack="auto", max_buffered=2, on_error=reports.append) as consumer:
            session = _session(cluster)
            session.push("c1", "c2", "c3")
            assert session.settled == [] and consumer.stats.dropped == 1
            msg = await consumer.get(1)
            await msg.ack()  # a no-op: settled by the node already
            with pytest.raises(UnsupportedError):
                await msg.nack()
    assert "dropped" in str(reports[0])


async def test_a_lost_connection_discards_its_buffered_messages_and_reconnects() -> None:
    cluster = FakeCluster("a", "b")
    with cluster.serving():
        async with _consumer(cluster) as consumer:
            first = _session(cluster, "a")
            first.push("a1", "a2")
            _session(cluster, "b").push("b1")
            taken = await consumer.get(1)
            await first.close()  # the node went away
            await asyncio.sleep(0)
            codes = {(await consumer.get(1)).code for _ in range(consumer.buffered)}
            assert "a2" not in codes and "a1" not in codes  # redelivered by the node, not by us
            if taken.node == "a":
                with pytest.raises(ConnectionLostError):
                    await taken.ack()
            for _ in range(round(scaled(200))):  # the feed subscribes again, after a short backoff
                if len(cluster.nodes["a"].sessions) == 2:
                    break
                await asyncio.sleep(0.01)
            assert len(cluster.nodes["a"].sessions) == 2
            _session(cluster, "a").push("a3")
            assert (await consumer.get(1)).code == "a3"


async def test_settling_twice_is_an_error_and_iteration_ends_on_close() -> None:
    cluster = FakeCluster("a")
    with cluster.serving():
        consumer = _consumer(cluster)
        async with consumer:
            _session(cluster).push("c1")
            msg = await consumer.get(1)
            await msg.touch()
            await msg.nack(requeue=False)
            with pytest.raises(UnknownCodeError):
                await msg.ack()
            with pytest.raises(TimeoutError):
                await consumer.get(0.05)
        assert [m async for m in consumer] == []
    assert _session(cluster).settled == [("touch", ["c1"], True), ("nack", ["c1"], False)]
