"""Storage faults under a slave: real ``kapok serve`` processes.

Every scenario runs a witness, a master and its slave (gossip profile ``fast``, sync mode,
``replication.failover_timeout_s`` 1 unless said otherwise) and publishes a few thousand
messages through the master's HTTP API, then damages the slave's storage:

* a flipped bit, or a cut, in a record in the middle of the slave's newest WAL segment,
  with the slave stopped (SIGTERM, as an operator does, or SIGKILL). The slave says so at
  start-up (one line naming the file and the offset, a counter in ``/metrics``), cuts its
  log at the last good record, and fetches the rest from its master again. After SIGTERM
  the shutdown snapshot already holds what the damaged records held; after SIGKILL the WAL
  is the only copy, so the cut really loses records locally;
* the same cut log, with the master killed while the slave fetches it again: the slave
  must not take over with a log that lacks confirmed writes. It waits (it is not in sync
  until it has acked what its master had when it connected), and once the master is back
  the pair heals with every confirmed message;
* a full disk under the slave (its ``storage.dir`` on a small tmpfs, mounted for the test):
  one ERROR line and a counter, no more acks (the master's producers are told their writes
  are unconfirmed, never falsely confirmed), and once space is freed it catches up.

Over every scenario: the slave never dies and never leads from a damaged log, it ends
with exactly the master's messages, every confirmed message is delivered, and no log
holds a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.disks import mounted_tmpfs

from kapok.launch import NodeProcess, cluster_sets, get_json, start_node, stop_all, wait_for
from kapok.storage.records import HEADER
from kapok.storage.segments import free_bytes, list_segments
from kapok.testing.history import History
from kapok.testing.nodehttp import drain, metric, publish
from kapok.testing.pair import state_of
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

AUTH = {"Authorization": "Bearer test", "Content-Type": "application/json"}
TIMEOUT_S = 1.0  # replication.failover_timeout_s, unless a test says otherwise
DEADLINE_S = scaled(30.0)
MESSAGES = 3000
BATCH = 100  # messages per publish: one WAL batch on the master, one frame to the slave


# ---------------------------------------------------------------- the pair


class _Trio:
    """A witness, a master and a slave (``start``); ``restart_*`` start a node again on its
    directory (the master on the same port, so that the slave finds it again)."""

    def __init__(
        self,
        base: Path,
        *,
        failover_s: float = TIMEOUT_S,
        slave_sets: tuple[str, ...] = (),
        master_sets: tuple[str, ...] = (),
        slave_launcher: tuple[str, ...] = ("-m", "kapok"),
    ) -> None:
        self.base = base
        self.failover_s = failover_s
        self.extra_slave_sets = slave_sets
        self.extra_master_sets = master_sets
        self.slave_launcher = slave_launcher
        self.nodes: list[NodeProcess] = []  # every process started, to stop them all

    def start(self) -> None:
        self.witness = self._start(self.base / "witness", *cluster_sets("fast"), "server.name=witness")
        common = (
            *cluster_sets("fast", [self.witness.gossip_addr]),
            "replication.mode=sync",
            f"replication.failover_timeout_s={self.failover_s}",
        )
        port = _free_port()
        self.master_sets = (*common, "server.name=master", f"server.port={port}", *self.extra_master_sets)
        self.master = self._start(self.base / "master", *self.master_sets)
        self.slave_sets = (
            *common, "server.name=slave", "replication.role=slave",
            f"replication.master=http://127.0.0.1:{port}", *self.extra_slave_sets,
        )  # fmt: skip
        self.slave = self.restart_slave()
        wait_for(lambda: state_of(self.master).get("link_up") is True, DEADLINE_S, 0.05)

    def _start(self, workdir: Path, *sets: str, launcher: tuple[str, ...] = ("-m", "kapok")) -> NodeProcess:
        node = start_node(workdir, *sets, launcher=launcher)
        self.nodes.append(node)
        return node

    def restart_slave(self) -> NodeProcess:
        self.slave = self._start(self.base / "slave", *self.slave_sets, launcher=self.slave_launcher)
        return self.slave

    def restart_master(self) -> NodeProcess:
        self.master = self._start(self.base / "master", *self.master_sets)
        return self.master


@contextlib.contextmanager
def _trio(base: Path, **options: Any) -> Iterator[_Trio]:
    """A started ``_Trio``; every process stopped at the end, and no log with a traceback."""
    trio = _Trio(base, **options)
    try:
        trio.start()
        yield trio
    finally:
        stop_all(trio.nodes)
        for node in trio.nodes:
            assert "Traceback" not in node.output, node.output[-3000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ---------------------------------------------------------------- clients


def _record(history: History, status: int, body: dict[str, Any], ids: list[str]) -> str:
    """Note a publish's outcome; returns its error code ("" when confirmed)."""
    if status == 200:
        history.published("ok", *ids)
        return ""
    code = str(body.get("error")) if status else "no answer"
    # replication_unconfirmed: stored on the master, not confirmed: it may or may not exist.
    history.published("info" if code in ("replication_unconfirmed", "no answer") else "fail", *ids)
    return code


def _fill(url: str, history: History, count: int = MESSAGES, start: int = 0, size: int = 100) -> None:
    """Publish ``count`` messages of about ``size`` bytes; every one must be confirmed."""
    pad = "x" * size
    for first in range(start, start + count, BATCH):
        ids = [f"m{i}" for i in range(first, min(first + BATCH, start + count))]
        status, body = publish(url, *[f"{i}:{pad}" for i in ids])
        assert _record(history, status, body, ids) == "", body


def _drain(url: str, history: History) -> int:
    """Lease and ack every ready message of ``jobs``; returns how many."""
    got = drain(url)
    history.delivered(*(m["data"].split(":", 1)[0] for m in got))
    return len(got)


def _stored(node: NodeProcess) -> float:
    return metric(node.url, "kapok_messages_stored", -1.0)


def _active(node: NodeProcess) -> bool:
    return (get_json(node, "/health") or {}).get("active") is True


def _in_sync(trio: _Trio) -> bool:
    state = state_of(trio.master)
    return state.get("link_up") is True and (state.get("lag") or {}).get("records") == 0


def _settled(trio: _Trio, expected: int) -> None:
    """The pair in sync again, both nodes holding ``expected`` messages."""
    wait_for(lambda: _in_sync(trio), 2 * DEADLINE_S, 0.1)
    wait_for(lambda: _stored(trio.slave) == _stored(trio.master) == expected, DEADLINE_S, 0.1)
    assert _active(trio.master) and not _active(trio.slave)


def _check_delivered(trio: _Trio, history: History) -> None:
    _drain(trio.master.url, history)
    check = history.check()
    assert check.valid, check
    assert check.confirmed > 0, check


# ---------------------------------------------------------------- damaging a log


def _frames(path: Path) -> list[tuple[int, int]]:
    """(offset, payload length) of every frame of a WAL segment."""
    data = path.read_bytes()
    found, pos = [], 0
    while pos + HEADER.size <= len(data):
        length, _ = HEADER.unpack_from(data, pos)
        found.append((pos, length))
        pos += HEADER.size + length
    assert pos == len(data), "the segment ends on a whole frame"
    return found


def _damage(wal_dir: Path, how: str) -> tuple[Path, int]:
    """Flip one bit in, or cut the file in the middle of, the middle record of the newest
    segment; returns the segment and the offset of the damaged frame."""
    segment = list_segments(wal_dir)[-1].path
    frames = _frames(segment)
    assert len(frames) > 10, frames
    offset, length = frames[len(frames) // 2]
    middle = offset + HEADER.size + length // 2
    if how == "flip":
        data = bytearray(segment.read_bytes())
        data[middle] ^= 0x10
        segment.write_bytes(bytes(data))
    else:
        os.truncate(segment, middle)
    return segment, offset


def _recovered(node: NodeProcess) -> int:
    """How many messages the node said it recovered from its own storage."""
    found = re.findall(r"recovered (\d+) messages", node.output)
    assert found, node.output[-2000:]
    return int(found[-1])


# ---------------------------------------------------------------- 1, 2: a flipped bit, a cut segment


@pytest.mark.parametrize("stop", ["term", "kill"])
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_slave_log_is_detected_cut_and_fetched_again(
    tmp_path: Path, damage: str, stop: str
) -> None:
    history = History()
    with _trio(tmp_path) as trio:
        _fill(trio.master.url, history)
        wait_for(lambda: _in_sync(trio), DEADLINE_S, 0.05)
        if stop == "term":
            assert trio.slave.stop() == 0
        else:
            trio.slave.kill()
        segment, offset = _damage(trio.slave.workdir / "data" / "wal", damage)
        slave = trio.restart_slave()

        # Detected: one line naming the file and the offset, and a counter.
        lines = [line for line in slave.output.splitlines() if segment.name in line]
        assert len(lines) == 1 and f"at offset {offset}" in lines[0], lines
        assert ("CRC mismatch" if damage == "flip" else "torn frame") in lines[0]
        assert metric(slave.url, "kapok_storage_recovery_corrupt_tails_total") == 1
        # Cut at the last good record: the file ends where the damaged frame began, and
        # nothing past it was served. After SIGTERM the shutdown snapshot held it all; after
        # SIGKILL the WAL was the only copy and about half of the messages are gone locally.
        assert segment.stat().st_size == offset
        if stop == "kill":
            assert 0 < _recovered(slave) < MESSAGES
        else:
            assert _recovered(slave) == MESSAGES
        # Fetched again from the master: the pair is in sync, with exactly the master's messages.
        _settled(trio, MESSAGES)
        assert re.search(r"slave slave (resumes from LSN|gets a full transfer)", trio.master.output)
        # And it follows on: new writes are confirmed through it.
        _fill(trio.master.url, history, 500, start=MESSAGES)
        _settled(trio, MESSAGES + 500)
        _check_delivered(trio, history)


# ---------------------------------------------------------------- the master killed meanwhile


def _set_faults(path: Path, **faults: Any) -> None:
    """Write the fault file ``kapok.faulty`` reads, at once (a half-written one reads as none)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(path)


@pytest.mark.parametrize("failover_s", [TIMEOUT_S, 3.0])
def test_a_slave_with_a_cut_log_never_takes_over_before_it_has_fetched_it_again(
    tmp_path: Path, failover_s: float
) -> None:
    # With a failover timeout of 3 s (the default) the slave is back before its master
    # would go on alone, so only the slave's own "in sync" stands between a take-over and
    # lost writes. (With 1 s the master may have gone on alone meanwhile, which stops a
    # take-over too.) Before the fix, the slave was in sync from its first ack, which said
    # where its cut log ended: it took over with half of the confirmed messages missing.
    faults = tmp_path / "faults.json"
    _set_faults(faults)
    history = History()
    launcher = ("-m", "kapok.faulty", "--fault-file", str(faults), "--")
    with _trio(tmp_path, failover_s=failover_s, slave_launcher=launcher) as trio:
        _fill(trio.master.url, history)
        wait_for(lambda: _in_sync(trio), DEADLINE_S, 0.05)
        trio.slave.kill()  # the WAL is the only copy: the cut loses records locally
        _damage(trio.slave.workdir / "data" / "wal", "flip")
        _set_faults(faults, sync_delay_ms=300)  # a slow catch-up...
        slave = trio.restart_slave()
        wait_for(lambda: "following master from LSN" in slave.output, DEADLINE_S, 0.01)
        _set_faults(faults, block_sync=True)  # ... that stops short
        if failover_s > TIMEOUT_S:
            assert "confirming writes alone" not in trio.master.output
        trio.master.kill()

        # Either it waits, or it had everything: never a take-over with writes missing.
        deadline = time.monotonic() + scaled(2 * failover_s + 2.0)  # a take-over comes within the timeout
        took_over = False
        while time.monotonic() < deadline and not took_over:
            took_over = _active(slave)
            time.sleep(0.05)
        if took_over:
            assert _stored(slave) >= MESSAGES, "the slave took over without every confirmed message"
            _drain(slave.url, history)
            check = history.check()
            assert check.valid, check
            return
        assert state_of(slave).get("in_sync") is False, slave.output[-3000:]
        assert _stored(slave) < MESSAGES, slave.output[-3000:]  # it was still fetching: this test's case

        # The master comes back: the slave fetches what it lacks, and nothing confirmed is lost.
        _set_faults(faults)
        trio.restart_master()
        _settled(trio, MESSAGES)
        _check_delivered(trio, history)


# ---------------------------------------------------------------- 3: a full disk


def test_a_full_disk_under_the_slave_stops_its_acks_and_heals_once_space_is_freed(tmp_path: Path) -> None:
    history = History()
    errors: dict[str, int] = {}
    with mounted_tmpfs(tmp_path / "slave-disk", "8m") as disk:
        data = disk / "data"
        with _trio(tmp_path, slave_sets=(f"storage.dir={data}",)) as trio:
            _fill(trio.master.url, history, 500)
            wait_for(lambda: _in_sync(trio), DEADLINE_S, 0.05)
            filler = disk / "filler"
            filler.write_bytes(bytes(free_bytes(disk) - 256 * 1024))
            # The master goes on publishing: the slave's disk fills up.
            n = 500
            pad = "y" * 1000
            deadline = time.monotonic() + DEADLINE_S
            while sum(errors.values()) < 5:
                assert time.monotonic() < deadline, errors
                ids = [f"m{i}" for i in range(n, n + 50)]
                n += 50
                status, body = publish(trio.master.url, *[f"{i}:{pad}" for i in ids])
                code = _record(history, status, body, ids)
                if code:
                    errors[code] = errors.get(code, 0) + 1
            # Never a false confirmation: the master's producers are told, in so many words.
            assert set(errors) <= {"replication_unconfirmed", "replication_unavailable"}, errors
            slave = trio.slave
            assert slave.alive()
            full = [line for line in slave.output.splitlines() if " ERROR " in line]
            assert len(full) == 1 and "disk full" in full[0], full
            assert metric(slave.url, "kapok_storage_wal_disk_full_total") == 1
            # It waits on the link it has: no reconnection loop, no resume after resume.
            assert slave.output.count("following master from LSN") == 1, slave.output[-3000:]
            assert trio.master.output.count("slave slave resumes") == 1, trio.master.output[-3000:]

            filler.unlink()  # space again
            wait_for(lambda: "writes again" in slave.output, DEADLINE_S, 0.05)
            wait_for(lambda: _in_sync(trio), DEADLINE_S, 0.1)
            # In sync again: new writes are confirmed through the slave, and it holds exactly
            # the master's messages (every one confirmed among them).
            _fill(trio.master.url, history, 200, start=n)
            expected = _stored(trio.master)
            _settled(trio, int(expected))
            assert sum(" ERROR " in line for line in slave.output.splitlines()) == 1
            assert slave.alive()
            _check_delivered(trio, history)


def test_a_slave_that_needs_a_full_transfer_on_a_full_disk_waits_for_space_between_tries(
    tmp_path: Path,
) -> None:
    """The slave is paused while its disk fills and its master goes on alone, far past a
    small backlog: once it runs again it needs a full transfer it cannot write. It says so
    once and waits for space instead of fetching the whole state again every second; once
    space is freed it gets one transfer and the pair is in sync with every confirmed message."""
    history = History()
    with mounted_tmpfs(tmp_path / "slave-disk", "8m") as disk:
        data = disk / "data"
        sets = {"slave_sets": (f"storage.dir={data}",), "master_sets": ("replication.backlog_bytes=65536",)}
        with _trio(tmp_path, **sets) as trio:
            _fill(trio.master.url, history, 500)
            wait_for(lambda: _in_sync(trio), DEADLINE_S, 0.05)
            filler = disk / "filler"
            filler.write_bytes(bytes(free_bytes(disk) - 512 * 1024))
            os.kill(trio.slave.pid, signal.SIGSTOP)
            try:
                n, pad, confirmed = 500, "y" * 1000, 0
                deadline = time.monotonic() + DEADLINE_S
                while confirmed < 1000:  # ~1 MB confirmed by the master alone: far past the backlog
                    assert time.monotonic() < deadline, trio.master.output[-2000:]
                    ids = [f"m{i}" for i in range(n, n + 50)]
                    n += 50
                    if not _record(history, *publish(trio.master.url, *[f"{i}:{pad}" for i in ids]), ids):
                        confirmed += len(ids)
            finally:
                os.kill(trio.slave.pid, signal.SIGCONT)
            wait_for(lambda: "gets a full transfer" in trio.master.output, DEADLINE_S, 0.1)
            # A slave that redials at once would have fetched it again by now.
            time.sleep(scaled(5 * TIMEOUT_S))
            assert trio.master.output.count("gets a full transfer") == 1, trio.master.output[-3000:]
            assert trio.slave.alive() and not _active(trio.slave)

            filler.unlink()  # space again
            wait_for(lambda: _in_sync(trio), 2 * DEADLINE_S, 0.1)
            _settled(trio, int(_stored(trio.master)))
            _check_delivered(trio, history)
            errors = [line for line in trio.slave.output.splitlines() if " ERROR " in line]
            assert len(errors) == 1 and "disk full" in errors[0], errors
