"""The client against real ``kapok serve`` processes joined by gossip: 30,000 publishes
spread uniformly over three masters and consumed exactly once; the same through
``kapok produce`` / ``kapok consume``; a master killed with SIGKILL while publishing
loses no confirmed message and duplicates none.

Counts are asserted; times are printed (``pytest -s``), never asserted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import pytest
from tests.chisquare import chi_square_uniform_p

from kapok.client import Consumer, Message, Producer
from kapok.errors import ConnectionLostError
from kapok.launch import NodeProcess, get_json, nodes_view, stop_all, wait_for
from kapok.local_cluster import plan_cluster, start_planned, start_plans
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

DEADLINE_S = scaled(30.0)
N = 30_000


def _all_alive(nodes: list[NodeProcess]) -> bool:
    """Every node sees every other alive and active (a node joins gossip before it takes
    its role, so "alive" alone can still show it passive)."""
    views = [nodes_view(n) for n in nodes]
    return all(
        len(v) == len(nodes) and all(r["state"] == "alive" and r.get("active") is True for r in v.values())
        for v in views
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    base = tmp_path_factory.mktemp("masters")
    nodes = start_plans(base, plan_cluster(3, slaves=False))
    try:
        wait_for(lambda: _all_alive(nodes), DEADLINE_S, 0.1)
        yield nodes
    finally:
        stop_all(nodes)


async def test_30000_publishes_spread_uniformly_and_are_consumed_exactly_once(
    cluster: list[NodeProcess],
) -> None:
    seeds = [cluster[0].url]
    names = sorted(nodes_view(cluster[0]))
    seen: dict[str, str] = {}  # payload -> code
    duplicates = 0
    started = time.monotonic()
    # A seeded balancer: the test checks a fixed draw, not its luck (p > 0.001 fails one run in 1,000).
    producer = Producer(seeds, topic="acc1", rng=random.Random(13))
    async with Consumer(seeds, topic="acc1", prefetch=1000) as consumer, producer:
        assert sorted(m.name for m in producer.view.values()) == names
        futures = [await producer.send(str(i)) for i in range(N)]
        await producer.flush()
        published_s = time.monotonic() - started
        codes = {f.result() for f in futures}
        while len(seen) < N:
            msg = await consumer.get(DEADLINE_S)
            if msg.text in seen:
                duplicates += 1
            seen[msg.text] = msg.code
            await msg.ack()
        with pytest.raises(TimeoutError):  # and nothing more comes
            await consumer.get(scaled(0.5))
    counts = [producer.stats.node(name).confirmed for name in names]
    p = chi_square_uniform_p(counts)
    print(f"\n30,000 publishes in {published_s:.2f} s, all consumed after {time.monotonic() - started:.2f} s;"
          f" per master {counts}, chi-square p = {p:.3f}")  # fmt: skip
    assert producer.stats.confirmed == N and len(codes) == N
    assert p > 0.001
    assert duplicates == 0 and set(seen) == {str(i) for i in range(N)} and set(seen.values()) == codes
    # The nodes agree with the producer on where each message went.
    assert [consumer.stats.node(name).received for name in names] == counts


def _kapok(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    return subprocess.run([sys.executable, "-m", "kapok", *args], input=stdin, capture_output=True, text=True,
                          timeout=scaled(120), env=env, check=False)  # fmt: skip


def test_the_same_through_kapok_produce_and_kapok_consume(cluster: list[NodeProcess]) -> None:
    lines = [f"line {i}" for i in range(3000)]
    seeds = [arg for node in cluster for arg in ("--seed", node.url)]
    produced = _kapok("produce", *seeds, "--topic", "acc1cli", stdin="\n".join(lines) + "\n")
    assert produced.returncode == 0, produced.stderr
    assert "sent 3000, confirmed 3000" in produced.stderr
    per_node = [int(line.rsplit(":", 1)[1]) for line in produced.stderr.splitlines() if line.startswith("  ")]
    p = chi_square_uniform_p(per_node)
    print(f"\nkapok produce: per master {per_node}, chi-square p = {p:.3f}")
    assert sum(per_node) == 3000 and len(per_node) == 3 and p > 0.001
    consumed = _kapok("consume", "--seed", cluster[1].url, "--topic", "acc1cli", "--count", "3000",
                      "--timeout", f"{scaled(20):g}")  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    out = consumed.stdout.splitlines()
    assert len(out) == 3000 and sorted(out) == sorted(lines)
    # Acked after the write: nothing is left for a second consumer.
    nothing_s = f"{scaled(0.5):g}"  # how long it waits for a message that must not come
    rest = _kapok("consume", "--seed", cluster[2].url, "--topic", "acc1cli", "--timeout", nothing_s)
    assert rest.returncode == 0 and rest.stdout == ""


class _Traffic:
    """A producer publishing ``total`` numbered messages and a consumer acking all it gets,
    with what each saw: the codes every payload arrived under, the node that delivered
    each, and deliveries per node after the kill."""

    def __init__(self, consumer: Consumer, producer: Producer, total: int) -> None:
        self.consumer, self.producer, self.total = consumer, producer, total
        self.received: dict[str, set[str]] = collections.defaultdict(set)  # payload -> codes
        self.origin: dict[str, str] = {}  # code -> the node that delivered it
        self.after_kill: collections.Counter[str] = collections.Counter()
        self.killed = False
        loop = asyncio.get_running_loop()
        self.reader = loop.create_task(self._consume())
        self.sender = loop.create_task(self._publish_all())

    async def _consume(self) -> None:
        while True:
            msg: Message = await self.consumer.get()
            self.received[msg.text].add(msg.code)
            self.origin.setdefault(msg.code, msg.node)
            if self.killed:
                self.after_kill[msg.node] += 1
            with contextlib.suppress(ConnectionLostError):  # its node died: it comes again
                await msg.ack()

    async def _publish_all(self) -> list[asyncio.Future[str]]:
        futures = []
        for i in range(self.total):
            futures.append(await self.producer.send(str(i)))
            if i % 200 == 0:
                await asyncio.sleep(0)  # confirmations come in while we publish
        return futures

    async def kill_when(self, victim: NodeProcess, name: str, confirmed: int) -> None:
        """SIGKILL ``victim`` once it has confirmed ``confirmed`` messages, mid-traffic."""
        deadline = time.monotonic() + DEADLINE_S
        while self.producer.stats.node(name).confirmed < confirmed:
            assert not self.sender.done() and time.monotonic() < deadline, "the kill would come too late"
            await asyncio.sleep(0.005)
        victim.kill()
        self.killed = True
        assert not self.sender.done()  # still publishing

    async def finish(self) -> dict[str, str]:
        """Every send confirmed, and every payload received; the confirmed code of each."""
        futures = await asyncio.wait_for(self.sender, scaled(120))
        await asyncio.wait_for(self.producer.flush(), scaled(120))
        failed = [f.exception() for f in futures if f.exception() is not None]
        assert not failed, failed[:3]
        confirmed = {str(i): f.result() for i, f in enumerate(futures)}
        deadline = time.monotonic() + scaled(60)
        while len(self.received) < self.total:
            assert time.monotonic() < deadline, f"{len(self.received)} of {self.total} received"
            await asyncio.sleep(0.05)
        self.reader.cancel()
        return confirmed

    def check(self, confirmed: dict[str, str]) -> None:
        """No confirmed message lost, and none delivered under a second code. (A node delivers
        a message only once its WAL record is durable, and with sync replication once its
        slave has it, so no node can have handed out a message that a resend then stored
        again under another code.)"""
        assert set(self.received) == set(confirmed)
        doubles = [(p, codes) for p, codes in self.received.items() if codes != {confirmed[p]}]
        assert not doubles, [(p, [(c, self.origin.get(c)) for c in codes]) for p, codes in doubles[:3]]


class Backoff(TypedDict):
    backoff_cap_s: float
    refresh_interval_s: float


FAST: Backoff = {"backoff_cap_s": 0.5, "refresh_interval_s": 0.5}


async def test_kill_9_a_master_while_publishing(tmp_path: Path) -> None:
    plans = plan_cluster(3, slaves=False)
    nodes = start_plans(tmp_path, plans)
    victim_plan = plans[1]
    try:
        wait_for(lambda: _all_alive(nodes), DEADLINE_S, 0.1)
        consumer = Consumer(nodes[0].url, topic="kill", **FAST)
        producer = Producer(
            nodes[0].url, topic="kill", in_doubt_wait_s=scaled(60.0), publish_timeout_s=scaled(90.0), **FAST
        )
        async with consumer, producer:
            traffic = _Traffic(consumer, producer, 40_000)
            await traffic.kill_when(nodes[1], victim_plan.name, 1000)
            # The consumer keeps receiving from the others meanwhile.
            deadline = time.monotonic() + DEADLINE_S
            while sum(n for name, n in traffic.after_kill.items() if name != victim_plan.name) < 1000:
                assert time.monotonic() < deadline, traffic.after_kill
                await asyncio.sleep(0.05)
            # The master comes back (same name, ports and data); batches in doubt go back to it.
            nodes[1] = await asyncio.to_thread(start_planned, tmp_path, victim_plan, plans)
            confirmed = await traffic.finish()
        print(f"\nkill -9 {victim_plan.name}: retried {producer.stats.retried}, received after the kill "
              f"{dict(traffic.after_kill)}")  # fmt: skip
        assert producer.stats.node(victim_plan.name).failures >= 1
        traffic.check(confirmed)
    finally:
        stop_all(nodes)


async def test_the_client_follows_a_takeover_to_the_slave(tmp_path: Path) -> None:
    """kill -9 a master that has a slave: the consumer moves to the slave once it takes over
    and gets what the master had not delivered; the producer's batches in doubt go to that
    pair first (a batch the slave already holds is answered with its codes: the slave keeps
    the master's duplicate filter; sync replication refuses anything new while its partner
    is gone, and such a batch goes elsewhere), so nothing confirmed is lost or doubled."""
    plans = plan_cluster(2, slaves=True)  # m1, m2 and their slaves s1, s2 (sync replication)
    nodes = start_plans(tmp_path, plans)
    by_name = {plan.name: node for plan, node in zip(plans, nodes, strict=True)}
    try:
        wait_for(lambda: all(_paired(by_name[m].url) for m in ("m1", "m2")), DEADLINE_S, 0.1)
        consumer = Consumer(by_name["m2"].url, topic="takeover", **FAST)
        producer = Producer(  # in doubt: wait for the pair longer than a takeover takes (3 s)
            by_name["m2"].url,
            topic="takeover",
            in_doubt_wait_s=scaled(15.0),
            publish_timeout_s=scaled(90.0),
            **FAST,
        )
        async with consumer, producer:
            traffic = _Traffic(consumer, producer, 20_000)
            await traffic.kill_when(by_name["m1"], "m1", 1000)
            confirmed = await traffic.finish()
        print(f"\nkill -9 m1: received after the kill {dict(traffic.after_kill)}")
        assert traffic.after_kill["s1"] > 0  # the slave delivered once it took over
        traffic.check(confirmed)
    finally:
        stop_all(nodes)


def _paired(url: str) -> bool:
    state = get_json(url, "/replication/state", key="test") or {}
    return bool(state.get("link_up")) and state.get("role") == "leader"
