"""Operational routes: /health, /metrics (Prometheus text) and /cluster/nodes, without a key."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kapok.server.keys import GOSSIP
from kapok.testing.slow import scaled


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one Prometheus sample in ``text``, or None when absent."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        assert m, line
        if m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if found == labels:
            return float(m.group(3))
    return None


async def scrape(session: aiohttp.ClientSession, node: Any) -> str:
    async with session.get(node.url + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        assert "version=" in resp.headers["Content-Type"]
        return await resp.text()


async def test_health_needs_no_key(node: Any, session: aiohttp.ClientSession) -> None:
    async with session.get(node.url + "/health") as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        body = await resp.json()
    assert body["status"] == "ok"
    assert body["role"] == "master" and body["active"] is True
    assert isinstance(body["node"], str) and body["node"]


async def test_metrics_are_prometheus_text(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    text = await scrape(session, node)
    assert "# TYPE kapok_messages_published_total counter" in text
    assert "# HELP kapok_messages_published_total" in text
    before = sample(text, "kapok_messages_published_total")
    assert before == 0.0
    msgs = [{"data": str(i)} for i in range(3)]
    async with session.post(
        f"{node.url}/v1/topics/m/messages", json={"messages": msgs}, headers=auth
    ) as resp:
        assert resp.status == 200
    async with session.get(f"{node.url}/v1/topics/m/messages?max=1", headers=auth) as resp:
        assert resp.status == 200
    text = await scrape(session, node)
    assert sample(text, "kapok_messages_published_total") == 3.0
    assert sample(text, "kapok_messages_delivered_total") == 1.0
    assert "# TYPE kapok_group_ready gauge" in text
    assert sample(text, "kapok_group_ready", topic="m", group="default") == 2.0
    assert sample(text, "kapok_group_inflight", topic="m", group="default") == 1.0
    assert sample(text, "kapok_topic_live", topic="m") == 3.0
    # Every sample line parses as "<name>[{labels}] <number>".
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})? [-+0-9.eE]+(?:Inf|NaN)?$", line), line


async def test_metrics_count_bad_input_and_auth_failures(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    async with session.get(node.url + "/v1/topics") as resp:
        assert resp.status == 401
    async with session.ws_connect(node.ws_url + "/v1/ws", headers=auth) as ws:
        await ws.send_str("{nope")
        frame = await ws.receive_json(timeout=scaled(3))
        assert frame["code"] == "bad_request"
    text = await scrape(session, node)
    assert sample(text, "kapok_auth_failures_total") == 1.0
    assert sample(text, "kapok_bad_input_total", kind="v1_bad_request") == 1.0


async def test_cluster_nodes(node: Any, session: aiohttp.ClientSession) -> None:
    async with session.get(node.url + "/cluster/nodes") as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        members = await resp.json()
    assert isinstance(members, list) and len(members) == 1
    (me,) = members
    fields = ("name", "http_url", "gossip_addr", "state", "incarnation", "role", "active", "pair", "epoch")
    for field in fields:
        assert field in me, field
    assert me["http_url"] == node.url
    assert me["state"] == "alive" and me["role"] == "master"
    assert isinstance(me["incarnation"], int) and isinstance(me["epoch"], int)
    assert me["pair"] is None
    async with session.get(node.url + "/health") as resp:
        assert me["name"] == (await resp.json())["node"]


async def test_ops_routes_do_not_leak_data_bearing_routes(node: Any, session: aiohttp.ClientSession) -> None:
    for path in ("/v1/topics", "/v1/messages/" + "0" * 32, "/v1/topics/t/messages"):
        async with session.get(node.url + path) as resp:
            assert resp.status == 401, path
            assert (await resp.json())["error"] == "unauthorized"


async def test_cluster_nodes_reports_the_gossip_address(
    make_node: Any, session: aiohttp.ClientSession
) -> None:
    # Port 0: the node picks a free one for UDP and TCP together (a port probed free for UDP
    # alone may be taken for TCP).
    node = await make_node("cluster.enabled=true", "cluster.bind=127.0.0.1:0")
    bound = node.app[GOSSIP].addr
    assert bound.startswith("127.0.0.1:") and not bound.endswith(":0")
    async with session.get(node.url + "/cluster/nodes") as resp:
        members = await resp.json()
    me = next(m for m in members if m["self"])
    assert me["name"] == node.service.node_name and me["gossip_addr"] == bound
    assert me["state"] == "alive"
