"""Storage faults below the replication pair: a full disk under a slave's WAL,
and a hole in the log that recovery must not paper over.

A slave's copy of its master's batch that finds the disk full is cut off the segment
again, waits, and is written once space is freed; its future (the slave's ack) waits with
it; ``aclose`` gives the wait up without acknowledging anything. The master's own records
wait the same way (``test_wal_full``). A full disk is faked by ``os.writev`` / ``os.write`` raising
ENOSPC after a short write, as a real one does.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from tests.unit.storage.walfiles import FillingDisk, make_records, read_log, small_wal

from kapok.config import load_config
from kapok.core.broker import Broker
from kapok.errors import StorageError
from kapok.storage.disk import DiskStore
from kapok.storage.records import encode_batch, encode_payload
from kapok.storage.segments import segment_path
from kapok.testing import eventually
from kapok.testing.slow import scaled

T = scaled(10.0)  # upper bound of every wait


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
async def test_a_slaves_batch_waits_for_space_and_is_written_once_it_is_freed(
    tmp_path: Path, disk: FillingDisk, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kapok.storage")
    wal = small_wal(tmp_path, policy)
    wal.start(0)
    await wal.append_encoded(encode_payload(make_records(3)), 3)
    disk.full = True
    waiting = wal.append_encoded(encode_payload(make_records(3, 3)), 3)
    await eventually(lambda: wal.full and disk.refused >= 2, timeout_s=T, what="a retry on the full disk")
    # Nothing is acknowledged, the log is not failed, and no torn frame stays in the file.
    assert not waiting.done() and wal.failed is None
    assert read_log(tmp_path) == make_records(3)
    assert wal.disk_full == 1
    space = asyncio.ensure_future(wal.wait_for_space())
    await asyncio.sleep(0)
    assert not space.done()
    disk.full = False
    await asyncio.wait_for(waiting, T)
    await asyncio.wait_for(space, T)
    assert not wal.full
    await wal.append_encoded(encode_payload(make_records(1, 6)), 1)
    await wal.aclose()
    assert read_log(tmp_path) == make_records(7)
    assert wal.disk_full == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "disk full" in errors[0] and "LSN 3" in errors[0], errors
    assert sum("writes again" in r.getMessage() for r in caplog.records) == 1
    assert not any(r.exc_info for r in caplog.records)


async def test_closing_gives_up_the_wait_and_acknowledges_nothing(
    tmp_path: Path, disk: FillingDisk, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kapok.storage")
    wal = small_wal(tmp_path, "always")
    wal.start(0)
    await wal.append_encoded(encode_payload(make_records(2)), 2)
    disk.full = True
    waiting = wal.append_encoded(encode_payload(make_records(2, 2)), 2)
    await eventually(lambda: wal.full, timeout_s=T, what="the wait for space")
    await asyncio.wait_for(wal.aclose(), T)
    assert waiting.done() and isinstance(waiting.exception(), StorageError)
    await asyncio.wait_for(wal.wait_for_space(), T)  # a waiter learns of the failure, never hangs
    disk.full = False
    assert read_log(tmp_path) == make_records(2)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "disk full" in errors[0], errors
    assert any("were not written" in r.getMessage() for r in caplog.records)


async def test_write_now_leaves_a_slaves_batches_to_the_flusher(tmp_path: Path, disk: FillingDisk) -> None:
    wal = small_wal(tmp_path, "never")
    wal.start(0)
    await wal.append(make_records(1))
    pending = wal.append_encoded(encode_payload(make_records(1, 1)), 1)
    assert not wal.write_now()
    await asyncio.wait_for(pending, T)
    await wal.aclose()
    assert read_log(tmp_path) == make_records(2)


async def test_a_gap_between_two_segments_ends_the_log_there(tmp_path: Path) -> None:
    # A slave cut its damaged segment at LSN 5, and a snapshot covered the rest; should that
    # snapshot be lost later, replaying on from an older one must stop at the hole, not
    # skip it and serve a log with records missing in the middle.
    config = load_config(None, overrides=[f"storage.dir={tmp_path}", "storage.archive=false"], env={})
    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    segment_path(wal_dir, 0).write_bytes(b"".join(encode_batch([r]) for r in make_records(5)))
    segment_path(wal_dir, 10).write_bytes(b"".join(encode_batch([r]) for r in make_records(5, 10)))
    store = DiskStore(config.storage, fsync=lambda fd: None)
    broker = Broker(config.mq.settings(), 1, journal=True)
    await store.open(broker, 100.0)
    try:
        assert store.wal.next_lsn == 5
        assert store.corrupt_tails == 1
        assert [p.name for p in wal_dir.glob("*.orphan")] == [f"{segment_path(wal_dir, 10).stem}.orphan"]
        groups = sorted(g for t in broker.topics.values() for g in t.groups if g.startswith("g"))
        assert groups == [f"g{i}" for i in range(5)]
    finally:
        await store.aclose(snapshot=False)
