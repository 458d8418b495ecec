"""The pair protocol against misconfigured and forged peers, on real ``kapok serve`` processes.

A peer with the key is not yet a partner: these tests play a node with a typo in its key,
a client that holds the key and sends one odd frame, a wiped or copied slave, and a slave
that never reads. Each one must be refused with a reason, change nothing, and leave the
real pair working.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kapok.launch import NodeProcess, cluster_sets, get_json, start_node, stop_all, wait_for
from kapok.testing.nodehttp import metric, publish
from kapok.testing.pair import start_pair, state_of
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(180)]

AUTH = {"Authorization": "Bearer test"}
TIMEOUT_S = 1.0
DEADLINE_S = scaled(30.0)


def _hello(**fields: Any) -> dict[str, Any]:
    return {
        "op": "hello", "node": "slave", "http_url": "http://127.0.0.1:9", "epoch": 1,
        "history": [[1, 0]], "lsn": 0, "role": "slave", **fields,
    }  # fmt: skip


async def _sync_session(url: str, *frames: dict[str, Any], read: int = 1) -> list[dict[str, Any]]:
    """Open ``/sync/v1`` with the key, send ``frames``, return the first ``read`` text frames
    the node answers (fewer when it closes)."""
    out: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url + "/sync/v1", headers=AUTH, heartbeat=None, max_msg_size=0) as ws,
    ):
        for frame in frames:
            await ws.send_str(json.dumps(frame))
        while len(out) < read:
            msg = await ws.receive(timeout=scaled(10.0))
            if msg.type is aiohttp.WSMsgType.TEXT:
                out.append(json.loads(msg.data))
            elif msg.type is not aiohttp.WSMsgType.BINARY:
                break
    return out


def _saved(node: NodeProcess) -> dict[str, Any]:
    """The node's ``replication.json``."""
    saved: dict[str, Any] = json.loads((node.workdir / "data" / "replication.json").read_text())
    return saved


def _lines(node: NodeProcess, text: str) -> int:
    return sum(text in line for line in node.output.splitlines())


def test_a_forged_hello_with_a_high_epoch_changes_nothing(tmp_path: Path) -> None:
    master, slave = start_pair(tmp_path, mode="sync", profile="fast", failover_timeout_s=TIMEOUT_S)
    try:
        # The slave's name and a higher epoch, but not the pair's token: refused, nothing changes.
        answer = asyncio.run(_sync_session(master.url, _hello(epoch=99, history=[[1, 0], [99, 0]])))
        assert answer and answer[0]["op"] == "refused" and answer[0]["why"] == "stranger", answer
        token = _saved(slave)["token"]
        assert token and token == _saved(master)["token"]
        # The pair's token (a copied data directory) under the live slave's name: never displaces it.
        answer = asyncio.run(_sync_session(master.url, _hello(token=token)))
        assert answer[0]["op"] == "refused" and answer[0]["why"] == "busy", answer
        # The master still leads at epoch 1 with its real slave, and sync writes go through.
        status, body = publish(master.url, "after")
        assert status == 200, body
        health = get_json(master, "/health")
        assert health["active"] is True and health["epoch"] == 1
        assert state_of(master)["link_up"] is True
        assert state_of(slave)["active"] is False and state_of(slave)["epoch"] == 1
    finally:
        stop_all([master, slave])


def test_a_stranger_with_a_higher_epoch_never_makes_an_unpaired_master_passive(tmp_path: Path) -> None:
    master = start_node(tmp_path / "m", "server.name=m", "replication.mode=sync")
    try:
        answer = asyncio.run(_sync_session(master.url, _hello(node="x", epoch=7, history=[[1, 0], [7, 0]])))
        assert answer[0]["op"] == "refused" and answer[0]["why"] == "newer_epoch", answer
        assert publish(master.url, "still here")[0] == 200
        health = get_json(master, "/health")
        assert health["active"] is True and health["epoch"] == 1
    finally:
        stop_all([master])


def test_an_ack_beyond_what_was_sent_ends_the_session_and_confirms_nothing(tmp_path: Path) -> None:
    master = start_node(tmp_path / "m", "server.name=m", "replication.mode=sync")
    try:
        # A client with the key pairs as "x" (first pairing: its first ack of what it holds),
        # then acks far past what it was sent.
        async def forge() -> list[dict[str, Any]]:
            frames = (_hello(node="x"), {"op": "ack", "lsn": 0}, {"op": "ack", "lsn": 10**15})
            return await _sync_session(master.url, *frames, read=3)

        answer = asyncio.run(forge())
        assert answer[0]["op"] == "start", answer
        wait_for(lambda: state_of(master).get("link_up") is False, DEADLINE_S, 0.05)
        assert metric(master.url, "kapok_replication_bad_frames_total") >= 1
        # Sync mode, paired, and no slave: nothing is confirmed on the forged ack's word.
        status, body = publish(master.url, "unconfirmed")
        assert status == 503 and body["error"].startswith("replication_un"), body
        lag = state_of(master).get("lag")
        assert lag is None or lag["records"] >= 0
    finally:
        stop_all([master])


def test_a_slave_with_the_wrong_key_says_so_and_locks_nobody_out(tmp_path: Path) -> None:
    witness = start_node(tmp_path / "w", *cluster_sets("fast"), "server.name=w")
    nodes = [witness]
    try:
        master = start_node(
            tmp_path / "m", *cluster_sets("fast", [witness.gossip_addr]), "server.name=m",
            "replication.mode=sync", f"replication.failover_timeout_s={TIMEOUT_S}",
        )  # fmt: skip
        nodes.append(master)
        slave = start_node(
            tmp_path / "s", *cluster_sets("fast", [witness.gossip_addr]), "server.name=s",
            "replication.role=slave", f"replication.master={master.url}", "mq.secret_key=tset",
            f"replication.failover_timeout_s={TIMEOUT_S}",
        )  # fmt: skip
        nodes.append(slave)
        refused = "the master refused our key: check mq.secret_key"
        wait_for(lambda: _lines(slave, refused) >= 1, DEADLINE_S, 0.1)
        wait_for(lambda: state_of(slave, "tset").get("link") == "refused (wrong key)", DEADLINE_S, 0.1)
        # Clients with the right key on the same address are served all along.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            status, body = publish(master.url, "right key")
            assert status == 200, body
            time.sleep(0.1)
        # A slave that never synced never takes over, even with its master dead.
        master.kill()
        # An observation window: a takeover would come within 1-2 s (more on a loaded machine).
        time.sleep(scaled(5 * TIMEOUT_S))
        health = get_json(slave, "/health")
        assert health["active"] is False and health["epoch"] == 1
        assert _lines(slave, "the master refused our key") == 1  # once, not once a retry
    finally:
        stop_all(nodes)


def test_an_async_slave_that_never_reads_is_cut_off(tmp_path: Path) -> None:
    master = start_node(
        tmp_path / "m", "server.name=m", "replication.mode=async", "replication.backlog_bytes=65536"
    )
    try:

        async def never_read() -> bool:
            async with (
                aiohttp.ClientSession() as http,
                http.ws_connect(master.url + "/sync/v1", headers=AUTH, heartbeat=None, max_msg_size=0) as ws,
            ):
                await ws.send_str(json.dumps(_hello(node="lazy")))
                # Read nothing from here on, and let the master's log run far past its backlog.
                payload = "x" * 2000
                loop = asyncio.get_running_loop()
                for _ in range(200):
                    await loop.run_in_executor(None, publish, master.url, *[payload] * 20)
                    state = await loop.run_in_executor(None, state_of, master)
                    if state.get("link_up") is False:
                        return True
                return False

        assert asyncio.run(never_read()), "the master kept a slave that fell out of its backlog"
        assert _lines(master, "cut off lazy") >= 1
    finally:
        stop_all([master])


def test_a_wildcard_host_gives_out_the_advertised_url_and_a_restart_keeps_replicating(tmp_path: Path) -> None:
    key = "a-key-for-a-wildcard-host"
    common = ("server.host=0.0.0.0", f"mq.secret_key={key}", "replication.mode=sync",
              f"replication.failover_timeout_s={TIMEOUT_S}")  # fmt: skip
    master = start_node(tmp_path / "m", *cluster_sets("fast"), "server.name=m", *common)
    nodes = [master]
    try:
        master_url = master.url.replace("0.0.0.0", "127.0.0.1")
        sets = (*cluster_sets("fast", [master.gossip_addr]), "server.name=s", "replication.role=slave",
                f"replication.master={master_url}", *common)  # fmt: skip
        slave = start_node(tmp_path / "s", *sets)
        nodes.append(slave)
        slave_url = slave.url.replace("0.0.0.0", "127.0.0.1")
        wait_for(lambda: state_of(master_url, key).get("partner") == "s", DEADLINE_S, 0.05)
        for node in (master, slave):
            assert "0.0.0.0" not in str(_saved(node)["partner_url"]), _saved(node)
        port = slave_url.rsplit(":", 1)[1]
        slave.stop()
        back = start_node(tmp_path / "s", *sets, f"server.port={port}")
        nodes.append(back)
        wait_for(lambda: state_of(master_url, key).get("link_up") is True, DEADLINE_S, 0.05)
        status, body = publish(master_url, "after the restart", key=key)
        assert status == 200, body
        assert _lines(back, "sync link to http://0.0.0.0") == 0
    finally:
        stop_all(nodes)
