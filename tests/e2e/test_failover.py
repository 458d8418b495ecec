"""Master/slave failover on real ``kapok serve`` processes: kill -9, give-back, partitions.

Timings are never asserted (the figures come from ``python -m kapok.bench.failover``);
every test asserts on messages and on roles. Faults come from ``kapok.faulty``'s fault
file, which the test rewrites while the nodes run.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kapok.bench.failover import failover_trial
from kapok.launch import cluster_sets, get_json, start_node, stop_all, wait_for
from kapok.testing.nodehttp import drain, metric, publish
from kapok.testing.pair import start_pair, state_of
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

AUTH = {"Authorization": "Bearer test"}
TIMEOUT_S = 1.0  # replication.failover_timeout_s of these pairs
DEADLINE_S = scaled(30.0)


def _health(url: str) -> dict[str, Any]:
    health: dict[str, Any] = get_json(url, "/health") or {}
    return health


def _registry(url: str) -> list[str]:
    """The masters KapokMQ's Go cluster producer would be given (``POST /Registry/GetNodes``)."""
    request = urllib.request.Request(url + "/Registry/GetNodes", data=b"", headers={"secretKey": "test"})
    with urllib.request.urlopen(request, timeout=scaled(5.0)) as resp:
        return [f"http://{row['Addr']}:{row['Port']}" for row in json.loads(resp.read())]


def _active_in_view(url: str) -> list[str]:
    """The members a node's gossip view (``/cluster/nodes``) shows active."""
    return [row["name"] for row in get_json(url, "/cluster/nodes") or [] if row["active"]]


class _Watcher:
    """Every 50 ms: each node's /health, and each node's gossip view; remembers any moment
    where two nodes said they were active, or a view showed two active members."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.both_active: list[float] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(scaled(10))

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            active = [url for url in self.urls if _health(url).get("active")]
            views = [_active_in_view(url) for url in self.urls]
            self.polls += 1
            if len(active) > 1 or any(len(view) > 1 for view in views):
                self.both_active.append(time.time())


@pytest.fixture
def fault_files(tmp_path: Path) -> Iterator[dict[str, Path]]:
    files = {name: tmp_path / f"{name}.faults.json" for name in ("master", "slave")}
    for path in files.values():
        path.write_text("{}")
    yield files


def _launcher(path: Path) -> tuple[str, ...]:
    return ("-m", "kapok.faulty", "--fault-file", str(path), "--")


def test_sync_kill_minus_9_loses_no_confirmed_message(tmp_path: Path) -> None:
    outcome = asyncio.run(failover_trial(tmp_path, mode="sync", failover_timeout_s=TIMEOUT_S, messages=1000))
    assert outcome.confirmed >= 1000
    assert outcome.takeover_s is not None
    assert outcome.from_slave > 0, outcome  # the slave had to deliver some: the test tests something
    assert outcome.lost == 0, outcome


def test_async_kill_minus_9_loses_at_most_the_reported_lag(tmp_path: Path) -> None:
    outcome = asyncio.run(failover_trial(tmp_path, mode="async", failover_timeout_s=TIMEOUT_S, messages=1000))
    assert outcome.takeover_s is not None and outcome.confirmed >= 1000
    assert outcome.lost <= (outcome.lag_records_before_kill or 0), outcome


def test_give_back_never_shows_two_active_nodes_and_loses_nothing(tmp_path: Path) -> None:
    master, slave = start_pair(tmp_path, mode="sync", profile="fast", failover_timeout_s=TIMEOUT_S)
    nodes = [master, slave]
    try:
        with _Watcher([master.url, slave.url]) as watcher:
            assert publish(master.url, "a1", "a2", "a3")[0] == 200
            assert _registry(master.url) == [master.url]  # KapokMQ clients never see a passive slave
            port, gossip = master.url.rsplit(":", 1)[1], master.gossip_addr
            master.kill()
            wait_for(lambda: bool(_health(slave.url).get("active")), DEADLINE_S, 0.05)
            taken = _health(slave.url)
            assert taken["epoch"] == 2 and taken["role"] == "master"
            assert _registry(slave.url) == [slave.url]
            # Acked on the slave while it leads; no write is confirmed without its partner (sync).
            assert sorted(m["data"] for m in drain(slave.url)) == ["a1", "a2", "a3"]
            status, body = publish(slave.url, "b1")
            assert status == 503 and body["error"] == "replication_unavailable"
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
            # It follows the slave, catches up, and takes its role back at a new epoch.
            wait_for(lambda: _health(back.url).get("active") is True, DEADLINE_S, 0.05)
            wait_for(lambda: _health(slave.url).get("role") == "slave", DEADLINE_S, 0.05)
            assert _health(back.url)["epoch"] == 3 and _health(slave.url)["epoch"] == 3
            status, body = publish(back.url, "c1")
            assert status == 200, body
            # Nothing acked on the slave comes back from the master; c1 does.
            assert [m["data"] for m in drain(back.url)] == ["c1"]
        assert watcher.polls >= 10  # it did watch, through the whole scenario
        assert not watcher.both_active
        state = state_of(back)
        assert state["link_up"] and state["partner"] == "slave"
    finally:
        stop_all(nodes)


def test_a_cut_link_with_gossip_fine_is_no_takeover(tmp_path: Path, fault_files: dict[str, Path]) -> None:
    master, slave = start_pair(
        tmp_path, mode="async", profile="fast", failover_timeout_s=TIMEOUT_S,
        launchers=(_launcher(fault_files["master"]), ("-m", "kapok")),
    )  # fmt: skip
    try:
        fault_files["master"].write_text('{"block_sync": true}')
        cut_at = time.monotonic()
        # Three failover timeouts of silence on the link, while gossip sees the master alive
        # (longer on a loaded machine, where a wrong takeover would come later too).
        while time.monotonic() - cut_at < scaled(3 * TIMEOUT_S):
            assert _health(slave.url).get("active") is False
            time.sleep(0.05)
        assert _health(slave.url)["epoch"] == 1 and _health(master.url)["active"] is True
        fault_files["master"].write_text("{}")
        assert publish(master.url, "after")[0] == 200
        wait_for(lambda: state_of(master).get("lag", {}) == {"records": 0, "bytes": 0, "seconds": 0.0},
                 DEADLINE_S, 0.05)  # fmt: skip
    finally:
        stop_all([master, slave])


def test_an_isolated_master_is_fenced_the_slave_takes_over_and_the_heal_loses_nothing(
    tmp_path: Path, fault_files: dict[str, Path]
) -> None:
    witness = start_node(tmp_path / "witness", *cluster_sets("fast"), "server.name=witness")
    nodes = [witness]
    try:
        master, slave = start_pair(
            tmp_path, mode="sync", profile="fast", failover_timeout_s=TIMEOUT_S,
            seeds=(witness.gossip_addr,), launchers=(_launcher(fault_files["master"]), ("-m", "kapok")),
        )  # fmt: skip
        nodes += [master, slave]
        status, body = publish(master.url, "before1", "before2")
        assert status == 200
        confirmed = set(body["codes"])
        fault_files["master"].write_text('{"isolate": true}')
        wait_for(lambda: bool(_health(slave.url).get("active")), DEADLINE_S, 0.05)
        assert _health(slave.url)["epoch"] == 2
        # The isolated master refuses writes: fenced, or (when its partner's /health reaches
        # it, which this fault does not cut) already following the higher epoch.
        wait_for(lambda: publish(master.url, "isolated")[1].get("error") in ("fenced", "not_active"),
                 DEADLINE_S, 0.1)  # fmt: skip
        # The new master sees the majority (itself and the witness): it confirms writes alone.
        wait_for(lambda: _health(slave.url).get("replication") == "alone", DEADLINE_S, 0.05)
        status, body = publish(slave.url, "during")
        assert status == 200, body
        confirmed |= set(body["codes"])
        fault_files["master"].write_text("{}")
        # Healed: the old master steps down, catches up, and (give_back) leads again at epoch 3.
        wait_for(lambda: _health(master.url).get("epoch") == 3 and bool(_health(master.url).get("active")),
                 DEADLINE_S, 0.1)  # fmt: skip
        wait_for(lambda: _health(slave.url).get("role") == "slave", DEADLINE_S, 0.05)
        received = {m["code"] for m in drain(master.url)}
        assert confirmed <= received
    finally:
        stop_all(nodes)


@pytest.mark.parametrize(
    ("backlog_bytes", "path"), [(64 * 1024 * 1024, "resumes"), (65536, "full_transfers")]
)
def test_a_slow_slave_never_slows_an_async_master_and_catches_up(
    tmp_path: Path, fault_files: dict[str, Path], backlog_bytes: int, path: str
) -> None:
    sets = ("replication.mode=async", f"replication.failover_timeout_s={TIMEOUT_S}",
            f"replication.backlog_bytes={backlog_bytes}")  # fmt: skip
    master, slave = start_pair(
        tmp_path, mode="async", profile="fast", failover_timeout_s=TIMEOUT_S, sets=sets[2:],
        launchers=(("-m", "kapok"), _launcher(fault_files["slave"])),
    )  # fmt: skip
    nodes = [master, slave]
    try:
        fault_files["slave"].write_text('{"sync_delay_ms": 200}')
        wait_for(lambda: metric(slave.url, "kapok_replication_epoch") == 1, DEADLINE_S, 0.1)
        payload = "x" * 1000
        codes: list[str] = []
        for _ in range(30):  # 30 batches of 50 KB, each confirmed by the master alone
            status, body = publish(master.url, *[payload] * 50)
            assert status == 200
            codes += body["codes"]
        state = state_of(master)
        assert state["backlog_bytes"] <= backlog_bytes + 50 * len(payload) + 4096
        behind = state["lag"]["records"] if state["lag"] else None
        assert behind is None or behind > 0  # behind, or cut off for being too slow
        before = metric(master.url, f"kapok_replication_{path}_total")
        # Stopped while behind, back without the delay: it resumes, or gets a full transfer.
        port = slave.url.rsplit(":", 1)[1]
        slave.stop()
        back = start_node(
            slave.workdir, *cluster_sets("fast", [master.gossip_addr]), "server.name=slave",
            f"server.port={port}", "replication.role=slave", f"replication.master={master.url}", *sets,
        )  # fmt: skip
        nodes.append(back)
        wait_for(lambda: metric(master.url, f"kapok_replication_{path}_total") > before, DEADLINE_S, 0.1)
        wait_for(lambda: (state_of(master).get("lag") or {}).get("records") == 0, DEADLINE_S, 0.1)
        # Acked means journaled; the mirror the metric counts applies it once the link is quiet.
        wait_for(lambda: metric(back.url, "kapok_messages_stored") >= len(codes), DEADLINE_S, 0.1)
    finally:
        stop_all(nodes)
