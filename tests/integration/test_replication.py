"""Master and slave over a real ``/sync/v1`` WebSocket, both nodes in the test's event loop.

Killing processes is the e2e layer's job (tests/e2e/test_failover.py); here the link
itself is exercised: pairing, the full transfer and the resume, the mirror, sync
confirmations and their time-out, refusals of a passive slave, the key check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.integration.conftest import Start

from kapok.config import load_config
from kapok.replication.leaderstate import UNPAIRED_BACKLOG_BYTES
from kapok.replication.protocol import Role
from kapok.storage.disk import DiskStore, begin_transfer, install_transfer
from kapok.storage.records import encode_end
from kapok.testing import eventually
from kapok.testing.console import ConsoleClient, cookie_jar
from kapok.testing.inprocess import RunningApp
from kapok.testing.slow import scaled

SECRET = "test"
AUTH = {"Authorization": f"Bearer {SECRET}"}
T = scaled(10.0)  # upper bound of every wait

pytestmark = pytest.mark.timeout(60)


async def pair(start: Start, *sets: str) -> tuple[RunningApp, RunningApp]:
    master = await start("m", *sets)
    slave = await start("s", "replication.role=slave", f"replication.master={master.url}", *sets)
    await eventually(
        lambda: (
            master.replication.leader is not None
            and master.replication.leader.link_up
            and master.replication.state.paired
        ),
        timeout_s=T,
        what="the slave's link and pairing",
    )
    return master, slave


async def publish(session: aiohttp.ClientSession, node: RunningApp, *datas: str, expect: int = 200) -> Any:
    body = {"messages": [{"data": d} for d in datas]}
    async with session.post(f"{node.url}/v1/topics/jobs/messages", json=body, headers=AUTH) as resp:
        assert resp.status == expect, await resp.text()
        return await resp.json()


async def mirrored(slave: RunningApp) -> set[str]:
    """The codes a slave's mirror holds once it has applied everything it journaled (it acks
    batches once they are durable, and applies them later: ``kapok.replication.applier``)."""
    await slave.replication.applier.catch_up()
    return set(slave.broker.messages)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_a_slave_mirrors_every_message_and_refuses_clients(
    start: Start, session: aiohttp.ClientSession
) -> None:
    master, slave = await pair(start)
    assert master.replication.state.partner == "s" and slave.replication.state.partner == "m"
    codes = (await publish(session, master, "a", "b", "c"))["codes"]
    # Sync mode: the confirmation came after the slave's durable ack, so it holds them all.
    assert slave.replication.wal.next_lsn == master.replication.wal.next_lsn
    assert set(codes) <= await mirrored(slave)
    assert slave.replication.role is Role.FOLLOWER and not slave.replication.active
    body = await publish(session, slave, "x", expect=503)
    assert body["error"] == "not_active" and master.url in body["message"]
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        async with session.ws_connect(f"{slave.ws_url}/v1/ws", headers=AUTH):
            pass
    assert info.value.status == 503


async def test_only_the_key_promotes_a_slave(start: Start, session: aiohttp.ClientSession) -> None:
    # A promotion without the key would give a stranger a second active master (split brain).
    master, slave = await pair(start)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        async with session.post(f"{slave.url}/replication/promote?force=true", headers=headers) as resp:
            assert resp.status == 401, await resp.text()
    assert slave.replication.role is Role.FOLLOWER and not slave.replication.active
    assert master.replication.active


async def test_wrong_key_is_refused_before_the_upgrade(start: Start, session: aiohttp.ClientSession) -> None:
    master = await start("m")
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            async with session.ws_connect(f"{master.ws_url}/sync/v1", headers=headers):
                pass
        assert info.value.status == 401
    assert master.replication.state.partner is None


async def test_sync_confirmation_fails_clearly_without_the_slave(
    start: Start, session: aiohttp.ClientSession
) -> None:
    master, slave = await pair(start, "replication.sync_timeout_ms=300")
    await publish(session, master, "before")
    await slave.stop()
    # Never a silent downgrade: the paired master refuses to confirm alone. Within
    # sync_timeout_ms of losing its slave it stores a message and fails to confirm it
    # (in doubt); after that it refuses up front, storing nothing.
    body = await publish(session, master, "after", expect=503)
    assert body["error"] in ("replication_unconfirmed", "replication_unavailable")

    async def refused_up_front() -> bool:
        async with session.post(
            f"{master.url}/v1/topics/jobs/messages", json={"data": "x"}, headers=AUTH
        ) as resp:
            return resp.status == 503 and (await resp.json())["error"] == "replication_unavailable"

    await eventually(refused_up_front, timeout_s=T, what="refusals before storing")
    stored = len(master.broker.messages)
    body = await publish(session, master, "refused", expect=503)
    assert body["error"] == "replication_unavailable" and len(master.broker.messages) == stored
    async with session.ws_connect(f"{master.ws_url}/v1/ws", headers=AUTH) as ws:
        await ws.send_json({"op": "pub", "id": 7, "msgs": [{"topic": "jobs", "data": "w"}]})
        frame = await ws.receive_json(timeout=T)
        assert frame["op"] == "error" and frame["code"] == "replication_unavailable" and frame["id"] == 7
    async with session.ws_connect(f"{master.ws_url}/Producers/Conn/jobs/p1") as ws:
        assert await ws.receive_str(timeout=T) == "Please enter the secret key"
        await ws.send_str(SECRET)
        assert await ws.receive_str(timeout=T) == "Secret key matching succeeded"
        await ws.send_str('{"MessageData": "k", "DelayTime": 0}')
        reply = await ws.receive_json(timeout=T)
        assert reply["code"] == -1 and "not connected" in reply["msg"]
    # The operator undoes the pairing on purpose: the master confirms alone again.
    async with session.post(f"{master.url}/replication/unpair") as resp:
        assert resp.status == 401
    async with session.post(f"{master.url}/replication/unpair", headers=AUTH) as resp:
        assert resp.status == 200 and (await resp.json())["partner"] is None
    await publish(session, master, "alone")


async def test_a_returning_slave_resumes_from_the_backlog(
    start: Start, session: aiohttp.ClientSession
) -> None:
    master, slave = await pair(start, "replication.mode=async")
    leader = master.replication.leader
    assert leader is not None and leader.resumes == 1  # an empty slave reads the master's log from 0
    await publish(session, master, "one")
    await slave.stop()
    missed = (await publish(session, master, "two", "three"))["codes"]
    slave = await start(
        "s", "replication.role=slave", f"replication.master={master.url}", "replication.mode=async"
    )
    await eventually(lambda: leader.link_up and leader.caught_up(), timeout_s=T, what="the slave catching up")
    assert leader.resumes == 2 and leader.full_transfers == 0
    assert set(missed) <= await mirrored(slave)


async def test_a_node_alone_keeps_little_log_in_memory_until_a_slave_pairs(
    start: Start, session: aiohttp.ClientSession
) -> None:
    """A node no slave has paired with held its whole backlog (64 MiB by default) of log
    that no slave might ever read: a fifth of a standalone node's memory in an e2e run."""
    master = await start("m")
    leader = master.replication.leader
    assert leader is not None
    big = "x" * 10_000
    for _ in range(30):  # 3 MB of log
        await publish(session, master, *[big] * 10)
    assert leader.backlog.bytes <= UNPAIRED_BACKLOG_BYTES + 10 * len(big) + 1000
    slave = await start("s", "replication.role=slave", f"replication.master={master.url}")
    await eventually(lambda: leader.link_up and leader.caught_up(), timeout_s=T, what="the slave catching up")
    assert leader.full_transfers == 1  # its log had left the small backlog
    codes = []
    for _ in range(30):  # paired: the configured backlog again
        codes += (await publish(session, master, *[big] * 10))["codes"]
    assert leader.backlog.bytes > 2 * UNPAIRED_BACKLOG_BYTES
    await eventually(lambda: all(c in slave.broker.messages for c in codes), timeout_s=T, what="mirrored")


async def test_a_slave_out_of_the_backlog_gets_a_full_transfer(
    start: Start, session: aiohttp.ClientSession
) -> None:
    sets = ("replication.mode=async", "replication.backlog_bytes=65536")
    master, slave = await pair(start, *sets)
    await slave.stop()
    big = "x" * 2000
    codes = []
    for _ in range(10):  # 10 batches of 10 × 2 KB: the backlog keeps about the last 3
        codes += (await publish(session, master, *[big] * 10))["codes"]
    slave = await start("s", "replication.role=slave", f"replication.master={master.url}", *sets)
    leader = master.replication.leader
    assert leader is not None
    await eventually(lambda: leader.link_up and leader.caught_up(), timeout_s=T, what="the slave catching up")
    assert leader.full_transfers == 1 and leader.resumes == 1
    assert set(codes) <= await mirrored(slave)
    assert leader.backlog.bytes <= 65536 + len(big) * 10 + 1000
    # The store the transfer reopened has an applier of its own, applying in idle time too.
    await publish(session, master, "after")
    await eventually(lambda: leader.caught_up(), timeout_s=T, what="the slave's ack")
    await eventually(lambda: slave.replication.applier.records == 0, timeout_s=T, what="idle applying")


async def test_acks_and_deletes_reach_the_mirror(start: Start, session: aiohttp.ClientSession) -> None:
    master, slave = await pair(start)
    codes = (await publish(session, master, "a", "b"))["codes"]
    async with session.get(f"{master.url}/v1/topics/jobs/messages?max=2", headers=AUTH) as resp:
        assert [m["code"] for m in (await resp.json())["messages"]] == codes
    async with session.post(
        f"{master.url}/v1/topics/jobs/ack", json={"codes": [codes[0]]}, headers=AUTH
    ) as resp:
        assert resp.status == 200
    async with session.delete(f"{master.url}/v1/messages/{codes[1]}", headers=AUTH) as resp:
        assert resp.status == 200

    def mirrored() -> bool:
        first = slave.broker.messages.get(codes[0])
        return first is not None and not first.live and codes[1] not in slave.broker.messages

    await eventually(mirrored, timeout_s=T, what="the ack and the delete on the slave")
    # The slave's log is the master's, LSN for LSN, and never needed a full transfer.
    leader = master.replication.leader
    assert leader is not None
    await eventually(leader.caught_up, timeout_s=T, what="the slave's ack of the last LSN")
    assert slave.replication.wal.next_lsn == master.replication.wal.next_lsn
    assert leader.full_transfers == 0


async def test_a_slaves_console_applies_what_it_journaled_before_it_shows_the_state(start: Start) -> None:
    master, slave = await pair(start)
    applier = slave.replication.applier
    await applier.aclose()  # no idle time: only the console's catch-up applies now
    async with aiohttp.ClientSession(cookie_jar=cookie_jar()) as http:
        await publish(http, master, "a", "b", "c")
        assert applier.records >= 3 and len(slave.broker.messages) == 0  # acked, journaled, not applied
        console = ConsoleClient(http, slave.url)
        assert (await console.log_in(SECRET)).status == 303
        overview = await console.json("/console/api/overview")
    assert overview["counts"]["held"] == 3 and applier.records == 0


async def test_a_slaves_snapshot_holds_every_record_before_its_lsn(
    start: Start, session: aiohttp.ClientSession
) -> None:
    master, slave = await pair(start)
    applier = slave.replication.applier
    await applier.aclose()  # no idle time: only the snapshot's catch-up applies now
    codes = (await publish(session, master, "a", "b"))["codes"]
    assert applier.records >= 2
    store = slave.service.store
    assert isinstance(store, DiskStore)
    await store.snapshot()  # cut at the log's end: the state it writes must hold all before it
    assert applier.records == 0 and set(codes) <= set(slave.broker.messages)
    assert store.snapshots == 1


async def test_a_paired_master_refuses_another_slave(start: Start) -> None:
    master, _ = await pair(start)
    other = await start("t", "replication.role=slave", f"replication.master={master.url}")
    await eventually(
        lambda: other.replication.follower is not None and other.replication.follower.refusals > 0,
        timeout_s=T,
        what="the second slave's refusal",
    )
    assert master.replication.state.partner == "s"
    assert other.replication.state.partner is None


def test_a_transfer_replaces_the_store_only_once_it_is_whole(tmp_path: Path) -> None:
    cfg = load_config(None, overrides=[f"storage.dir={tmp_path}"], env={}).storage
    for name in ("wal/wal-00000000000000000000.log", "snapshots/snapshot-00000000000000000000.snap"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"old")
    writer = begin_transfer(cfg, 42)
    writer.write(b"half a snapshot")
    assert install_transfer(tmp_path) is None  # not committed: the old store stays
    assert (tmp_path / "wal/wal-00000000000000000000.log").read_bytes() == b"old"
    writer.write(encode_end())
    writer.commit()
    assert install_transfer(tmp_path) == 42
    assert list((tmp_path / "wal").iterdir()) == []
    assert [p.name for p in (tmp_path / "snapshots").iterdir()] == ["snapshot-00000000000000000042.snap"]
    assert not (tmp_path / "transfer").exists()
    assert install_transfer(tmp_path) is None


async def test_after_a_takeover_a_batch_sent_again_is_answered_from_the_replicated_dedup_filter(
    start: Start, session: aiohttp.ClientSession
) -> None:
    # No gossip: the link alone decides, so stopping the master is enough for a takeover.
    master, slave = await pair(start, "replication.failover_timeout_s=0.3")
    batch = {"messages": [{"data": f"m{i}", "dedup_id": f"d{i}"} for i in range(5)]}
    async with session.post(f"{master.url}/v1/topics/jobs/messages", json=batch, headers=AUTH) as resp:
        codes = (await resp.json())["codes"]
    await master.stop()
    await eventually(lambda: slave.replication.active, timeout_s=T, what="the takeover")
    # Sync mode and the partner gone: nothing new is stored, but the known batch is answered.
    async with session.post(f"{slave.url}/v1/topics/jobs/messages", json=batch, headers=AUTH) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["codes"] == codes
    mixed = {"messages": [*batch["messages"], {"data": "new", "dedup_id": "d-new"}]}
    async with session.post(f"{slave.url}/v1/topics/jobs/messages", json=mixed, headers=AUTH) as resp:
        assert resp.status == 503 and (await resp.json())["error"] == "replication_unavailable"


async def test_a_slave_keeps_no_more_consumed_messages_than_retain_consumed_max(
    start: Start, session: aiohttp.ClientSession
) -> None:
    master, slave = await pair(start, "replication.mode=async", "mq.retain_consumed_max=100")
    for _ in range(10):  # 2,000 messages published and acked within well under a prune period
        await publish(session, master, *[f"m{i}" for i in range(200)])
        async with session.get(f"{master.url}/v1/topics/jobs/messages?max=500", headers=AUTH) as resp:
            codes = [m["code"] for m in (await resp.json())["messages"]]
        async with session.post(
            f"{master.url}/v1/topics/jobs/ack", json={"codes": codes}, headers=AUTH
        ) as resp:
            assert resp.status == 200
    leader = master.replication.leader
    assert leader is not None
    await eventually(lambda: leader.caught_up(), timeout_s=T, what="the slave catching up")
    # Both forget what is past the limit: the mirror as its master does, load or no load.
    await eventually(lambda: len(master.broker.messages) <= 100, timeout_s=T, what="the master forgetting")
    await eventually(lambda: len(slave.broker.messages) <= 100, timeout_s=T, what="the slave forgetting")
