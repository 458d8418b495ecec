"""The console's JSON (what its pages show and refresh from) against a real in-process node:
counts, dead letters and their requeue, clients, the analytics source, a message's history
from the archive, and clear errors for bad input."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kapok.config import load_config
from kapok.node.app import make_app
from kapok.testing.console import ConsoleClient, cookie_jar
from kapok.testing.inprocess import InProcessNode
from kapok.testing.slow import scaled

KEY = "console-api-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
DEADLINE_S = scaled(30.0)  # the archiver hands its buffer to the file at least every 10 s

StartNode = Callable[..., Awaitable[InProcessNode]]


@pytest.fixture
async def start(aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path) -> StartNode:
    async def factory(*sets: str) -> InProcessNode:
        overrides = [f"storage.dir={tmp_path / 'data'}", f"mq.secret_key={KEY}", "storage.fsync=never", *sets]
        app = make_app(load_config(None, overrides=overrides, env={}))
        return InProcessNode(await aiohttp_server(app, host="127.0.0.1", port=0), app)

    return factory


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=cookie_jar()) as session:
        yield session


async def logged_in(http: aiohttp.ClientSession, node: InProcessNode) -> ConsoleClient:
    client = ConsoleClient(http, node.url)
    assert (await client.log_in(KEY)).status == 303
    return client


async def v1(
    http: aiohttp.ClientSession, node: InProcessNode, method: str, path: str, body: Any = None
) -> Any:
    async with http.request(method, node.url + path, json=body, headers=AUTH) as resp:
        return resp.status, await resp.json()


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        await asyncio.sleep(0.05)


async def dead_letter(http: aiohttp.ClientSession, node: InProcessNode, topic: str, data: str) -> str:
    """Publish, lease and reject one message; returns its dead letter's code."""
    _, body = await v1(http, node, "POST", f"/v1/topics/{topic}/messages", {"data": data})
    (code,) = body["codes"]
    await v1(http, node, "GET", f"/v1/topics/{topic}/messages?max=1")
    await v1(http, node, "POST", f"/v1/topics/{topic}/nack", {"codes": [code], "requeue": False})
    (dead,) = [m.code for m in node.broker.messages.values() if m.topic == f"{topic}.dlq"]
    return dead


async def test_overview_counts_follow_the_broker(start: StartNode, http: aiohttp.ClientSession) -> None:
    node = await start()
    console = await logged_in(http, node)
    before = await console.json("/console/api/overview")
    assert before["counts"]["live"] == 0 and before["node"]["name"] == node.service.node_name
    await v1(http, node, "POST", "/v1/topics/a/messages", {"messages": [{"data": "1"}, {"data": "2"}]})
    await v1(http, node, "POST", "/v1/topics/b/messages", {"data": "3", "delay_s": 60})
    after = await console.json("/console/api/overview")
    assert after["counts"]["consumers"] == 0
    assert (after["counts"]["live"], after["counts"]["ready"], after["counts"]["delayed"]) == (3, 2, 1)
    assert after["totals"]["published"] == 3 and after["counts"]["topics"] == 2
    assert after["storage"]["wal_records_total"] >= 3 and after["storage"]["wal_bytes_on_disk"] > 0
    # Every storage figure the page names is one the node reports.
    status, page = await console.get("/console/overview")
    named = set(re.findall(r'data-k="storage\.([a-z_]+)"', page))
    assert status == 200 and len(named) >= 12
    assert named <= set(after["storage"]), named - set(after["storage"])
    assert after["chart"]["unit"] == "messages/s" and len(after["chart"]["series"]) == 3


async def test_dead_letters_show_on_their_topic_and_requeue(
    start: StartNode, http: aiohttp.ClientSession
) -> None:
    node = await start("mq.max_deliveries=3")
    console = await logged_in(http, node)
    dead = await dead_letter(http, node, "jobs", "retry me")
    topics = {t["name"]: t for t in (await console.json("/console/api/topics"))["topics"]}
    assert topics["jobs"]["dead_letters"] == 1 and topics["jobs"]["dlq"] == "jobs.dlq"
    assert topics["jobs"]["dlq_url"] == "/console/messages?topic=jobs.dlq"
    assert topics["jobs.dlq"]["is_dlq"] and topics["jobs.dlq"]["groups"][0]["ready"] == 1
    listed = await console.json("/console/api/messages?topic=jobs.dlq")
    assert [(m["code"], m["requeue"]) for m in listed["messages"]] == [(dead, True)]
    # The same operation through the native API, for scripts.
    status, body = await v1(http, node, "POST", f"/v1/messages/{dead}/requeue")
    assert status == 200 and body["requeued"] == dead
    again = node.broker.messages[body["code"]]
    assert again.topic == "jobs" and again.data == b"retry me"
    topics = {t["name"]: t for t in (await console.json("/console/api/topics"))["topics"]}
    assert topics["jobs"]["dead_letters"] == 0 and topics["jobs"]["groups"][0]["ready"] == 1
    status, body = await v1(http, node, "POST", f"/v1/messages/{dead}/requeue")
    assert status == 409 and "already settled" in body["message"]
    status, body = await v1(http, node, "POST", f"/v1/messages/{again.code}/requeue")
    assert status == 400 and body["error"] == "bad_request"
    status, body = await v1(http, node, "POST", f"/v1/messages/{'0' * 32}/requeue")
    assert status == 404 and body["error"] == "not_found"


async def test_the_requeue_form(start: StartNode, http: aiohttp.ClientSession) -> None:
    node = await start()
    console = await logged_in(http, node)
    dead = await dead_letter(http, node, "jobs", "form")
    status, _ = await console.post(f"/console/messages/{dead}/requeue", csrf=console.csrf)
    assert status == 303
    status, page = await console.post(f"/console/messages/{dead}/requeue", csrf=console.csrf)
    assert status == 409 and "already settled" in page  # shown on a page, not as a traceback


async def test_clients_lists_connections_and_subscriptions(
    start: StartNode, http: aiohttp.ClientSession
) -> None:
    node = await start()
    console = await logged_in(http, node)
    async with http.ws_connect(node.ws_url + "/Consumers/Conn/orders/worker-7") as ws:
        assert (await ws.receive_str()) == "Please enter the secret key"
        await ws.send_str(KEY)
        assert (await ws.receive_str()) == "Secret key matching succeeded"
        data = await console.json("/console/api/clients")
        (conn,) = data["connections"]
        assert (conn["kind"], conn["id"], conn["subscribed_to"]) == ("consumer", "worker-7", "orders")
        assert conn["protocol"] == "kapokmq" and conn["publishes_to"] == ""
        (sub,) = data["subscriptions"]
        assert (sub["name"], sub["topic"], sub["group"]) == ("worker-7", "orders", "default")
        assert sub["ack"] == "manual" and sub["client"] == "worker-7"
        assert sub["credit"] == sub["prefetch"] > 0 and sub["inflight"] == 0
        topics = (await console.json("/console/api/topics"))["topics"]
        assert topics[0]["groups"][0]["consumers"] == 1


async def test_analytics_reads_the_summary_or_falls_back(
    start: StartNode, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    out = tmp_path / "job-output"
    node = await start(f"console.analytics_dir={out}")
    console = await logged_in(http, node)
    await v1(http, node, "POST", "/v1/topics/t/messages", {"data": "x"})
    data = await console.json("/console/api/analytics")
    assert data["source"] == "node" and data["problem"] == "" and data["path"] == str(out / "summary.json")
    assert data["totals"][0]["published"] == 1
    out.mkdir()
    (out / "summary.json").write_text("{broken")
    data = await console.json("/console/api/analytics")
    assert data["source"] == "node" and "not valid JSON" in data["problem"]
    summary = {"generated_at": "2026-01-01T00:00:00Z", "days": [],
               "topics": {"t": {"published": 9, "latency_ms": {"p50": 1, "p95": 2, "p99": 3}}}}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary))
    data = await console.json("/console/api/analytics")
    assert data["source"] == "summary" and data["is_summary"] and data["generated"] == "2026-01-01T00:00:00Z"
    assert data["latency"] == [{"topic": "t", "p50": 1, "p95": 2, "p99": 3}]
    status, page = await console.get("/console/analytics")
    assert status == 200 and "analytics job" in page


async def test_a_message_shows_its_history_from_the_archive(
    start: StartNode, http: aiohttp.ClientSession
) -> None:
    node = await start()
    console = await logged_in(http, node)
    _, body = await v1(http, node, "POST", "/v1/topics/h/messages", {"data": '{"a": 1}'})
    (code,) = body["codes"]
    await v1(http, node, "GET", "/v1/topics/h/messages?max=1")
    await v1(http, node, "POST", "/v1/topics/h/ack", {"codes": [code]})
    events: list[str] = []

    async def archived() -> bool:
        data = await console.json(f"/console/api/messages/{code}")
        events[:] = [e["ev"] for e in data["history"]["events"]]
        return events == ["published", "delivered", "acked"]

    await eventually(archived, f"the archive holds the message's three events (so far {events})")
    data = await console.json(f"/console/api/messages/{code}")
    assert data["payload"] == {"encoding": "utf8", "text": '{\n  "a": 1\n}', "json": True}
    (entry,) = data["entries"]
    assert entry["status"] == "consumed" and entry["attempts"] == 1 and entry["settled_at"]


async def test_bad_input_is_a_clear_error(start: StartNode, http: aiohttp.ClientSession) -> None:
    node = await start()
    console = await logged_in(http, node)
    for query, message in [
        ("start=yesterday", "start must be a UTC date"),
        ("status=lost", "status must be one of"),
        ("page=0", "page must be between"),
        ("size=abc", "size must be an integer"),
    ]:
        async with http.get(f"{node.url}/console/api/messages?{query}") as resp:
            assert resp.status == 400
            body = await resp.json()
            assert body["error"] == "bad_request" and message in body["message"], body
        status, page = await console.get(f"/console/messages?{query}")
        assert status == 400 and message in page and "Traceback" not in page
    async with http.get(f"{node.url}/console/api/messages/{'0' * 32}") as resp:
        assert resp.status == 404 and (await resp.json())["error"] == "not_found"
    status, page = await console.get(f"/console/messages/{'0' * 32}")
    assert status == 404 and "no message with code" in page
    status, page = await console.post(f"/console/messages/{'0' * 32}/delete", csrf=console.csrf)
    assert status == 404 and "No message with that code" in page


async def test_cluster_pairs_masters_and_slaves_with_their_lag(
    start: StartNode, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replication fills ``pair``, ``pair_id``, ``epoch``, ``lag`` and ``alone_since`` in the
    gossip rows; the page shows them as pair cards as they come (here the rows are made up:
    these nodes are not part of this one's view), and a dead node's stale claim to be
    active shows nowhere."""
    node = await start()
    console = await logged_in(http, node)
    lag = {"records": 12, "bytes": 3072, "seconds": 1.5}
    rows: list[dict[str, object]] = [
        {"name": "m1", "http_url": "http://10.0.0.1:8011", "state": "alive", "role": "master", "pair": "s1",
         "pair_id": "m1", "epoch": 2, "incarnation": 4, "active": True, "load": 3.0, "version": "0.2",
         "self": False, "alone_since": None},
        {"name": "s1", "http_url": "http://10.0.0.2:8011", "state": "suspect", "role": "slave", "pair": "m1",
         "pair_id": "m1", "epoch": 2, "incarnation": 1, "active": False, "load": 0.0, "version": "0.2",
         "self": False, "lag": lag, "alone_since": None},
        {"name": "evil", "http_url": "javascript:alert(1)", "state": "dead", "role": "master", "pair": None,
         "pair_id": "evil", "epoch": 0, "incarnation": 0, "active": True, "load": 0.0, "version": "0.2",
         "self": False, "alone_since": 7},
    ]  # fmt: skip
    monkeypatch.setattr("kapok.console.figures.member_rows", lambda app: [dict(r) for r in rows])
    data = await console.json("/console/api/cluster")
    assert data["states"] == {"alive": 1, "suspect": 1, "dead": 1, "left": 0}
    by_id = {p["id"]: p for p in data["pairs"]}
    assert [p["id"] for p in data["pairs"]] == ["evil", "m1"]
    m1, evil = by_id["m1"], by_id["evil"]
    assert (m1["first"]["name"], m1["second"]["name"], m1["active"], m1["epoch"]) == ("m1", "s1", "m1", 2)
    assert (m1["link"], m1["link_class"], m1["writes"], m1["lag"]) == ("up", "up", "yes", lag)
    assert (evil["active"], evil["first"]["active"], evil["writes"]) == (None, False, "no")
    assert [m["active"] for m in data["members"]] == [True, False, False]  # the dead one is not active
    assert data["members"][0]["console_url"] == "http://10.0.0.1:8011/console/cluster"
    assert data["members"][2]["console_url"] is None  # only http(s) URLs become links
    status, page = await console.get("/console/cluster")
    assert status == 200
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "12 records · 3.0 KiB · 1.5 s" in text and 'href="http://10.0.0.2:8011/console/cluster"' in page
    assert "Pair m1" in text and "Accepts writes yes m1 is active" in text
    assert "no node of the pair is alive" in text
    assert "javascript:alert(1)" in text and 'href="javascript' not in page  # shown as text, never a link


async def test_the_nodes_own_pair_and_replication_come_from_its_replication(
    start: StartNode, http: aiohttp.ClientSession
) -> None:
    """A node alone (no gossip, no partner) is a pair of one that takes writes unpaired; the
    overview says what a write waits for."""
    node = await start()
    console = await logged_in(http, node)
    data = await console.json("/console/api/cluster")
    (card,) = data["pairs"]
    assert (card["local"], card["link"], card["writes"]) == (True, "unpaired", "yes")
    assert card["active"] == card["id"] == card["first"]["name"]
    assert card["first"]["self"] is True and card["second"] is None
    overview = await console.json("/console/api/overview")
    assert (overview["node"]["role"], overview["node"]["replication"]) == ("master", "unpaired")
    status, page = await console.get("/console/overview")
    assert status == 200 and "replication" in page and "is-unpaired" in page
