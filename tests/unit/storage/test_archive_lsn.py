"""What names an archived event: its archiver's ``run`` and its record's WAL ``lsn``.

The WAL hands each feed's first LSN to the archive; the archiver's pipe carries it in a
position frame ahead of the feed's frames, and every event gets its record's LSN, even
when a feed reaches the child in several reads; bookkeeping records take LSNs too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kapok.core import changes as ch
from kapok.storage.archive import Archive, list_archive_files, read_archive_file
from kapok.storage.archiver import _archive, position_frame, positioned
from kapok.storage.events import archive_events
from kapok.storage.records import FrameReader, batch_rows, encode_batch, encode_payload
from kapok.storage.wal import WriteAheadLog

T0 = 1_700_000_000.0


def _published(code: str) -> ch.Published:
    return ch.Published(1, code, "orders", b"x", "", 0, T0, T0, 0.0, "p", "", None, ("g",))


def _life(code: str) -> list[ch.Change]:
    """Published, delivered, acked: three records, three events."""
    return [
        _published(code),
        ch.Delivered(code, "orders", "g", 1, T0 + 1),
        ch.Settled(code, "orders", "g", "consumed", "ack", T0 + 2),
    ]


def test_each_event_carries_the_lsn_of_its_record_and_bookkeeping_takes_lsns_too() -> None:
    changes: list[ch.Change] = [
        ch.GroupCreated("orders", "g", T0),  # LSN 100: no event
        *_life("c1"),  # 101, 102, 103
        ch.Settled("c2", "orders", "g", "dead", ch.EXPIRED, T0 + 3),  # 104: expired + dead_lettered
    ]
    events = archive_events(batch_rows(encode_payload(changes)), "r1", 100)
    assert [(e["ev"], e["run"], e["lsn"]) for e in events] == [
        ("published", "r1", 101),
        ("delivered", "r1", 102),
        ("acked", "r1", 103),
        ("expired", "r1", 104),
        ("dead_lettered", "r1", 104),
    ]
    assert len({(e["run"], e["lsn"], e["ev"]) for e in events}) == len(events)
    assert all(next(iter(e)) == "ev" for e in events)
    # Without a position (an older caller), no run and no LSN: the events as before.
    assert all("run" not in e and "lsn" not in e for e in archive_events(batch_rows(encode_payload(changes))))


def test_positioned_cuts_the_pipe_at_position_frames_and_carries_the_lsn_across_reads() -> None:
    one, two = encode_batch(_life("a")), encode_batch(_life("b"))
    stream = position_frame(7) + one + two + position_frame(40) + one
    parts = list(positioned(stream, None))
    assert parts == [(7, one + two), (40, one)]
    assert list(positioned(one, 13)) == [(13, one)]  # the rest of a feed, read later
    assert list(positioned(b"", 13)) == []
    assert list(positioned(one + position_frame(9), 13)) == [(13, one), (9, b"")]  # 9: the next read's
    assert [len(list(FrameReader(p).rows())) for _, p in parts] == [6, 3]


def test_the_child_numbers_a_feed_that_arrives_in_two_reads(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    first = position_frame(50) + encode_batch(_life("a"))
    rest = encode_batch(_life("b"))
    after = _archive(archive, first, None)
    assert after == 53
    assert _archive(archive, rest, after) == 56
    archive.close()
    events = [e for f in list_archive_files(tmp_path) for e in read_archive_file(f.path)]
    assert [(e["code"], e["lsn"]) for e in events] == [
        (c, n) for c, n in zip("aaabbb", range(50, 56), strict=True)
    ]
    assert {e["run"] for e in events} == {archive.run} and len(archive.run) == 16
    assert Archive(tmp_path / "other").run != archive.run  # a new run per archiver


class _Recorder:
    def __init__(self) -> None:
        self.fed: list[tuple[int, int]] = []  # (first LSN, records) per feed

    def feed(self, parts: list[bytes], count: int, first_lsn: int) -> None:
        self.fed.append((first_lsn, len(list(FrameReader(b"".join(parts)).rows()))))

    async def drain(self) -> None:
        pass

    def behind(self) -> bool:
        return False


async def test_the_wal_hands_over_each_feed_with_the_lsn_of_its_first_record(tmp_path: Path) -> None:
    recorder = _Recorder()
    wal = WriteAheadLog(tmp_path, policy="never", interval_ms=10, segment_max_bytes=1 << 20, archive=recorder)
    wal.start(1000)
    written: list[Any] = []
    for i in range(20):
        records = _life(f"m{i}")
        written += records
        future = wal.append(records)
        if i % 3 == 0 and future is not None:
            await future
        await asyncio.sleep(0)
    await wal.aclose()
    assert sum(n for _, n in recorder.fed) == len(written)
    lsn = 1000
    for first, n in recorder.fed:  # consecutive: each feed starts where the last ended
        assert first == lsn
        lsn += n


def test_a_read_that_ends_with_a_position_frame_numbers_the_next_reads_frames(tmp_path: Path) -> None:
    # The pipe may deliver a feed's position frame and its WAL frames in two reads. The LSN
    # used to be dropped then: the feed's events lost their run and LSN (the first feed of
    # a node: none had one yet), or took a stale LSN that another feed's events shared.
    archive = Archive(tmp_path)
    assert _archive(archive, position_frame(50), None) == 50
    assert _archive(archive, encode_batch(_life("a")), 50) == 53
    assert _archive(archive, encode_batch(_life("b")) + position_frame(80), 53) == 80
    assert _archive(archive, encode_batch(_life("c")), 80) == 83
    archive.close()
    events = [e for f in list_archive_files(tmp_path) for e in read_archive_file(f.path)]
    assert [(e["code"], e["run"], e["lsn"]) for e in events] == [
        *((c, archive.run, n) for c, n in zip("aaabbb", range(50, 56), strict=True)),
        *(("c", archive.run, n) for n in range(80, 83)),
    ]
