"""Gossip misconfiguration is logged, not silent: real UDP and TCP on 127.0.0.1, one event loop.

A peer with another ``cluster.secret`` is named in a rate-limited WARNING by whoever drops
its packets; a node that hears from none of its seeds says so. A node with the wrong secret
is never listed by the others (so never as ``left``, which only a graceful leave gives).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kapok.cluster.codec import Codec, KeyRing
from kapok.cluster.messages import MemberChanged, NodeMeta, Ping, State
from kapok.cluster.node import GossipNode, format_addr, split_addr
from kapok.config import ClusterConfig
from kapok.testing import eventually
from kapok.testing.slow import scaled

pytestmark = pytest.mark.timeout(60)

T = scaled(10.0)  # upper bound of every wait
FORGED = Codec(KeyRing([b"not-the-cluster-secret"])).encode([Ping(1, "a", "x")])
BAD_HMAC = "dropped gossip from {}: bad HMAC — wrong cluster.secret? ({} dropped so far)"


def make_node(
    name: str,
    seeds: tuple[str, ...] = (),
    secret: tuple[str, ...] = ("k1",),
    bind: str = "127.0.0.1:0",
    **kwargs: Any,
) -> GossipNode:
    config = ClusterConfig(enabled=True, bind=bind, seeds=seeds, secret=secret, profile="fast")
    meta = NodeMeta(name, http_url=f"http://127.0.0.1/{name}", version="test")
    return GossipNode(config, meta, rng=random.Random(name), **kwargs)


def states(node: GossipNode) -> dict[str, State]:
    return {m.name: m.state for m in node.members()}


def free_addr() -> str:
    """A port nothing listens on now (the OS does not hand it out again right away)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return format_addr("127.0.0.1", s.getsockname()[1])


def logged(caplog: pytest.LogCaptureFixture, level: int, pattern: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "kapok.cluster" and r.levelno == level and re.search(pattern, r.getMessage())
    ]


def bad_hmac_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return logged(caplog, logging.WARNING, "bad HMAC")


@pytest.fixture
async def nodes(caplog: pytest.LogCaptureFixture) -> AsyncIterator[list[GossipNode]]:
    caplog.set_level(logging.INFO, logger="kapok.cluster")
    started: list[GossipNode] = []
    yield started
    for node in started:
        await node.aclose()


async def start(nodes: list[GossipNode], node: GossipNode) -> GossipNode:
    await node.start()
    nodes.append(node)
    return node


async def udp_sender(to: str) -> tuple[asyncio.DatagramTransport, str]:
    loop = asyncio.get_running_loop()
    udp, _ = await loop.create_datagram_endpoint(
        asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0), remote_addr=split_addr(to)
    )
    host, port = udp.get_extra_info("sockname")[:2]
    return udp, format_addr(host, port)


async def test_bad_hmac_datagrams_are_named_once_a_minute_per_sender(
    nodes: list[GossipNode], caplog: pytest.LogCaptureFixture
) -> None:
    a = await start(nodes, make_node("a"))
    assert a.swim is not None
    swim = a.swim
    senders = [await udp_sender(a.addr) for _ in range(2)]
    try:

        def send_more() -> bool:  # datagrams may be lost: send until enough have arrived
            for udp, _ in senders:
                udp.sendto(FORGED)
            return swim.auth_drops >= 20

        await eventually(send_more, timeout_s=T, what=f"20 forged datagrams dropped: {swim.stats}")
    finally:
        for udp, _ in senders:
            udp.close()
    # Each sender named once, at its first drop; the rest stay within the minute.
    assert sorted(bad_hmac_warnings(caplog)) == sorted(BAD_HMAC.format(addr, 1) for _, addr in senders)
    assert swim.stats["drop_auth"] == swim.auth_drops  # the counter is kept


async def test_the_same_sender_is_named_again_once_the_interval_has_passed(
    nodes: list[GossipNode], caplog: pytest.LogCaptureFixture
) -> None:
    a = await start(nodes, make_node("a", drop_warning_interval_s=0.3))
    assert a.swim is not None
    swim = a.swim
    udp, sender = await udp_sender(a.addr)
    try:

        def send_more() -> list[str]:
            udp.sendto(FORGED)
            return bad_hmac_warnings(caplog)[1:]

        await eventually(send_more, timeout_s=T, what="a second warning about the same sender")
    finally:
        udp.close()
    first, second = bad_hmac_warnings(caplog)[:2]
    assert first == BAD_HMAC.format(sender, 1)
    match = re.fullmatch(re.escape(BAD_HMAC.format(sender, "@")).replace("@", r"(\d+)"), second)
    assert match is not None, second
    assert 1 < int(match[1]) <= swim.auth_drops  # the ones dropped in between were counted


async def test_bad_hmac_streams_are_named_by_host(
    nodes: list[GossipNode], caplog: pytest.LogCaptureFixture
) -> None:
    a = await start(nodes, make_node("a"))
    assert a.swim is not None
    swim = a.swim
    for _ in range(3):  # each from another ephemeral port: still one sender, the host
        _, writer = await asyncio.open_connection(*split_addr(a.addr))
        writer.write(struct.pack(">I", len(FORGED)) + FORGED)
        await writer.drain()
        writer.close()
        await writer.wait_closed()
    await eventually(lambda: swim.auth_drops >= 3, timeout_s=T, what=f"3 streams dropped: {swim.stats}")
    assert bad_hmac_warnings(caplog) == [BAD_HMAC.format("127.0.0.1 (TCP)", 1)]


async def test_a_node_whose_seeds_are_down_warns_and_says_when_one_answers(
    nodes: list[GossipNode], caplog: pytest.LogCaptureFixture
) -> None:
    down, later = free_addr(), free_addr()
    b = await start(nodes, make_node("b", seeds=(down, later), seed_silence_s=0.3))
    silent = (
        rf"^no seed answered in [\d.]+ s: {re.escape(down)}, {re.escape(later)} — "
        r"are they up, and is cluster\.secret the same\?$"
    )
    await eventually(lambda: logged(caplog, logging.WARNING, silent), timeout_s=T, what="the seeds warning")

    await start(nodes, make_node("a", bind=later))
    heard = r"^heard from the cluster after [\d.]+ s: a \(127\.0\.0\.1:\d+\) is alive$"
    await eventually(lambda: logged(caplog, logging.INFO, heard), timeout_s=T, what="the INFO line")
    assert states(b) == {"a": State.ALIVE, "b": State.ALIVE}
    assert len(logged(caplog, logging.WARNING, silent)) == 1  # repeated only every few minutes
    assert len(logged(caplog, logging.INFO, heard)) == 1


async def test_a_node_with_the_wrong_secret_is_named_by_its_seeds_and_never_listed(
    nodes: list[GossipNode], caplog: pytest.LogCaptureFixture
) -> None:
    a = await start(nodes, make_node("a"))
    b = await start(nodes, make_node("b", seeds=(a.addr,)))
    changes: list[MemberChanged] = []
    a.add_listener(changes.append)
    b.add_listener(changes.append)
    await eventually(lambda: states(a) == {"a": State.ALIVE, "b": State.ALIVE} == states(b), timeout_s=T)

    x = await start(nodes, make_node("x", seeds=(a.addr, b.addr), secret=("k2",), seed_silence_s=0.5))
    assert a.swim is not None and b.swim is not None
    swim_a, swim_b = a.swim, b.swim
    silent = rf"^no seed answered in [\d.]+ s: {re.escape(a.addr)}, {re.escape(b.addr)} — "
    # x keeps retrying its join: both seeds drop it again and again.
    await eventually(
        lambda: logged(caplog, logging.WARNING, silent) and min(swim_a.auth_drops, swim_b.auth_drops) >= 3,
        timeout_s=T,
        what="x's seeds warning and its repeated joins dropped by both seeds",
    )
    # Each seed names it once (its join streams come from ephemeral ports: by host).
    assert bad_hmac_warnings(caplog) == [BAD_HMAC.format("127.0.0.1 (TCP)", 1)] * 2
    assert [c for c in changes if c.name == "x"] == []  # never listed: not alive, dead nor left
    assert set(states(a)) == set(states(b)) == {"a", "b"}
    assert set(states(x)) == {"x"}
