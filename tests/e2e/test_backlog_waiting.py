"""A backlog deep enough that its far end is held small (a ``Waiting``, kapok.core.waiting), through a
clean stop, a kill -9 and a drain of a real node: every message comes back once, whole,
in publish order; lookups and deletes by code reach the messages that wait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kapok.core.state import KEEP_CODES_QUEUED
from kapok.launch import NodeProcess, start_node
from kapok.testing.slow import scaled

pytestmark = pytest.mark.e2e

TOPIC = "jobs"
AUTH = {"Authorization": "Bearer test"}  # the embedded default configuration's key
BATCH = 500
REPLY_S = scaled(30.0)


async def call(
    session: aiohttp.ClientSession, node: NodeProcess, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    timeout = aiohttp.ClientTimeout(total=REPLY_S)
    async with session.request(method, node.url + path, json=body, headers=AUTH, timeout=timeout) as resp:
        return resp.status, await resp.json()


async def publish(session: aiohttp.ClientSession, node: NodeProcess, first: int, count: int) -> list[str]:
    codes: list[str] = []
    for start in range(first, first + count, BATCH):
        items = [{"data": f"m{i}"} for i in range(start, min(start + BATCH, first + count))]
        status, out = await call(session, node, "POST", f"/v1/topics/{TOPIC}/messages", {"messages": items})
        assert status == 200, out
        codes += out["codes"]
    return codes


async def lookup(session: aiohttp.ClientSession, node: NodeProcess, code: str) -> Any:
    status, out = await call(session, node, "GET", f"/v1/messages/{code}")
    return out if status == 200 else None


async def test_a_deep_backlog_survives_a_clean_stop_and_a_kill_and_drains_whole(tmp_path: Path) -> None:
    n = KEEP_CODES_QUEUED + 2_000  # the last 2,000 are published behind KEEP_CODES_QUEUED ready ones
    node = start_node(tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            codes = await publish(session, node, 0, n)
            far = codes[n - 1_000]
            assert (await lookup(session, node, far))["data"] == f"m{n - 1_000}"
            deleted = codes[n - 500]
            status, _ = await call(session, node, "DELETE", f"/v1/messages/{deleted}")
            assert status == 200
            assert node.stop() == 0, node.output
            node = start_node(tmp_path)  # from the shutdown snapshot
            assert (await lookup(session, node, codes[n - 1]))["data"] == f"m{n - 1}"
            assert await lookup(session, node, deleted) is None
            codes += await publish(session, node, n, 1_000)  # these wait too: logged in the WAL only
            node.kill()
            node = start_node(tmp_path)  # from the snapshot and the WAL's tail
            assert (await lookup(session, node, codes[-1]))["data"] == f"m{n + 999}"
            seen: list[tuple[str, str]] = []
            for _ in range(len(codes) // 1_000 + 5):
                status, out = await call(session, node, "GET", f"/v1/topics/{TOPIC}/messages?max=1000")
                got = [(m["code"], m["data"]) for m in out["messages"]]
                if not got:
                    break
                ack = {"codes": [c for c, _ in got]}
                status, acked = await call(session, node, "POST", f"/v1/topics/{TOPIC}/ack", ack)
                assert acked == {"settled": len(got), "unknown": []}
                seen += got
            expected = [(c, f"m{i}") for i, c in enumerate(codes) if c != deleted]
            assert seen == expected
            status, out = await call(session, node, "GET", f"/v1/topics/{TOPIC}/messages?max=10")
            assert out["messages"] == []
    finally:
        node.stop()
