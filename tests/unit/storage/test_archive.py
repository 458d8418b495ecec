"""The analytics archive: event mapping, JSON lines, rotation, retention, crash damage."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import orjson
import pytest
from hypothesis import given

from kapok.core import changes as ch
from kapok.errors import StorageError
from kapok.storage.archive import Archive, list_archive_files, read_archive_file
from kapok.storage.events import archive_events, encode_events
from kapok.storage.records import batch_rows, encode_payload
from kapok.testing.clock import ManualClock

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def published(code: str = "c1", data: bytes = b"hello", topic: str = "orders") -> ch.Published:
    return ch.Published(
        seq=1, code=code, topic=topic, data=data, key="eu.fr", priority=3, create_time=T0,
        deliver_at=T0 + 5, expire_at=0.0, producer_id="p1", dedup_id="d1", headers={"h": "v"},
        groups=("g1", "g2"),
    )  # fmt: skip


def rows_of(changes: list[ch.Change]) -> list[list[Any]]:
    """The rows the WAL holds for ``changes``: what the archive reads."""
    return batch_rows(encode_payload(changes))


def delivered(code: str = "c1", at: float = T0 + 6) -> ch.Delivered:
    return ch.Delivered(code, "orders", "g1", 2, at)


# ---------------------------------------------------------------- event mapping


def test_every_record_type_maps_to_its_event() -> None:
    changes: list[ch.Change] = [
        ch.Checkpoint(next_seq=7, at=T0),
        ch.GroupCreated("orders", "g1", T0),
        published(),
        ch.Deduped("orders", "d1", "c1", T0),
        delivered(),
        ch.Requeued("c1", "orders", "g1", "nack", T0 + 7),
        ch.Settled("c1", "orders", "g1", "consumed", "ack", T0 + 8),
        ch.Settled("c1", "orders", "g2", "dead", "max_attempts", T0 + 9),
        ch.Settled("c2", "orders", "g1", "expired", "ttl", T0 + 10),
        ch.Settled("c3", "orders", "g1", "dropped", "overflow", T0 + 11),
        ch.MessageDeleted("c1", T0 + 12),
    ]
    assert archive_events(rows_of(changes)) == [
        {"ev": "published", "code": "c1", "topic": "orders", "t": T0, "create_time": T0,
         "deliver_at": T0 + 5, "size": 5, "producer": "p1", "priority": 3, "key": "eu.fr"},
        {"ev": "delivered", "code": "c1", "topic": "orders", "group": "g1", "t": T0 + 6, "attempt": 2},
        {"ev": "retried", "code": "c1", "topic": "orders", "group": "g1", "t": T0 + 7, "reason": "nack"},
        {"ev": "acked", "code": "c1", "topic": "orders", "group": "g1", "t": T0 + 8},
        {"ev": "dead_lettered", "code": "c1", "topic": "orders", "group": "g2", "t": T0 + 9,
         "reason": "max_attempts"},
        {"ev": "expired", "code": "c2", "topic": "orders", "group": "g1", "t": T0 + 10},
        {"ev": "dropped", "code": "c3", "topic": "orders", "group": "g1", "t": T0 + 11},
        {"ev": "deleted", "code": "c1", "t": T0 + 12},
    ]  # fmt: skip


def test_bookkeeping_records_make_no_events() -> None:
    bookkeeping: list[ch.Change] = [
        ch.Checkpoint(1, T0),
        ch.GroupCreated("t", "g", T0),
        ch.Deduped("t", "d", "c", T0),
    ]
    assert archive_events(rows_of(bookkeeping)) == []


def test_unknown_final_status_is_kept_under_its_own_name() -> None:
    (event,) = archive_events(rows_of([ch.Settled("c1", "t", "g", "vanished", "why", T0)]))
    assert event["ev"] == "vanished"


def test_size_counts_payload_bytes() -> None:
    (event,) = archive_events(rows_of([published(data="é".encode() * 10)]))
    assert event["size"] == 20


# Names that would fool a cut at the wrong place: the event separator, quotes, escapes.
tricky = st.text(max_size=12) | st.sampled_from(['},{"ev":', '"},{"ev":"', "\\", '\\"},{"ev":', "\n", "é"])


@given(st.lists(st.tuples(st.sampled_from("pdrsxm"), tricky, tricky, tricky), max_size=12))
def test_encode_events_is_one_line_per_event_exactly_as_orjson_writes_it(
    rows: list[tuple[str, str, str, str]],
) -> None:
    changes: list[ch.Change] = []
    for kind, code, topic, other in rows:
        if kind == "p":
            changes.append(
                ch.Published(1, code, topic, other.encode(), other, 0, T0, T0, 0.0, other, "", None, ())
            )
        elif kind == "d":
            changes.append(ch.Delivered(code, topic, other, 1, T0))
        elif kind == "r":
            changes.append(ch.Requeued(code, topic, other, other, T0))
        elif kind == "s":
            changes.append(ch.Settled(code, topic, other, "dead", other, T0))
        elif kind == "x":
            changes.append(ch.Settled(code, topic, other, other, other, T0))
        else:
            changes.append(ch.MessageDeleted(code, T0))
    events = archive_events(rows_of(changes))
    chunk, count = encode_events(rows_of(changes))
    assert count == len(events)
    assert chunk == b"".join(orjson.dumps(e) + b"\n" for e in events)


# ---------------------------------------------------------------- writing


def line_bytes(change: ch.Change) -> int:
    (event,) = archive_events(rows_of([change]))
    return len(orjson.dumps(event)) + 1


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def all_events(directory: Path) -> list[dict[str, object]]:
    return [e for f in list_archive_files(directory) for e in read_archive_file(f.path)]


def test_writes_json_lines_to_a_named_file(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    directory = tmp_path / "data" / "archive"  # created on demand, parents too
    arch = Archive(directory, clock=clock.time)
    arch.write(rows_of([published(), delivered()]))
    arch.close()
    (only,) = list(directory.iterdir())
    assert only.name == "archive-20231114T221320-0.jsonl"
    raw = only.read_bytes()
    assert raw.endswith(b"\n")
    parsed = [json.loads(line) for line in raw.decode().splitlines()]  # the standard library agrees
    assert parsed == archive_events(rows_of([published(), delivered()]))
    assert arch.events_written == 2 and arch.events_lost == 0


def test_events_are_buffered_until_flush(tmp_path: Path) -> None:
    arch = Archive(tmp_path, buffer_bytes=1 << 20)
    arch.write(rows_of([published()]))
    path = arch.current_path
    assert path is not None and path.read_bytes() == b""
    arch.flush()
    assert len(read_archive_file(path)) == 1
    arch.close()


def test_a_full_buffer_is_written_without_flush(tmp_path: Path) -> None:
    arch = Archive(tmp_path, buffer_bytes=100)
    arch.write(rows_of([published(code=f"c{i}") for i in range(5)]))
    path = arch.current_path
    assert path is not None and len(read_archive_file(path)) >= 4
    arch.close()
    assert len(read_archive_file(path)) == 5


def test_write_after_close_raises(tmp_path: Path) -> None:
    arch = Archive(tmp_path)
    arch.close()
    arch.close()  # idempotent
    with pytest.raises(StorageError, match="closed"):
        arch.write(rows_of([published()]))


def test_records_without_events_create_no_file(tmp_path: Path) -> None:
    arch = Archive(tmp_path / "a")
    arch.write(rows_of([ch.Checkpoint(1, T0)]))
    arch.close()
    assert not (tmp_path / "a").exists()


def test_an_idle_archive_keeps_quiet_before_its_first_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    arch = Archive(tmp_path / "a")
    arch.maintain()  # the archiver does this every 10 s, events or not
    arch.close()
    assert not (tmp_path / "a").exists()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# ---------------------------------------------------------------- rotation


def test_rotates_by_size(tmp_path: Path) -> None:
    one_line = line_bytes(published(code="c00"))
    clock = ManualClock(T0)
    arch = Archive(tmp_path, rotate_bytes=3 * one_line, buffer_bytes=1, clock=clock.time)
    arch.write(rows_of([published(code=f"c{i:02d}") for i in range(10)]))  # same length each
    arch.close()
    files = list_archive_files(tmp_path)
    assert [f.n for f in files] == [0, 1, 2, 3]
    assert [f.size for f in files] == [3 * one_line] * 3 + [one_line]
    assert [e["code"] for e in all_events(tmp_path)] == [f"c{i:02d}" for i in range(10)]


def test_a_line_larger_than_rotate_bytes_gets_a_file_of_its_own(tmp_path: Path) -> None:
    arch = Archive(tmp_path, rotate_bytes=10)
    arch.write(rows_of([published(code="a"), published(code="b")]))
    arch.close()
    assert [len(read_archive_file(f.path)) for f in list_archive_files(tmp_path)] == [1, 1]


def test_rotates_by_age(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    arch = Archive(tmp_path, rotate_s=60, clock=clock.time)
    arch.write(rows_of([published(code="a")]))
    clock.advance(59)
    arch.write(rows_of([published(code="b")]))
    clock.advance(1)
    arch.write(rows_of([published(code="c")]))
    arch.close()
    files = list_archive_files(tmp_path)
    assert [f.path.name for f in files] == [
        "archive-20231114T221320-0.jsonl",
        "archive-20231114T221420-1.jsonl",
    ]
    assert [[e["code"] for e in read_archive_file(f.path)] for f in files] == [["a", "b"], ["c"]]


def test_maintain_closes_an_idle_file_that_is_due(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    arch = Archive(tmp_path, rotate_s=60, clock=clock.time)
    arch.write(rows_of([published()]))
    clock.advance(30)
    arch.maintain()
    path = arch.current_path
    assert path is not None and len(read_archive_file(path)) == 1  # maintain flushes
    clock.advance(30)
    arch.maintain()
    assert arch.current_path is None
    arch.close()


def test_a_new_archive_never_appends_to_an_old_file(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    first = Archive(tmp_path, clock=clock.time)
    first.write(rows_of([published(code="a")]))
    first.close()
    second = Archive(tmp_path, clock=clock.time)  # same second: the counter keeps names apart
    second.write(rows_of([published(code="b")]))
    second.close()
    files = list_archive_files(tmp_path)
    assert [f.path.name for f in files] == [
        "archive-20231114T221320-0.jsonl",
        "archive-20231114T221320-1.jsonl",
    ]
    assert [e["code"] for e in all_events(tmp_path)] == ["a", "b"]


def test_an_unusable_directory_is_a_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    arch = Archive(blocker / "archive")
    with pytest.raises(StorageError, match="cannot create"):
        arch.write(rows_of([published()]))
    assert arch.events_lost == 1


# ---------------------------------------------------------------- retention


def test_retention_deletes_oldest_files_over_max_bytes(tmp_path: Path) -> None:
    one_line = line_bytes(published(code="c00"))
    clock = ManualClock(T0)
    arch = Archive(tmp_path, rotate_bytes=one_line, max_bytes=3 * one_line, clock=clock.time)
    for i in range(6):
        arch.write(rows_of([published(code=f"c{i:02d}")]))
        clock.advance(1)
    # Writing c05 closed c04's file; retention then kept c02..c04 (3 lines' worth).
    assert [f.n for f in list_archive_files(tmp_path)] == [2, 3, 4, 5]
    arch.close()
    assert [e["code"] for e in all_events(tmp_path)] == ["c02", "c03", "c04", "c05"]


def test_retention_deletes_files_older_than_max_age(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    arch = Archive(tmp_path, rotate_s=100, max_age_s=250, clock=clock.time)
    for code in "abcd":
        arch.write(rows_of([published(code=code)]))
        clock.advance(100)
    arch.flush()
    # Now T0+400. Opening d's file (T0+300) closed c's file and applied retention at T0+300:
    # a (T0) was 300 s old, b (T0+100) exactly 200 s. A later maintain at T0+400 removes b.
    assert [e["code"] for e in all_events(tmp_path)] == ["b", "c", "d"]
    arch.maintain()  # d's file is due (100 s old): closed, then retention
    assert [e["code"] for e in all_events(tmp_path)] == ["c", "d"]
    arch.close()


def test_retention_runs_on_startup_and_ignores_foreign_files(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    old = Archive(tmp_path, clock=clock.time)
    old.write(rows_of([published(code="old")]))
    old.close()
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "archive-bogus.jsonl").write_text("keep me too")
    clock.advance(8 * 86400)
    new = Archive(tmp_path, clock=clock.time)
    new.write(rows_of([published(code="new")]))
    new.close()
    assert [e["code"] for e in all_events(tmp_path)] == ["new"]
    assert [f.n for f in list_archive_files(tmp_path)] == [1]
    assert (tmp_path / "notes.txt").exists() and (tmp_path / "archive-bogus.jsonl").exists()


# ---------------------------------------------------------------- damage


def test_a_cut_file_loses_only_its_last_line(tmp_path: Path) -> None:
    arch = Archive(tmp_path)
    expected = archive_events(rows_of([published(code=f"c{i}") for i in range(5)]))
    arch.write(rows_of([published(code=f"c{i}") for i in range(5)]))
    path = arch.current_path
    arch.close()
    assert path is not None
    raw = path.read_bytes()
    ends = [i + 1 for i, b in enumerate(raw) if b == ord("\n")]
    for cut in range(len(raw) + 1):  # a crash may stop the file at any byte
        path.write_bytes(raw[:cut])
        complete = sum(1 for end in ends if end <= cut)
        assert read_archive_file(path) == expected[:complete]


def test_a_bad_line_before_the_end_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "archive-20231114T221320-0.jsonl"
    path.write_bytes(b'{"ev":"published"}\n{"ev":\n{"ev":"acked"}\n')
    with pytest.raises(StorageError, match="line 2"):
        read_archive_file(path)


def test_a_failed_write_damages_only_the_last_line_of_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(T0)
    arch = Archive(tmp_path, clock=clock.time)
    arch.write(rows_of([published(code="a"), published(code="b")]))
    arch.flush()
    real_write = os.write

    def disk_full(fd: int, data: bytes) -> int:  # a short write, then the disk is full
        monkeypatch.setattr(os, "write", full)
        return real_write(fd, memoryview(data)[: len(data) // 4])  # half of "c"

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    arch.write(rows_of([published(code="c"), published(code="d")]))
    with pytest.raises(StorageError, match="No space left on device; 2 events lost"):
        arch.flush()
    assert arch.events_lost == 2 and arch.current_path is None
    monkeypatch.setattr(os, "write", real_write)
    arch.write(rows_of([published(code="e")]))  # goes to a new file
    arch.close()
    files = list_archive_files(tmp_path)
    assert len(files) == 2
    damaged = lines_of(files[0].path)
    assert damaged[-1] and damaged[-1].startswith(b'{"ev":"published","code":"c"')  # cut, no newline
    assert [e["code"] for e in all_events(tmp_path)] == ["a", "b", "e"]
