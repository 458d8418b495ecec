"""Claims (named pull leases) on real ``kapok serve`` processes: kept through a kill -9 of
the master and its slave's takeover, through the give-back, and through a node's restart.

A claim's entries are fetched again from whichever node leads, with the same codes and
no new delivery attempt, and an ack by claim settles them; nothing acked under a claim is
ever delivered again. Deliveries not under a claim are requeued, as before.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kapok.launch import NodeProcess, cluster_sets, get_json, start_node, stop_all, wait_for
from kapok.testing.nodehttp import drain, publish
from kapok.testing.pair import start_pair, state_of
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "jobs"
GROUP = "spark"
TIMEOUT_S = 1.0  # replication.failover_timeout_s of the pair
DEADLINE_S = scaled(30.0)
HEADERS = {"Authorization": "Bearer test", "Content-Type": "application/json"}


def _call(url: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers=HEADERS)
    try:
        with urllib.request.urlopen(request, timeout=scaled(10.0)) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{path}: {exc.code} {exc.read()!r}") from None


def _pull(url: str, n: int, claim: str | None = None, lease_s: float = 300.0) -> list[dict[str, Any]]:
    query = f"group={GROUP}&max={n}&lease_s={lease_s}" + (f"&claim={claim}" if claim else "")
    body = _call(url, f"/v1/topics/{TOPIC}/messages?{query}")
    assert body.get("claim") == claim
    messages: list[dict[str, Any]] = body["messages"]
    return messages


def _codes(messages: list[dict[str, Any]]) -> list[str]:
    return [m["code"] for m in messages]


def _ack_claim(url: str, claim: str) -> dict[str, Any]:
    return _call(url, f"/v1/topics/{TOPIC}/ack", {"group": GROUP, "claim": claim})


def _health(url: str) -> dict[str, Any]:
    health: dict[str, Any] = get_json(url, "/health") or {}
    return health


def _caught_up(master: NodeProcess) -> bool:
    lag = state_of(master).get("lag")
    return isinstance(lag, dict) and lag.get("records") == 0


def test_a_claim_survives_kill_minus_9_takeover_and_give_back(tmp_path: Path) -> None:
    master, slave = start_pair(tmp_path, mode="sync", profile="fast", failover_timeout_s=TIMEOUT_S)
    nodes = [master, slave]
    try:
        assert _pull(master.url, 1) == []  # makes the group
        status, body = publish(master.url, *[f"m{i}" for i in range(10)], topic=TOPIC)
        assert status == 200, body
        published = body["codes"]
        claimed = _pull(master.url, 4, claim="q1:b7:p0")
        assert _codes(claimed) == published[:4] and [m["attempts"] for m in claimed] == [1] * 4
        unclaimed = _codes(_pull(master.url, 2))
        wait_for(lambda: _caught_up(master), DEADLINE_S, 0.05)  # the slave has the deliveries

        port, gossip = master.url.rsplit(":", 1)[1], master.gossip_addr
        master.kill()
        wait_for(lambda: bool(_health(slave.url).get("active")), DEADLINE_S, 0.05)
        assert _health(slave.url)["epoch"] == 2

        # The same claim on the new master: the same codes, still their first delivery.
        again = _pull(slave.url, 1000, claim="q1:b7:p0")
        assert _codes(again) == _codes(claimed)
        assert [m["attempts"] for m in again] == [1] * 4
        assert _ack_claim(slave.url, "q1:b7:p0") == {"settled": 4, "unknown": []}
        assert _ack_claim(slave.url, "q1:b7:p0") == {"settled": 0, "unknown": []}
        # The unclaimed lease was requeued by the takeover: leased again, under a new claim.
        second = _pull(slave.url, 3, claim="q1:b8:p0")
        assert set(unclaimed) <= set(_codes(second))

        # Give-back: the old master comes back, catches up and leads again; the claim goes along.
        back = start_node(
            master.workdir,
            *cluster_sets("fast", [gossip]),
            "server.name=master",
            f"server.port={port}",
            f"cluster.bind={gossip}",
            "replication.mode=sync",
            f"replication.failover_timeout_s={TIMEOUT_S}",
        )
        nodes.append(back)
        wait_for(lambda: _health(back.url).get("active") is True, DEADLINE_S, 0.05)
        wait_for(lambda: _health(slave.url).get("role") == "slave", DEADLINE_S, 0.05)
        assert _codes(_pull(back.url, 1000, claim="q1:b8:p0")) == _codes(second)
        assert _ack_claim(back.url, "q1:b8:p0") == {"settled": 3, "unknown": []}

        rest = _codes(drain(back.url, topic=TOPIC, group=GROUP))
        delivered = _codes(claimed) + _codes(second) + rest
        assert sorted(delivered) == sorted(published)  # each exactly once: none acked comes back
    finally:
        stop_all(nodes)


@pytest.mark.parametrize("stop", ["graceful", "kill -9"])
def test_a_claim_survives_a_restart_of_a_single_node(tmp_path: Path, stop: str) -> None:
    node = start_node(tmp_path / "single", "mq.secret_key=test")
    nodes = [node]
    try:
        assert _pull(node.url, 1) == []
        status, body = publish(node.url, *[f"m{i}" for i in range(6)], topic=TOPIC)
        assert status == 200, body
        published = body["codes"]
        claimed = _codes(_pull(node.url, 3, claim="q2:b0:p1", lease_s=120))
        unclaimed = _codes(_pull(node.url, 1))
        if stop == "graceful":
            assert node.stop() == 0
        else:
            node.kill()
        node = start_node(tmp_path / "single", "mq.secret_key=test")
        nodes.append(node)
        again = _pull(node.url, 1000, claim="q2:b0:p1")
        assert _codes(again) == claimed and [m["attempts"] for m in again] == [1] * 3
        assert _ack_claim(node.url, "q2:b0:p1") == {"settled": 3, "unknown": []}
        rest = drain(node.url, topic=TOPIC, group=GROUP)
        assert sorted(_codes(rest)) == sorted(published[3:])
        if stop == "graceful":  # (a kill may come before its delivery was written: not leased then)
            assert {m["code"]: m["attempts"] for m in rest}[unclaimed[0]] == 2  # requeued at start-up
    finally:
        stop_all(nodes)
