"""Gossip membership between real ``kapok serve`` processes over UDP/TCP on 127.0.0.1.

The R-scenarios of ``kapok.bench.gossip_real`` with the ``fast`` profile, on one cluster of
seven nodes that the tests share in file order (each test states what it needs of it):
R2 a new node joins through one seed; R1 kill -9 one node, every survivor marks it dead;
R3 a graceful stop shows as left, and the name rejoins with a higher incarnation; R6 a
node with a wrong key is never admitted. The nodes sign with two different keys, as in
the middle of a key rotation (``[k1, k2]`` and ``[k2, k1]``), so every test also shows
that a ring accepts all of its keys. Conditions are polled with deadlines; the measured
times are printed (``pytest -s``) and are not asserted beyond generous bounds.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kapok.launch import NodeProcess, cluster_sets, nodes_view, start_cluster, start_node, stop_all, wait_for
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DEADLINE_S = scaled(20.0)  # far above the fast profile's figures: a loaded CI box must not flake


def _ring(i: int) -> str:
    return "cluster.secret=[k1, k2]" if i % 2 else "cluster.secret=[k2, k1]"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    base = tmp_path_factory.mktemp("cluster")
    nodes = start_cluster(base, 7, node_sets=lambda i: [_ring(i), f"storage.dir={base}/data{i}"])
    try:
        wait_for(lambda: all(_alive_count(n) == len(nodes) for n in nodes), DEADLINE_S, 0.1)
        yield nodes
    finally:
        stop_all(nodes)


def _alive_count(node: NodeProcess) -> int:
    return sum(row["state"] == "alive" for row in nodes_view(node).values())


def _name(node: NodeProcess) -> str:
    return node.url.removeprefix("http://")


def _states(nodes: list[NodeProcess], name: str) -> list[str | None]:
    return [nodes_view(n).get(name, {}).get("state") for n in nodes]


def test_r2_new_node_joins_through_one_seed(cluster: list[NodeProcess], tmp_path: Path) -> None:
    seed = cluster[3]
    joiner = start_node(tmp_path / "joiner", *cluster_sets("fast", [seed.gossip_addr]), _ring(0))
    cluster.append(joiner)  # the fixture stops it
    took = wait_for(lambda: _states(cluster, _name(joiner)) == ["alive"] * len(cluster), DEADLINE_S)
    print(f"\nR2: joined and alive in all {len(cluster)} views {took:.2f} s after its start-up")
    view = nodes_view(cluster[0])[_name(joiner)]
    assert view["http_url"] == joiner.url and view["gossip_addr"] == joiner.gossip_addr
    assert view["role"] == "master" and view["version"]


def test_cli_prints_the_gossip_view(cluster: list[NodeProcess]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kapok", "cluster", "nodes", "--seed", cluster[0].url],
        capture_output=True,
        text=True,
        timeout=scaled(30),
        check=True,
    ).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert set(rows) == {_name(n) for n in cluster}
    assert rows[_name(cluster[0])][1] == "*"  # the answering node
    assert all("alive" in row for row in rows.values())


def test_r1_killed_node_is_declared_dead_by_every_survivor(cluster: list[NodeProcess]) -> None:
    victim = cluster.pop(2)
    victim.kill()
    took = wait_for(lambda: _states(cluster, _name(victim)) == ["dead"] * len(cluster), DEADLINE_S)
    print(f"\nR1: dead in all {len(cluster)} survivors' views {took:.2f} s after kill -9")
    for node in cluster:  # no false deaths: every survivor still alive in every view
        view = nodes_view(node)
        assert all(view[_name(other)]["state"] == "alive" for other in cluster)


def test_r3_graceful_leave_shows_as_left_and_the_name_rejoins(cluster: list[NodeProcess]) -> None:
    leaver = cluster.pop(1)
    http_port = leaver.url.rsplit(":", 1)[1]
    gossip_addr, workdir = leaver.gossip_addr, leaver.workdir
    before = nodes_view(cluster[0])[_name(leaver)]["incarnation"]
    assert leaver.stop() == 0
    took = wait_for(lambda: _states(cluster, _name(leaver)) == ["left"] * len(cluster), DEADLINE_S)
    print(f"\nR3: left in all {len(cluster)} views {took:.2f} s after SIGTERM")

    # Same name (same HTTP port) and same gossip address: back with a higher incarnation.
    back = start_node(
        workdir,
        *cluster_sets("fast", [cluster[0].gossip_addr]),
        _ring(1),
        f"server.port={http_port}",
        f"cluster.bind={gossip_addr}",
    )
    cluster.append(back)
    took = wait_for(lambda: _states(cluster, _name(back)) == ["alive"] * len(cluster), DEADLINE_S)
    assert nodes_view(cluster[0])[_name(back)]["incarnation"] > before
    print(f"R3: the same name alive again in all views {took:.2f} s after its start-up")


def test_r6_a_node_with_a_wrong_key_is_never_admitted(cluster: list[NodeProcess], tmp_path: Path) -> None:
    target = cluster[0]
    dropped_before = _dropped(target)
    sets = cluster_sets("fast", [target.gossip_addr])
    stranger = start_node(tmp_path / "stranger", *sets, "cluster.secret=k3")
    try:
        # Its join reaches the cluster (and is dropped) ... (more than one attempt: it retries)
        wait_for(lambda: _dropped(target) >= dropped_before + 2, DEADLINE_S, 0.1)
        # ... yet it is in nobody's view, and it sees nobody.
        assert all(_name(stranger) not in nodes_view(n) for n in cluster)
        assert list(nodes_view(stranger)) == [_name(stranger)]
        assert all(_alive_count(n) == len(cluster) for n in cluster)
    finally:
        stranger.stop()


def _dropped(node: NodeProcess) -> float:
    with urllib.request.urlopen(node.url + "/metrics", timeout=scaled(2.0)) as response:
        text = response.read().decode()
    pattern = r"^kapok_gossip_dropped_packets_total\{[^}]*\} (\S+)$"
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def test_a_node_stopped_while_a_gossip_stream_is_half_read_stops_without_a_traceback(tmp_path: Path) -> None:
    """A peer's state exchange that has sent part of its length prefix when the node stops:
    the node ends those streams itself, so no handler is left for the event loop's teardown
    to cancel (on Python 3.11 asyncio logged each such cancel as a traceback)."""
    node = start_node(tmp_path / "node", *cluster_sets("fast"))
    host, port = node.gossip_addr.rsplit(":", 1)
    peers = [socket.create_connection((host, int(port)), timeout=DEADLINE_S) for _ in range(4)]
    try:
        for peer in peers:
            peer.sendall(b"\x00\x00")  # two of the four bytes of the length: the node waits
        for _ in range(3):  # a few turns of the node's loop: it has taken the connections
            urllib.request.urlopen(node.url + "/health", timeout=DEADLINE_S).read()
        assert node.stop() == 0
    finally:
        for peer in peers:
            peer.close()
        node.stop()
    assert "Traceback" not in node.output, node.output[-3000:]
    assert "stopped cleanly" in node.output
