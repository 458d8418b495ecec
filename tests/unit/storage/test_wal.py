"""The WAL's hand-offs (``kapok.storage.wal``; the archive's batches: ``kapok.storage.walstate``).

Written frames reach the archive sink byte for byte as the log holds them, in
order, in a few batches gathered over time rather than one call per write, and
a clean close hands over whatever is still queued, while the log keeps every
record in append order, across segment rotations; small writes that no fsync
waits for are made on the event loop, but never while an fsync is to be done.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from tests.unit.storage.walfiles import make_records, read_log

from kapok.core.changes import Change, GroupCreated
from kapok.errors import StorageError
from kapok.storage import segments as segments_module
from kapok.storage import walstate as walstate_module
from kapok.storage.records import FrameReader
from kapok.storage.segments import list_segments
from kapok.storage.wal import WriteAheadLog
from kapok.testing import eventually
from kapok.testing.slow import scaled

T = scaled(10.0)  # upper bound of every wait


class _Recorder:
    """An archive sink that decodes what it is fed."""

    def __init__(self) -> None:
        self.calls: list[list[Change]] = []
        self.fed = b""
        self.drains = 0

    def feed(self, parts: list[bytes], count: int, first_lsn: int) -> None:
        assert len(parts) == 2 * count  # a header and a payload per frame
        frames = b"".join(parts)
        reader = FrameReader(frames)
        self.calls.append(list(reader))
        assert reader.problem is None and reader.good_end == len(frames)
        self.fed += frames

    async def drain(self) -> None:
        self.drains += 1

    def behind(self) -> bool:
        return False


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
async def test_archive_gets_every_record_in_order_in_few_batches(tmp_path: Path, policy: str) -> None:
    recorder = _Recorder()
    wal = WriteAheadLog(tmp_path, policy=policy, interval_ms=10, segment_max_bytes=1 << 20, archive=recorder)
    loop = asyncio.get_running_loop()
    started = loop.time()
    wal.start(0)
    appended: list[Change] = []
    for i in range(40):  # every one its own write: awaited before the next
        records = make_records(3, 3 * i)
        appended.extend(records)
        await wal.append(records)
    elapsed = loop.time() - started
    await wal.aclose()  # nothing waited out the delay: close hands over the rest
    assert [c for call in recorder.calls for c in call] == appended
    # At most one hand-over per ARCHIVE_DELAY_S of writing, and one at close: on an idle
    # machine a few for the 40 writes; on a busy one, never one per write unless each
    # write took the whole delay.
    assert 1 <= len(recorder.calls) <= elapsed / walstate_module.ARCHIVE_DELAY_S + 2, (
        len(recorder.calls),
        elapsed,
    )
    assert recorder.drains == 40  # the flusher let the sink hold it back after every write
    assert read_log(tmp_path) == appended
    # The archive got the log's own bytes.
    assert recorder.fed == b"".join(s.path.read_bytes() for s in list_segments(tmp_path))


async def test_archive_batches_go_out_after_the_delay_without_a_close(tmp_path: Path) -> None:
    recorder = _Recorder()
    wal = WriteAheadLog(
        tmp_path, policy="interval", interval_ms=1000, segment_max_bytes=1 << 20, archive=recorder
    )
    wal.start(0)
    try:
        await wal.append(make_records(2))
        await wal.append(make_records(2, 2))
        await eventually(lambda: recorder.calls, what="the archive batch")
        assert recorder.calls == [make_records(4)]
    finally:
        await wal.aclose()


async def test_archive_batches_are_bounded_in_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(walstate_module, "ARCHIVE_BATCH_BYTES", 200)
    monkeypatch.setattr(walstate_module, "ARCHIVE_DELAY_S", 60.0)
    recorder = _Recorder()
    wal = WriteAheadLog(
        tmp_path, policy="never", interval_ms=1000, segment_max_bytes=1 << 20, archive=recorder
    )
    wal.start(0)
    try:
        for i in range(5):
            await wal.append(make_records(4, 4 * i))
        # three writes (~250 bytes) pass the bound: no waiting for the delay
        await eventually(lambda: sum(map(len, recorder.calls)) >= 12, what="a batch over the bound")
        assert [len(call) for call in recorder.calls] == [12]
    finally:
        await wal.aclose()
    assert [c for call in recorder.calls for c in call] == make_records(20)


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
async def test_concurrent_appends_keep_the_log_in_order_across_segments(tmp_path: Path, policy: str) -> None:
    wal = WriteAheadLog(tmp_path, policy=policy, interval_ms=5, segment_max_bytes=200)
    wal.start(0)
    appended: list[Change] = []
    futures = []
    for i in range(60):
        records = make_records(1 + (i % 7) * 3, len(appended))
        appended.extend(records)
        futures.append(wal.append(records))
        if i % 10 == 9:
            await futures[-1]  # a write in between: later appends queue while it runs
        elif i % 2 == 0:
            await asyncio.sleep(0)
        if i == 30:
            wal.cut()
    await asyncio.gather(*futures)
    await wal.aclose()
    assert len(list_segments(tmp_path)) > 2
    assert read_log(tmp_path) == appended


@pytest.fixture
def writers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that write to the log, in order."""
    names: list[str] = []
    real_writev = os.writev  # the module kapok.storage.segments imports

    def writev(fd: int, parts: list[bytes]) -> int:
        names.append(threading.current_thread().name)
        return real_writev(fd, parts)

    monkeypatch.setattr("kapok.storage.segments.os.writev", writev)
    return names


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
async def test_small_writes_stay_on_the_loop_unless_an_fsync_is_due(
    tmp_path: Path, writers: list[str], policy: str
) -> None:
    wal = WriteAheadLog(tmp_path, policy=policy, interval_ms=1000, segment_max_bytes=1 << 22)
    wal.start(0)
    small = make_records(3)
    big = [GroupCreated("t", "g" * 200, float(i)) for i in range(segments_module.INLINE_WRITE_BYTES // 200)]
    for records in (small, small, big, small):  # the first write opens the segment
        await wal.append(records)
        # the fsync of the directory, after the segment was created
        await eventually(lambda: not wal.files.background_jobs, timeout_s=T, what="the background fsyncs")
    await wal.aclose()
    loop_thread = threading.current_thread().name
    on_loop = [name == loop_thread for name in writers]
    # Opening a segment, a write past INLINE_WRITE_BYTES and every write that an ack's fsync
    # follows go to the writer thread (no background fsync runs here: it is due after 1 s).
    assert on_loop == ([False] * 4 if policy == "always" else [False, True, False, True])
    assert read_log(tmp_path) == small + small + big + small


async def test_no_write_is_made_on_the_loop_while_a_background_fsync_runs(
    tmp_path: Path, writers: list[str]
) -> None:
    syncing, release = threading.Event(), threading.Event()

    def slow_fsync(fd: int) -> None:  # background fsyncs, held until the test lets them go
        syncing.set()
        release.wait(T)

    wal = WriteAheadLog(
        tmp_path, policy="interval", interval_ms=5, segment_max_bytes=1 << 22, fsync=slow_fsync
    )
    wal.start(0)
    try:
        # Opening the segment queues an fsync of the directory; then the interval's fsyncs.
        await wal.append(make_records(2))
        assert await asyncio.to_thread(syncing.wait, T)
        for i in range(3):
            await wal.append(make_records(2, 2 + 2 * i))
            await asyncio.sleep(0.01)
        assert threading.current_thread().name not in writers  # the writer thread took them all
    finally:
        release.set()
        await wal.aclose()
    assert read_log(tmp_path) == make_records(8)


@pytest.mark.parametrize("policy", ["always", "interval", "never"])
async def test_write_now_writes_on_the_callers_turn_when_the_flusher_would_inline(
    tmp_path: Path, writers: list[str], policy: str
) -> None:
    """``write_now``: the appends' future is done on return, unless an fsync is to be
    awaited, the segment is to be opened, or the write is too large; the log keeps them all
    in order either way."""
    recorder = _Recorder()
    wal = WriteAheadLog(
        tmp_path, policy=policy, interval_ms=1000, segment_max_bytes=1 << 22, archive=recorder
    )
    wal.start(0)
    first = wal.append(make_records(2))
    assert not wal.write_now()  # the first write opens the segment: the writer thread's
    await first
    await eventually(lambda: not wal.files.background_jobs, timeout_s=T, what="the background fsyncs")
    small = wal.append(make_records(3, 2))
    assert wal.write_now() is (policy != "always")
    assert small.done() is (policy != "always")
    await small
    big_records = [
        GroupCreated("t", "g" * 200, float(i)) for i in range(segments_module.INLINE_WRITE_BYTES // 200)
    ]
    big = wal.append(big_records)
    assert not wal.write_now()  # too large for the loop: the flusher writes it, encoded once
    after_big = wal.append(make_records(1, 5))
    assert not wal.write_now()  # the big one is queued or being written before it
    await asyncio.gather(big, after_big)
    assert not wal.write_now()  # nothing queued
    await wal.aclose()
    assert read_log(tmp_path) == make_records(5) + big_records + make_records(1, 5)
    assert [c for call in recorder.calls for c in call] == read_log(tmp_path)
    loop_thread = threading.current_thread().name
    assert (loop_thread in writers) is (policy != "always")


async def test_write_now_leaves_it_to_the_flusher_while_the_archive_is_behind(tmp_path: Path) -> None:
    recorder = _Recorder()
    recorder.behind = lambda: True  # type: ignore[method-assign]
    wal = WriteAheadLog(
        tmp_path, policy="never", interval_ms=1000, segment_max_bytes=1 << 22, archive=recorder
    )
    wal.start(0)
    await wal.append(make_records(1))
    pending = wal.append(make_records(1, 1))
    assert not wal.write_now() and not pending.done()
    await pending
    await wal.aclose()
    assert read_log(tmp_path) == make_records(2)


async def test_write_now_after_a_failed_write_fails_the_appends(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, policy="never", interval_ms=1000, segment_max_bytes=1 << 22)
    wal.start(0)
    await wal.append(make_records(1))
    assert wal.files.file is not None
    os.close(wal.files.file)  # the next write fails (EBADF), as a dead disk would make it
    pending = wal.append(make_records(1, 1))
    assert not wal.write_now()
    assert pending.done() and isinstance(pending.exception(), StorageError)
    assert wal.failed is not None
    with pytest.raises(StorageError):
        wal.append(make_records(1, 2))
    wal.files.file = None  # closed above
    await wal.aclose()
