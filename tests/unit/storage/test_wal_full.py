"""A full disk under a master: its own records wait for space, new messages are refused.

The write-ahead log's own records (a producer's messages, a consumer's acks) that find no
space wait and are written once space is freed, as a slave's copies always did: nothing
fails for good, nothing is confirmed before it is written. ``SpaceWatch`` and the store
say the disk is full (below ``storage.min_free_bytes``, or a write waiting for space),
and the service refuses new messages then, before the broker applies anything, while
acks go on. A full disk is faked by ``os.writev`` / ``os.write`` / ``os.open`` raising
ENOSPC, and the free space by an injected probe.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from tests.unit.storage.walfiles import FillingDisk, make_records, read_log, small_wal

from kapok.config import load_config
from kapok.core.broker import Settle
from kapok.core.model import Draft
from kapok.errors import StorageError, StorageFullError, UnavailableError, error_for_code
from kapok.service import BrokerService
from kapok.storage.disk import DiskStore
from kapok.storage.space import SpaceWatch
from kapok.testing import eventually
from kapok.testing.slow import scaled

T = scaled(10.0)  # upper bound of every wait
MIB = 1024 * 1024


class _Replica:
    def __init__(self) -> None:
        self.offered: list[int] = []

    def offer(self, first_lsn: int, count: int, payload: bytes) -> None:
        self.offered.append(first_lsn)


# ---------------------------------------------------------------- the log


@pytest.mark.parametrize("policy", ["always", "never"])
async def test_the_masters_own_records_wait_for_space_and_queue_behind_it(
    tmp_path: Path, disk: FillingDisk, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kapok.storage")
    wal = small_wal(tmp_path, policy)
    wal.start(0)
    await wal.append(make_records(2))
    disk.full = True
    waiting = wal.append(make_records(2, 2))
    await eventually(lambda: wal.full and disk.refused >= 2, timeout_s=T, what="a retry on the full disk")
    # Not failed, not confirmed, and no torn frame in the file.
    assert wal.failed is None and not waiting.done()
    assert read_log(tmp_path) == make_records(2)
    acks = wal.append(make_records(3, 4))  # what consumers do meanwhile queues behind it
    assert not wal.write_now() and not acks.done()
    disk.full = False
    await asyncio.wait_for(waiting, T)
    await asyncio.wait_for(acks, T)
    assert not wal.full and wal.disk_full == 1
    await wal.aclose()
    assert read_log(tmp_path) == make_records(7)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "disk full" in errors[0] and "LSN 2" in errors[0], errors
    assert "bytes free" in errors[0] and str(tmp_path) in errors[0], errors
    assert sum("writes again" in r.getMessage() for r in caplog.records) == 1


async def test_write_now_on_a_full_disk_hands_the_records_to_the_flusher(
    tmp_path: Path, disk: FillingDisk
) -> None:
    wal = small_wal(tmp_path, "never")
    replica = wal.replica = _Replica()
    wal.start(0)
    await wal.append(make_records(1))
    disk.full = True
    pending = wal.append(make_records(2, 1))
    assert not wal.write_now()
    assert wal.failed is None and not pending.done()
    await eventually(lambda: wal.full, timeout_s=T, what="the wait for space")
    disk.full = False
    await asyncio.wait_for(pending, T)
    await wal.aclose()
    assert read_log(tmp_path) == make_records(3)
    assert replica.offered == [0, 1], "each batch goes to the slave's link once"


async def test_a_segment_that_cannot_be_created_waits_for_space(tmp_path: Path, disk: FillingDisk) -> None:
    wal = small_wal(tmp_path, "interval", segment_max_bytes=64)  # every batch opens a new segment
    wal.start(0)
    await wal.append(make_records(2))
    disk.full = True
    waiting = wal.append(make_records(2, 2))
    await eventually(lambda: wal.full, timeout_s=T, what="the wait for space")
    assert wal.failed is None and not waiting.done()
    disk.full = False
    await asyncio.wait_for(waiting, T)
    await wal.aclose()
    assert read_log(tmp_path) == make_records(4)


async def test_a_stopping_node_gives_up_the_wait_at_once(tmp_path: Path, disk: FillingDisk) -> None:
    # Nothing of the stop (a request awaiting its confirmation, a hand-over's flush) may wait
    # for space that may never come; the connections' last acks fail quietly, not raising.
    wal = small_wal(tmp_path, "never")
    wal.start(0)
    disk.full = True
    waiting = wal.append(make_records(1))
    await eventually(lambda: wal.full, timeout_s=T, what="the wait for space")
    wal.stop_waiting()
    with pytest.raises(StorageError):
        await asyncio.wait_for(waiting, T)
    await asyncio.wait_for(wal.flush(), T)
    late = wal.append(make_records(1, 1))
    assert late.done() and isinstance(late.exception(), StorageError)
    disk.full = False
    await asyncio.wait_for(wal.aclose(), T)
    assert read_log(tmp_path) == []


async def test_other_write_errors_still_fail_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int, buffers: list[bytes]) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    wal = small_wal(tmp_path, "always")
    wal.start(0)
    monkeypatch.setattr("kapok.storage.segments.os.writev", broken)
    with pytest.raises(StorageError, match="Input/output error"):
        await asyncio.wait_for(wal.append(make_records(1)), T)
    assert wal.failed is not None and not wal.full
    await wal.aclose()


# ---------------------------------------------------------------- the watch


class _Free:
    def __init__(self, free: int) -> None:
        self.free = free
        self.calls = 0

    def __call__(self, directory: Path) -> int:
        self.calls += 1
        return self.free


async def test_the_watch_says_full_below_the_reserve_and_heals_by_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kapok.storage")
    wal = small_wal(tmp_path / "wal", "never")
    free = _Free(10 * MIB)
    watch = SpaceWatch(tmp_path, 4 * MIB, wal, probe=free, interval_s=0.01)
    await watch.probe()
    assert watch.reason() is None
    free.free = 1000
    await watch.probe()
    assert watch.reason() is None, "a mirror (not serving) takes no client writes: no reserve"
    watch.serving = True
    reason = watch.reason()
    assert reason is not None and str(tmp_path) in reason and "1000 bytes free" in reason
    assert "storage.min_free_bytes (4194304)" in reason
    watch.update()
    watch.start()  # the periodic probe sees space come back, without a restart
    free.free = 5 * MIB
    await eventually(lambda: watch.reason() is None, timeout_s=T, what="the probe seeing space again")
    calls = free.calls
    await eventually(lambda: free.calls > calls, timeout_s=T, what="one more probe")
    await watch.aclose()
    assert watch.periods == 1
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    errors = [m for level, m in lines if level >= logging.ERROR]
    assert len(errors) == 1 and "storage full" in errors[0] and str(tmp_path) in errors[0], lines
    assert sum("space again" in m for _, m in lines) == 1, lines


async def test_a_reserve_of_0_means_full_only_while_a_write_waits(tmp_path: Path, disk: FillingDisk) -> None:
    wal = small_wal(tmp_path, "never")
    watch = SpaceWatch(tmp_path, 0, wal, probe=_Free(0))
    watch.serving = True
    await watch.probe()
    assert watch.reason() is None
    wal.start(0)
    disk.full = True
    waiting = wal.append(make_records(1))
    await eventually(lambda: watch.reason() is not None, timeout_s=T, what="full by the waiting write")
    assert "found no space" in (watch.reason() or "")
    disk.full = False
    await asyncio.wait_for(waiting, T)
    assert watch.reason() is None
    await wal.aclose()


# ---------------------------------------------------------------- the store and the service


def test_storage_full_is_a_storage_error_and_an_unavailable_one() -> None:
    exc = error_for_code("storage_full", "no room")
    assert isinstance(exc, StorageFullError) and isinstance(exc, StorageError)
    assert isinstance(exc, UnavailableError), "a producer sends the refused batch elsewhere"
    assert exc.http_status == 507 and exc.message == "no room"


async def test_a_full_store_refuses_new_messages_before_applying_them_and_takes_acks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "kapok.storage")
    sets = [f"storage.dir={tmp_path}", "storage.archive=false", f"storage.min_free_bytes={MIB}"]
    config = load_config(None, overrides=sets, env={})
    store = DiskStore(config.storage, fsync=lambda fd: None)
    free = _Free(10 * MIB)
    store.space = SpaceWatch(tmp_path, MIB, store.wal, probe=free)
    service = BrokerService(config, store=store)
    await service.start()
    try:
        codes, durable = service.publish([Draft("t", b"kept")])
        first, stored = service.publish([Draft("t", b"kept", dedup_id="d1")])
        assert durable is not None and stored is not None
        await asyncio.wait_for(asyncio.gather(durable, stored), T)
        entries = await service.pull("t", None, 1, 60.0, 0.0)
        assert [e.msg.code for e in entries] == codes
        free.free = 1000
        await store.space.probe()
        assert store.stats()["disk_full"] == 1 and store.stats()["disk_free_bytes"] == 1000
        published = service.broker.stats.published
        with pytest.raises(StorageFullError, match=r"1000 bytes free") as refused:
            service.publish([Draft("t", b"refused")])
        assert str(tmp_path) in refused.value.message
        assert service.broker.stats.published == published, "nothing was applied"
        # A batch sent again (its confirmation lost), all of it stored already: its codes.
        again = service.publish([Draft("t", b"kept", dedup_id="d1")])[0]
        assert again == first and service.broker.stats.published == published
        assert service.settle_in_group("t", None, codes, Settle.ACK) == []  # acks go on
        await store.wal.flush()
    finally:
        await service.aclose()
    assert any("no shutdown snapshot" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)


class _Sink:
    def __init__(self) -> None:
        self.pushed: list[tuple[list[str], asyncio.Future[None] | None]] = []

    def push(self, consumer: Any, entries: list[Any], after: asyncio.Future[None] | None) -> None:
        self.pushed.append(([e.msg.code for e in entries], after))


async def test_deliveries_of_durable_messages_do_not_wait_for_a_write_that_waits_for_space(
    tmp_path: Path, disk: FillingDisk
) -> None:
    # A publish slipped in before the disk was seen full, and its write waits for space:
    # only its own delivery waits with it; the backlog before it is delivered meanwhile.
    config = load_config(None, overrides=[f"storage.dir={tmp_path}", "storage.archive=false"], env={})
    store = DiskStore(config.storage, fsync=lambda fd: None)
    store.space = SpaceWatch(tmp_path, MIB, store.wal, probe=_Free(10 * MIB))
    service = BrokerService(config, store=store)
    await service.start()
    try:
        old, durable = service.publish([Draft("t", b"old")])
        assert durable is not None
        await asyncio.wait_for(durable, T)
        disk.full = True
        new, waiting = service.publish([Draft("t", b"new")])
        assert waiting is not None
        await eventually(lambda: store.full() is not None, timeout_s=T, what="the write waiting for space")
        sink = _Sink()
        consumer = service.subscribe(sink, "t", prefetch=1)
        assert sink.pushed == [(old, None)], "the durable message goes at once"
        service.ack(consumer.id, old)
        assert len(sink.pushed) == 2 and sink.pushed[1][0] == new
        assert sink.pushed[1][1] is not None and not sink.pushed[1][1].done(), "the new one waits"
        with pytest.raises(StorageFullError):
            service.publish([Draft("t", b"refused")])
        disk.full = False
        await asyncio.wait_for(waiting, T)
        await asyncio.wait_for(sink.pushed[1][1], T)
    finally:
        await service.aclose()
