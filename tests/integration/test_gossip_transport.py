"""The gossip transport seam: a node whose network is cut (``FaultyTransport``) is suspected,
then declared dead, by its peer, and is alive again once the cut heals — over real UDP and
TCP on 127.0.0.1, both nodes in the test's event loop."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from kapok.cluster.messages import NodeMeta, State
from kapok.cluster.node import GossipNode
from kapok.cluster.transport import Transport
from kapok.config import ClusterConfig
from kapok.testing import eventually
from kapok.testing.faults import FaultyTransport

pytestmark = pytest.mark.timeout(90)

T = 30.0  # upper bound of every wait (dead takes suspicion timeouts, alive a reconnect round)


def make_node(name: str, seeds: tuple[str, ...] = (), transport: Transport | None = None) -> GossipNode:
    config = ClusterConfig(enabled=True, bind="127.0.0.1:0", seeds=seeds, secret=("k1",), profile="fast")
    meta = NodeMeta(name, http_url=f"http://127.0.0.1/{name}", version="test")
    return GossipNode(config, meta, transport=transport, rng=random.Random(name))


def state_of(node: GossipNode, name: str) -> State | None:
    return {m.name: m.state for m in node.members()}.get(name)


@pytest.fixture
async def nodes() -> AsyncIterator[list[GossipNode]]:
    started: list[GossipNode] = []
    yield started
    for node in started:
        await node.aclose()


async def test_a_cut_node_is_suspected_then_dead_and_alive_again_after_the_heal(
    nodes: list[GossipNode],
) -> None:
    a = make_node("a")
    await a.start()
    nodes.append(a)
    faulty = FaultyTransport()
    b = make_node("b", seeds=(a.addr,), transport=faulty)
    await b.start()
    nodes.append(b)
    await eventually(
        lambda: state_of(a, "b") is State.ALIVE and state_of(b, "a") is State.ALIVE,
        timeout_s=T,
        what="a and b see each other alive",
    )
    seen: list[State] = []
    a.add_listener(lambda change: seen.append(change.state) if change.name == "b" else None)

    faulty.isolated = True
    await eventually(lambda: state_of(a, "b") is State.DEAD, timeout_s=T, what="a sees b dead")
    assert State.SUSPECT in seen  # suspected first, then dead
    assert faulty.dropped > 0
    assert state_of(b, "a") in (State.SUSPECT, State.DEAD)  # cut both ways: b heard nothing either

    faulty.isolated = False
    await eventually(
        lambda: state_of(a, "b") is State.ALIVE and state_of(b, "a") is State.ALIVE,
        timeout_s=T,
        what="a and b see each other alive after the heal",
    )


async def test_a_cut_transport_refuses_streams_both_ways(nodes: list[GossipNode]) -> None:
    faulty = FaultyTransport()
    a = make_node("a", transport=faulty)
    await a.start()
    nodes.append(a)
    faulty.isolated = True
    b = make_node("b", seeds=(a.addr,))
    await b.start()
    nodes.append(b)
    # b's join is a state exchange over TCP: a refuses it, and what a sends is refused too.
    await eventually(lambda: faulty.refused > 0, timeout_s=T, what="a stream refused")
    assert state_of(b, "a") is None and state_of(a, "b") is None
    faulty.isolated = False
    await eventually(
        lambda: state_of(a, "b") is State.ALIVE and state_of(b, "a") is State.ALIVE,
        timeout_s=T,
        what="b joins once a is reachable",
    )
