"""The Analytics page shows the same summary on every node of a cluster (issue 26): three
real ``kapok serve`` processes in one gossip cluster; only ``n0``'s storage holds a
``summary.json`` (written by hand, in the shape the analytics job writes). ``n1`` shows it,
says it came from ``n0``, and keeps showing it while ``n2`` — a member whose advertised
URL is a server answering garbage — is asked too. A newer summary on ``n1`` wins on both
nodes. The node-to-node route takes the secret key as a bearer token and nothing else."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kapok.console.peers import CACHE_S, SUMMARY_ROUTE
from kapok.launch import NodeProcess, nodes_view, start_cluster, stop_all, wait_for
from kapok.testing.console import ConsoleClient, cookie_jar
from kapok.testing.poll import eventually
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

KEY = "analytics-cluster-key-7c2d"
DEADLINE_S = scaled(30.0)


def summary(generated_at: str, published: int) -> dict[str, Any]:
    return {
        "generated_at": generated_at,
        "topics": {"orders": {"published": published, "delivered": published, "acked": published,
                              "latency_ms": {"p50": 1.5, "p95": 4.0, "p99": 9.0}}},
        "days": [],
        "a_key_of_a_later_version": {"ignored": True},
    }  # fmt: skip


def write_summary(data_dir: Path, content: dict[str, Any]) -> None:
    folder = data_dir / "analytics"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "summary.json.tmp"
    tmp.write_text(json.dumps(content), encoding="utf-8")
    tmp.replace(folder / "summary.json")


class Garbage(BaseHTTPRequestHandler):
    """Answers every GET with 200 and something that is not JSON."""

    def do_GET(self) -> None:
        body = b"<html>\x00\xff not a summary {"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def garbage() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, garbage: ThreadingHTTPServer
) -> Iterator[list[NodeProcess]]:
    base = tmp_path_factory.mktemp("analytics-cluster")
    write_summary(base / "data0", summary("2026-03-01T10:00:00Z", 42))
    garbage_url = f"http://127.0.0.1:{garbage.server_address[1]}"

    def node_sets(i: int) -> list[str]:
        sets = [f"server.name=n{i}", f"storage.dir={base / f'data{i}'}"]
        return [*sets, f"server.public_url={garbage_url}"] if i == 2 else sets

    nodes = start_cluster(base, 3, f"mq.secret_key={KEY}", "storage.fsync=never", node_sets=node_sets)
    try:
        wait_for(lambda: all(_alive(n) == 3 for n in nodes), DEADLINE_S, 0.1)
        yield nodes
    finally:
        stop_all(nodes)


def _alive(node: NodeProcess) -> int:
    return sum(row["state"] == "alive" for row in nodes_view(node).values())


def _get(url: str, headers: dict[str, str]) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=scaled(10)) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _log_in(http: aiohttp.ClientSession, node: NodeProcess) -> ConsoleClient:
    console = ConsoleClient(http, node.url)
    resp = await console.log_in(KEY)
    assert resp.status == 303
    return console


async def _analytics(console: ConsoleClient) -> tuple[dict[str, Any], str]:
    data = await console.json("/console/api/analytics")
    status, page = await console.get("/console/analytics")
    assert status == 200
    return data, page


async def test_every_node_shows_the_newest_summary_of_the_cluster(cluster: list[NodeProcess]) -> None:
    n0, n1, n2 = cluster
    async with aiohttp.ClientSession(cookie_jar=cookie_jar()) as http:
        c0, c1, c2 = [await _log_in(http, node) for node in cluster]
        for console in (c1, c2):  # n1 asks n0 and the garbage; n2 asks n0 and n1
            data, page = await _analytics(console)
            assert data["is_summary"] and data["from_peer"], data
            assert data["summary_node"] == "n0" and data["generated"] == "2026-03-01T10:00:00Z"
            assert data["totals"][0]["topic"] == "orders" and data["totals"][0]["published"] == 42
            assert data["summary_path"].endswith("summary.json")
            assert "from node" in page and ">n0</strong>" in page
        own, _ = await _analytics(c0)
        assert own["summary_node"] == "n0" and not own["from_peer"]
        # n1 asked the garbage member and said so, once.
        assert n1.output.count("analytics summary of member n2 left out") == 1, n1.output[-3000:]

        # A newer summary on n1: n1 shows its own at once, n0 once its answers are older than CACHE_S.
        write_summary(Path(n1.workdir).parent / "data1", summary("2026-03-02T10:00:00Z", 7))
        data, _ = await _analytics(c1)
        assert data["summary_node"] == "n1" and data["totals"][0]["published"] == 7

        async def n0_shows_n1s() -> bool:
            data, _ = await _analytics(c0)
            return data["summary_node"] == "n1" and data["from_peer"] is True

        what = "n0 showing n1's newer summary"
        await eventually(n0_shows_n1s, timeout_s=scaled(CACHE_S + 30), what=what, interval_s=1.0)
        assert n0.alive() and n1.alive() and n2.alive()


def test_the_summary_route_takes_the_key_as_a_bearer_token(cluster: list[NodeProcess]) -> None:
    n0 = cluster[0]
    url = n0.url + SUMMARY_ROUTE
    status, body = _get(url, {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and body["node"] == "n0" and body["summary"]["topics"]["orders"]["published"] == 42
    assert _get(url, {})[0] == 401
    assert _get(url, {"Authorization": "Bearer wrong"})[0] == 401
    assert (
        _get(n0.url + "/console/api/analytics", {"Authorization": f"Bearer {KEY}"})[0] == 401
    )  # that route alone
