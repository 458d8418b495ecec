"""The archive through the archiver process (``kapok.storage.archiver``).

A node's disk store starts a real child process and feeds it the WAL's frames;
these tests read the JSON lines it wrote: every lifecycle event of every
message, after a clean close (the child running at a lower priority); a killed
archiver is restarted and what was fed while it was gone is counted as lost,
never blocking the broker; and the child reassembles frames that arrive cut
anywhere.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import pytest

from kapok.config import load_config
from kapok.core import changes as ch
from kapok.core.broker import Draft
from kapok.core.consumers import Consumer
from kapok.core.model import Entry
from kapok.service import BrokerService
from kapok.storage import archiver as archiver_module
from kapok.storage.archive import list_archive_files, read_archive_file
from kapok.storage.archiver import ArchiveSettings, complete_frames, run
from kapok.storage.disk import DiskStore
from kapok.storage.records import encode_batch
from kapok.testing import eventually
from kapok.testing.slow import scaled

T = scaled(10.0)  # upper bound of every wait


def _events(directory: Path) -> list[dict[str, object]]:
    return [e for f in list_archive_files(directory) for e in read_archive_file(f.path)]


class _Sink:
    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def push(self, consumer: Consumer, entries: list[Entry], after: asyncio.Future[None] | None) -> None:
        self.entries.extend(entries)


async def _service(tmp_path: Path) -> BrokerService:
    config = load_config(None, overrides=[f"storage.dir={tmp_path}", "storage.fsync=never"], env={})
    service = BrokerService(config, store=DiskStore(config.storage))
    await service.start()
    return service


async def _publish(service: BrokerService, n: int, tag: str) -> list[str]:
    codes, durable = service.publish([Draft("t", f"{tag}{i}".encode()) for i in range(n)])
    if durable is not None:
        await durable
    return codes


async def test_every_lifecycle_event_reaches_the_archive(tmp_path: Path) -> None:
    service = await _service(tmp_path)
    sink = _Sink()
    consumer = service.subscribe(sink, "t", name="c")
    codes = await _publish(service, 50, "m")
    await eventually(lambda: len(sink.entries) == 50, timeout_s=T, what="50 deliveries")
    store = service.store
    assert isinstance(store, DiskStore) and store.archive is not None and store.archive.pid is not None
    child, ours = store.archive.pid, os.getpriority(os.PRIO_PROCESS, 0)
    expected = min(ours + archiver_module.NICE, 19)  # the node comes first on a busy machine
    await eventually(
        lambda: os.getpriority(os.PRIO_PROCESS, child) == expected,
        timeout_s=T,
        what="the archiver's lower priority",
    )
    service.ack(consumer.id, [e.msg.code for e in sink.entries])
    await service.aclose()  # ends the pipe; the child writes everything out before it exits

    events = _events(tmp_path / "archive")
    by_kind: dict[str, list[object]] = {}
    for event in events:
        by_kind.setdefault(str(event["ev"]), []).append(event["code"])
    assert by_kind["published"] == codes
    assert by_kind["delivered"] == codes
    assert by_kind["acked"] == codes


async def test_a_killed_archiver_is_restarted_and_the_gap_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archiver_module, "RESTART_S", 0.0)
    service = await _service(tmp_path)
    store = service.store
    assert isinstance(store, DiskStore) and store.archive is not None
    feed = store.archive
    try:
        await _publish(service, 5, "before")
        await eventually(lambda: feed.bytes_fed > 0, timeout_s=T, what="the first frames fed")
        pid = feed.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: not feed.alive, timeout_s=T, what="the archiver to be gone")

        lost = await _publish(service, 5, "gap")  # the broker takes these as if nothing happened
        await eventually(lambda: feed.frames_lost > 0 and feed.restarts == 1, timeout_s=T, what="a restart")
        assert feed.pid != pid
        after = await _publish(service, 5, "after")
    finally:
        await service.aclose()

    stats = store.stats()
    assert stats["archive_frames_lost_total"] >= 1 and stats["archive_restarts_total"] == 1
    archived = {e["code"] for e in _events(tmp_path / "archive") if e["ev"] == "published"}
    assert set(after) <= archived
    assert not set(lost) & archived


def test_the_child_reassembles_frames_cut_anywhere(tmp_path: Path) -> None:
    records = [
        ch.Published(i + 1, f"c{i}", "t", b"x" * i, "", 0, 1.0, 1.0, 0.0, "p", "", None, ("g",))
        for i in range(30)
    ]
    stream = b"".join(encode_batch(records[i : i + 3]) for i in range(0, 30, 3))
    assert complete_frames(stream[:-1]) < len(stream) == complete_frames(stream)

    settings = ArchiveSettings(str(tmp_path), rotate_bytes=1 << 20, max_bytes=1 << 30, max_age_s=3600.0)
    read_fd, write_fd = os.pipe()
    child = threading.Thread(target=run, args=(settings, read_fd))
    child.start()
    try:
        for start in range(0, len(stream), 7):  # 7-byte pieces: headers and payloads split everywhere
            os.write(write_fd, stream[start : start + 7])
    finally:
        os.close(write_fd)
        child.join(T)
        os.close(read_fd)
    assert not child.is_alive()
    assert [e["code"] for e in _events(tmp_path)] == [f"c{i}" for i in range(30)]
