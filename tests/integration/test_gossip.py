"""The gossip driver over real UDP and TCP on 127.0.0.1, several nodes in one event loop; and
its transport seam: a node whose network is cut (``FaultyTransport``) is suspected, dead, and
alive again after the heal."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kapok.cluster.messages import MemberChanged, NodeMeta, State
from kapok.cluster.node import GossipNode, split_addr
from kapok.cluster.transport import Transport
from kapok.config import ClusterConfig, load_config
from kapok.launch import cluster_sets
from kapok.node.app import make_app
from kapok.server.keys import GOSSIP
from kapok.testing import eventually
from kapok.testing.faults import FaultyTransport
from kapok.testing.slow import scaled

pytestmark = pytest.mark.timeout(60)

T = scaled(10.0)  # upper bound of every wait
CUT_T = scaled(30.0)  # ... of a wait across a cut (dead takes suspicion timeouts, alive a reconnect round)


def make_node(
    name: str,
    seeds: tuple[str, ...] = (),
    secret: tuple[str, ...] = ("k1",),
    transport: Transport | None = None,
) -> GossipNode:
    config = ClusterConfig(enabled=True, bind="127.0.0.1:0", seeds=seeds, secret=secret, profile="fast")
    meta = NodeMeta(name, http_url=f"http://127.0.0.1/{name}", version="test")
    return GossipNode(config, meta, transport=transport, rng=random.Random(name))


def states(node: GossipNode) -> dict[str, State]:
    return {m.name: m.state for m in node.members()}


@pytest.fixture
async def nodes() -> AsyncIterator[list[GossipNode]]:
    started: list[GossipNode] = []
    yield started
    for node in started:
        await node.aclose()


async def start(nodes: list[GossipNode], node: GossipNode) -> GossipNode:
    await node.start()
    nodes.append(node)
    return node


async def test_nodes_join_through_a_seed_and_see_a_leave(nodes: list[GossipNode]) -> None:
    a = await start(nodes, make_node("a"))
    changes: list[MemberChanged] = []
    a.add_listener(changes.append)
    b = await start(nodes, make_node("b", seeds=(a.addr,)))
    c = await start(nodes, make_node("c", seeds=(b.addr,)))
    everyone = {"a": State.ALIVE, "b": State.ALIVE, "c": State.ALIVE}
    await eventually(lambda: all(states(n) == everyone for n in (a, b, c)), timeout_s=T)
    assert a.members()[2].meta == c.meta and a.members()[2].addr == c.addr

    nodes.remove(c)
    await c.aclose()
    await eventually(lambda: states(a)["c"] is State.LEFT and states(b)["c"] is State.LEFT, timeout_s=T)
    assert [(ch.name, ch.state) for ch in changes if ch.name == "c"][-1] == ("c", State.LEFT)
    assert a.swim is not None and a.swim.stats["streams_out"] + a.swim.stats["push_pulls_in"] > 0


async def test_metadata_updates_spread(nodes: list[GossipNode]) -> None:
    a = await start(nodes, make_node("a"))
    b = await start(nodes, make_node("b", seeds=(a.addr,)))
    await eventually(lambda: len(states(a)) == 2, timeout_s=T)
    b.set_meta(NodeMeta("b", http_url="http://127.0.0.1/b", role="slave", pair="a", load=3.0))
    await eventually(lambda: {m.name: m.meta.role for m in a.members()}["b"] == "slave", timeout_s=T)
    row = {m.name: m for m in a.members()}["b"]
    assert row.meta.pair == "a" and row.meta.load == 3.0 and row.incarnation >= 1


async def test_a_wrong_key_is_dropped_and_counted(nodes: list[GossipNode]) -> None:
    a = await start(nodes, make_node("a", secret=("k1",)))
    stranger = await start(nodes, make_node("x", seeds=(a.addr,), secret=("other",)))
    assert a.swim is not None
    swim = a.swim
    await eventually(lambda: sum(n for k, n in swim.stats.items() if k.startswith("drop_")) >= 2, timeout_s=T)
    assert set(states(a)) == {"a"} and set(states(stranger)) == {"x"}


async def test_garbage_datagrams_and_streams_are_counted_and_the_node_keeps_working(
    nodes: list[GossipNode],
) -> None:
    a = await start(nodes, make_node("a"))
    host, port = split_addr(a.addr)
    loop = asyncio.get_running_loop()
    udp, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, remote_addr=(host, port))
    for junk in (b"\x00", b"x" * 2000, bytes(range(256)) * 5):
        udp.sendto(junk)
    udp.close()
    streams = [
        b"\x00\x00",  # cut inside the length
        struct.pack(">I", 100) + b"short",  # cut inside the body
        struct.pack(">I", 2**31),  # over the stream limit
        struct.pack(">I", 5) + b"junk!",  # complete, but not a signed blob
    ]
    for blob in streams:
        _, writer = await asyncio.open_connection(host, port)
        writer.write(blob)
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    assert a.swim is not None
    swim = a.swim
    await eventually(
        lambda: (
            sum(n for k, n in swim.stats.items() if k.startswith("drop_")) >= 4  # 3 datagrams, 1 stream
            and a.stats["stream_errors_in"] >= 2
            and a.stats["streams_too_large"] == 1
        ),
        timeout_s=T,
        what=f"drops and stream errors counted: {swim.stats} {a.stats}",
    )
    b = await start(nodes, make_node("b", seeds=(a.addr,)))
    await eventually(lambda: states(a) == {"a": State.ALIVE, "b": State.ALIVE} == states(b), timeout_s=T)


async def test_close_ends_the_streams_it_is_reading_without_cancelling_their_handlers() -> None:
    node = make_node("a")
    await node.start()
    host, port = split_addr(node.addr)
    others = asyncio.all_tasks()  # the handlers are the tasks that come on top of these

    def handlers() -> list[asyncio.Task[object]]:
        return [task for task in asyncio.all_tasks() - others if not task.done()]

    peers = [await asyncio.open_connection(host, port) for _ in range(3)]
    try:
        for _, writer in peers:
            writer.write(b"\x00\x00")  # half a length: the node's handler waits for the rest
            await writer.drain()
        await eventually(lambda: len(handlers()) == 3, timeout_s=T, what="the node serves the three streams")
        running, before = handlers(), node.stats["stream_errors_in"]
    finally:
        await node.aclose()
        for _, writer in peers:
            writer.close()
    # Every handler has ended on the cut connection (an incomplete read), not by a cancel:
    # nothing is left for the event loop's teardown to cancel.
    assert handlers() == [] and not any(task.cancelled() for task in running)
    assert node.stats["stream_errors_in"] == before + 3


async def test_unreachable_seed_and_peers_cost_only_counters(nodes: list[GossipNode]) -> None:
    a = await start(nodes, make_node("a", seeds=("127.0.0.1:9",)))  # nothing listens on port 9
    await eventually(lambda: a.stats["stream_errors_out"] >= 1, timeout_s=T)
    assert set(states(a)) == {"a"}


async def test_nodes_serve_the_gossip_view_and_the_kapokmq_node_lists(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    unused_tcp_port_factory: Callable[[], int],
    tmp_path: Path,
) -> None:
    async def node(name: str, *sets: str) -> tuple[int, web.Application]:
        port = unused_tcp_port_factory()
        sets = (f"storage.dir={tmp_path / name}", f"server.port={port}", *cluster_sets("fast"), *sets)
        config = load_config(None, overrides=sets, env={})
        app = make_app(config)
        await aiohttp_server(app, host="127.0.0.1", port=port)
        return port, app

    port_a, app_a = await node("a")
    seed = app_a[GOSSIP].addr
    port_b, app_b = await node(
        "b", f"cluster.seeds=[{seed}]", "replication.role=slave", "replication.master=http://127.0.0.1:1"
    )
    await eventually(lambda: len(app_a[GOSSIP].members()) == 2 == len(app_b[GOSSIP].members()), timeout_s=T)

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port_a}/cluster/nodes") as resp:
            rows = {row["name"]: row for row in await resp.json()}
        b = rows[f"127.0.0.1:{port_b}"]
        assert b["http_url"] == f"http://127.0.0.1:{port_b}" and b["role"] == "slave"
        assert b["state"] == "alive" and b["gossip_addr"] == app_b[GOSSIP].addr and b["self"] is False
        assert rows[f"127.0.0.1:{port_a}"]["self"] is True
        headers = {"secretKey": "test"}
        async with http.post(f"http://127.0.0.1:{port_b}/Registry/GetNodes", headers=headers) as resp:
            assert await resp.json(content_type=None) == [
                {"Name": f"mq:127.0.0.1:{port_a}", "Addr": "127.0.0.1", "Port": str(port_a)}
            ]  # masters only: the producer must not send to a standing-by slave
        async with http.post(f"http://127.0.0.1:{port_b}/Console/GetNodes", headers=headers) as resp:
            assert {n["Port"] for n in await resp.json(content_type=None)} == {str(port_a), str(port_b)}
        async with http.get(f"http://127.0.0.1:{port_a}/metrics") as resp:
            text = await resp.text()
        assert 'kapok_cluster_members{state="alive"} 2.0' in text
        assert "kapok_gossip_events_total" in text


# ---------------------------------------------------------------- the transport seam


@pytest.mark.timeout(90)
async def test_a_cut_node_is_suspected_then_dead_and_alive_again_after_the_heal(
    nodes: list[GossipNode],
) -> None:
    a = await start(nodes, make_node("a"))
    faulty = FaultyTransport()
    b = await start(nodes, make_node("b", seeds=(a.addr,), transport=faulty))

    def both_alive() -> bool:
        return states(a).get("b") is State.ALIVE and states(b).get("a") is State.ALIVE

    await eventually(both_alive, timeout_s=CUT_T, what="a and b see each other alive")
    seen: list[State] = []
    a.add_listener(lambda change: seen.append(change.state) if change.name == "b" else None)

    faulty.isolated = True
    await eventually(lambda: states(a).get("b") is State.DEAD, timeout_s=CUT_T, what="a sees b dead")
    assert State.SUSPECT in seen  # suspected first, then dead
    assert faulty.dropped > 0
    assert states(b).get("a") in (State.SUSPECT, State.DEAD)  # cut both ways: b heard nothing either

    faulty.isolated = False
    await eventually(both_alive, timeout_s=CUT_T, what="a and b see each other alive after the heal")


@pytest.mark.timeout(90)
async def test_a_cut_transport_refuses_streams_both_ways(nodes: list[GossipNode]) -> None:
    faulty = FaultyTransport()
    a = await start(nodes, make_node("a", transport=faulty))
    faulty.isolated = True
    b = await start(nodes, make_node("b", seeds=(a.addr,)))
    # b's join is a state exchange over TCP: a refuses it, and what a sends is refused too.
    await eventually(lambda: faulty.refused > 0, timeout_s=CUT_T, what="a stream refused")
    assert "a" not in states(b) and "b" not in states(a)
    faulty.isolated = False
    await eventually(
        lambda: states(a).get("b") is State.ALIVE and states(b).get("a") is State.ALIVE,
        timeout_s=CUT_T,
        what="b joins once a is reachable",
    )
