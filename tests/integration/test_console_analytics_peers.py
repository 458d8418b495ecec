"""The other members' analytics summaries (``kapok.console.peers``), over real sockets on
127.0.0.1 and under this layer's blocking-call detector:

* two nodes in one gossip cluster, in this event loop: the one without a summary shows the
  other's, and nothing on the way blocks the loop;
* members that answer garbage, too much, an error, late or nothing at all are left out, a
  member is asked at most once per ``CACHE_S`` however many page views come, and a
  member left out is logged once per ``LOG_EVERY_S`` at most.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from kapok.console.peers import CACHE_S, LOG_EVERY_S, SUMMARY_ROUTE, TIMEOUT_S, PeerSummaries
from kapok.launch import cluster_sets
from kapok.server.keys import GOSSIP
from kapok.server.routes.cluster_view import member_rows
from kapok.testing.console import ConsoleClient, cookie_jar
from kapok.testing.inprocess import RunningApp
from kapok.testing.poll import eventually
from kapok.testing.slow import scaled

KEY = "peers-key-3e9a"
SUMMARY = {"generated_at": 1_700_000_000, "topics": {"orders": {"published": 12}}, "days": []}

Start = Callable[..., Awaitable[RunningApp]]


async def test_a_node_shows_the_summary_another_member_holds(start: Start, tmp_path: Path) -> None:
    folder = tmp_path / "a-analytics"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(SUMMARY), encoding="utf-8")
    a = await start("a", *cluster_sets("fast"), f"mq.secret_key={KEY}", f"console.analytics_dir={folder}")
    seed = a.app[GOSSIP].addr
    b = await start("b", *cluster_sets("fast", [seed]), f"mq.secret_key={KEY}")

    def b_sees_a() -> bool:
        return any(row["name"] == "a" and row["state"] == "alive" for row in member_rows(b.app))

    await eventually(b_sees_a, timeout_s=scaled(20.0), what="b seeing a alive", interval_s=0.05)
    async with aiohttp.ClientSession(cookie_jar=cookie_jar()) as http:
        console = ConsoleClient(http, b.url)
        assert (await console.log_in(KEY)).status == 303
        data = await console.json("/console/api/analytics")
        assert data["is_summary"] and data["from_peer"] and data["summary_node"] == "a"
        assert data["summary_path"] == str(folder / "summary.json")
        assert data["totals"][0]["published"] == 12
        status, page = await console.get("/console/analytics")
        assert status == 200 and '<strong data-k="summary_node">a</strong>' in page


class Peers:
    """One test server playing many members: member ``<case>`` is at ``<url>/<case>``."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.app = web.Application()
        self.app.router.add_get("/{case}" + SUMMARY_ROUTE, self.answer)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        case = request.match_info["case"]
        self.hits[case] += 1
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": "unauthorized"}, status=401)
        bodies: dict[str, Any] = {
            "good": {"node": "good", "path": "/x/summary.json", "summary": SUMMARY},
            "none": {"node": "none", "path": "/x/summary.json", "summary": None},
            "impostor": {"node": "someone-else", "summary": SUMMARY},
            "shape": {"node": "shape", "summary": {"topics": ["not", "an", "object"]}},
            "big": {"node": "big", "summary": {**SUMMARY, "padding": "x" * 5000}},
        }
        if case in bodies:
            return web.Response(body=orjson.dumps(bodies[case]), content_type="application/json")
        if case == "garbage":
            return web.Response(body=b"<html>\xff{", content_type="application/json")
        if case == "error":
            return web.json_response({"error": "internal"}, status=500)
        if case == "slow":
            await asyncio.sleep(TIMEOUT_S * 5)
        raise web.HTTPNotFound()


async def test_bad_members_are_left_out_asked_once_per_interval_and_logged_once(
    aiohttp_server: Callable[..., Awaitable[TestServer]], caplog: Any
) -> None:
    peers = Peers()
    server = await aiohttp_server(peers.app, host="127.0.0.1", port=0)
    base = str(server.make_url("")).rstrip("/")
    cases = ["big", "error", "garbage", "good", "impostor", "missing", "none", "shape", "slow"]
    targets = [(case, f"{base}/{case}") for case in cases]
    now = [1000.0]
    summaries = PeerSummaries(KEY, 1024, lambda: now[0])
    caplog.set_level(logging.WARNING, logger="kapok.console")

    loop = asyncio.get_running_loop()
    began = loop.time()
    views = await asyncio.gather(*(summaries.get(targets) for _ in range(5)))  # five page views at once
    assert loop.time() - began < TIMEOUT_S + scaled(3.0)  # the slow member is given up, not awaited
    for got in views:
        assert [(c.node, c.path, c.summary) for c in got] == [("good", "/x/summary.json", SUMMARY)]
    assert peers.hits == dict.fromkeys(cases, 1)  # one round for the five views

    def logged() -> Counter[str]:
        return Counter(r.getMessage().split()[4] for r in caplog.records if "left out" in r.getMessage())

    noisy = {"big", "error", "garbage", "impostor", "shape", "slow"}  # "none" and "missing": quiet
    assert logged() == dict.fromkeys(noisy, 1), caplog.text
    assert "more than 1024 bytes" in caplog.text and "answered HTTP 500" in caplog.text

    now[0] += CACHE_S - 1
    await summaries.get(targets)
    assert peers.hits == dict.fromkeys(cases, 1)  # still fresh
    now[0] += 1
    await summaries.get(targets)
    assert peers.hits == dict.fromkeys(cases, 2)  # asked again, but not logged again
    assert logged() == dict.fromkeys(noisy, 1)
    now[0] += LOG_EVERY_S
    await summaries.get(targets)
    assert logged() == dict.fromkeys(noisy, 2)
    assert await summaries.get([]) == []
