"""Importing a KapokMQ data directory: gob-wrapped MQDATA, WAL.log, and the records made of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from kapok.core import changes as ch
from kapok.errors import StorageError
from kapok.storage.kapokmq_import import (
    check_message,
    kapokmq_records,
    read_gob_uint,
    read_kapokmq_dir,
    unwrap_gob_bytes,
)

A = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"  # pending, created second
B = "ffeeddccbbaa99887766554433221100"  # delayed 60 s, created first
C = "0123456789abcdef0123456789abcdef"  # only in the WAL, then consumed

# What Go's json.Marshal makes of KapokMQ's snapshot map: keys sorted, no spaces,
# and <, >, & escaped as \u003c, \u003e, \u0026.
SNAPSHOT_JSON = (
    rb'{"0a1b2c3d4e5f60718293a4b5c6d7e8f9":{"MessageCode":"0a1b2c3d4e5f60718293a4b5c6d7e8f9",'
    rb'"MessageData":"{\"id\":1,\"note\":\"\u003cb\u003e \u0026 x\"}","Topic":"orders",'
    rb'"CreateTime":1700000010,"ConsumedTime":0,"DelayTime":0,"Status":-1},'
    rb'"ffeeddccbbaa99887766554433221100":{"MessageCode":"ffeeddccbbaa99887766554433221100",'
    rb'"MessageData":"later","Topic":"orders","CreateTime":1700000000,"ConsumedTime":0,'
    rb'"DelayTime":60,"Status":0}}'
)
# gob stream of one []byte value: uint(message length = 1 + 1 + 3 + 426 = 431 = 0x01AF),
# int(type id 5) = 0x0A, singleton field delta 0x00, uint(426 = 0x01AA), the bytes. Both
# lengths are over 127, so each is 0xFE (minus two: two bytes follow) and big-endian bytes.
MQDATA = b"\xfe\x01\xaf" + b"\x0a" + b"\x00" + b"\xfe\x01\xaa" + SNAPSHOT_JSON

WAL = (
    # A again, as KapokMQ logged it on arrival (the snapshot has the same state)
    b'{"MessageCode":"0a1b2c3d4e5f60718293a4b5c6d7e8f9","MessageData":"{\\"id\\":1,\\"note\\":'
    b'\\"\\u003cb\\u003e \\u0026 x\\"}","Topic":"orders","CreateTime":1700000010,"ConsumedTime":0,'
    b'"DelayTime":0,"Status":-1}\n'
    # C arrives
    b'{"MessageCode":"0123456789abcdef0123456789abcdef","MessageData":"hello","Topic":"jobs",'
    b'"CreateTime":1700000020,"ConsumedTime":0,"DelayTime":0,"Status":-1}\n'
    # a line cut short (KapokMQ never fsyncs, and writes race with CleanWAL)
    b'{"MessageCode":"99999999999999999999999999999999","MessageDa\n'
    # C acknowledged: its full new state
    b'{"MessageCode":"0123456789abcdef0123456789abcdef","MessageData":"hello","Topic":"jobs",'
    b'"CreateTime":1700000020,"ConsumedTime":1700000030,"DelayTime":0,"Status":1}\n'
    # ...and the empty string after the final newline, KapokMQ's phantom "" record
)


def published(
    seq: int, code: str, topic: str, data: bytes, created: float, deliver_at: float
) -> ch.Published:
    return ch.Published(
        seq=seq, code=code, topic=topic, data=data, key="", priority=0, create_time=created,
        deliver_at=deliver_at, expire_at=0.0, producer_id="", dedup_id="", headers=None,
        groups=("default",),
    )  # fmt: skip


def message(code: str, **fields: Any) -> dict[str, Any]:
    base = {
        "MessageCode": code, "MessageData": "x", "Topic": "t", "CreateTime": 100,
        "ConsumedTime": 0, "DelayTime": 0, "Status": -1,
    }  # fmt: skip
    return base | fields


def make_dir(tmp_path: Path, mqdata: bytes | None = None, wal: bytes | None = None) -> Path:
    directory = tmp_path / "kapokmq"
    directory.mkdir(parents=True)
    if mqdata is not None:
        (directory / "MQDATA").write_bytes(mqdata)
    if wal is not None:
        (directory / "WAL.log").write_bytes(wal)
    return directory


# ---------------------------------------------------------------- the whole directory


def test_a_kapokmq_directory_becomes_the_expected_records(tmp_path: Path) -> None:
    assert len(SNAPSHOT_JSON) == 426
    result = read_kapokmq_dir(make_dir(tmp_path, MQDATA, WAL))
    assert (result.snapshot_count, result.wal_lines, result.wal_skipped) == (2, 4, 1)
    assert result.snapshot_skipped == 0
    assert result.problems == ["WAL.log line 3: not JSON; skipped"]
    assert sorted(m["MessageCode"] for m in result.messages) == sorted([A, B, C])
    assert "" not in {m["MessageCode"] for m in result.messages}  # no phantom

    records = kapokmq_records(result.messages, first_seq=10)
    assert records == [
        published(10, B, "orders", b"later", 1700000000.0, 1700000060.0),
        published(11, A, "orders", b'{"id":1,"note":"<b> & x"}', 1700000010.0, 1700000010.0),
        published(12, C, "jobs", b"hello", 1700000020.0, 1700000020.0),
        ch.Settled(C, "jobs", "default", "consumed", "imported", 1700000030.0),
    ]


def test_the_wal_overrides_the_snapshot(tmp_path: Path) -> None:
    acked = message(A, Status=1, ConsumedTime=1700000099, Topic="orders")
    wal = b"".join([orjson.dumps(acked), b"\n"])
    result = read_kapokmq_dir(make_dir(tmp_path, MQDATA, wal))
    (a,) = [m for m in result.messages if m["MessageCode"] == A]
    assert a["Status"] == 1 and a["ConsumedTime"] == 1700000099


def test_empty_or_missing_mqdata_is_fine(tmp_path: Path) -> None:
    wal = WAL.split(b"\n", 1)[0] + b"\n"  # A only
    empty = read_kapokmq_dir(make_dir(tmp_path / "empty", b"", wal))
    missing = read_kapokmq_dir(make_dir(tmp_path / "missing", None, wal))
    for result in (empty, missing):
        assert result.snapshot_count == 0
        assert [m["MessageCode"] for m in result.messages] == [A]
        assert result.problems == []


def test_snapshot_only(tmp_path: Path) -> None:
    result = read_kapokmq_dir(make_dir(tmp_path, MQDATA))
    assert (result.snapshot_count, result.wal_lines, result.wal_skipped) == (2, 0, 0)


def test_blank_lines_are_not_phantom_messages(tmp_path: Path) -> None:
    result = read_kapokmq_dir(make_dir(tmp_path, b"", b"\n\n  \n"))
    assert result.messages == [] and result.wal_lines == 0 and result.wal_skipped == 0


def test_missing_directory_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="does not exist"):
        read_kapokmq_dir(tmp_path / "nope")


def test_a_directory_without_kapokmq_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"neither MQDATA nor WAL\.log"):
        read_kapokmq_dir(tmp_path)


def test_a_custom_snapshot_name(tmp_path: Path) -> None:
    (tmp_path / "snap.bin").write_bytes(MQDATA)
    assert read_kapokmq_dir(tmp_path, snapshot_name="snap.bin").snapshot_count == 2


def test_garbage_mqdata_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="MQDATA: not a KapokMQ snapshot"):
        read_kapokmq_dir(make_dir(tmp_path, b"\x07\x00garbage\xff"))


def test_cut_off_mqdata_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"unreadable KapokMQ snapshot.*cut it off"):
        read_kapokmq_dir(make_dir(tmp_path, MQDATA[:300]))


def test_mqdata_with_a_wrong_gob_header_falls_back_to_the_json(tmp_path: Path) -> None:
    wrong_length = b"\xfe\x01\xb0" + MQDATA[3:]  # says one byte more than there is
    result = read_kapokmq_dir(make_dir(tmp_path, wrong_length))
    assert result.snapshot_count == 2
    (problem,) = result.problems
    assert problem.startswith("MQDATA: bad gob framing") and "used the JSON object inside" in problem
    bare = read_kapokmq_dir(make_dir(tmp_path / "x", SNAPSHOT_JSON + b"\n"))  # no gob at all
    assert bare.snapshot_count == 2


def test_mqdata_holding_json_that_is_not_an_object(tmp_path: Path) -> None:
    payload = b"[1,2]"
    gob = bytes([len(payload) + 3, 0x0A, 0x00, len(payload)]) + payload
    with pytest.raises(StorageError, match="expected a JSON object"):
        read_kapokmq_dir(make_dir(tmp_path, gob))


def test_bad_entries_are_skipped_and_counted(tmp_path: Path) -> None:
    good = message(A)
    table = {
        A: good,
        "x1": message(""),  # empty code
        "x2": message(B, Status=2),
        "x3": message(B, CreateTime="1700000000"),
        "x4": message(B, Status=True),  # a bool is not an int64
        "x5": message(B, Topic=""),
        "x6": [1, 2],
    }
    payload = orjson.dumps(table)
    assert 127 < len(payload) < 0xFFFF
    size = b"\xfe" + len(payload).to_bytes(2, "big")
    gob = b"\xfe" + (len(payload) + 5).to_bytes(2, "big") + b"\x0a\x00" + size + payload
    wal = b'{"MessageCode":""}\n"just a string"\n{"MessageCode":"abc","Topic":"t","CreateTime":1.5}\n'
    result = read_kapokmq_dir(make_dir(tmp_path, gob, wal))
    assert result.messages == [good]
    assert (result.snapshot_count, result.snapshot_skipped) == (1, 6)
    assert (result.wal_lines, result.wal_skipped) == (3, 3)
    assert len(result.problems) == 9
    assert f"MQDATA entry 'x2': message {B}: Status 2 is not -1, 0 or 1; skipped" in result.problems
    assert "WAL.log line 3: CreateTime is not an integer; skipped" in result.problems


def test_problem_list_is_bounded(tmp_path: Path) -> None:
    result = read_kapokmq_dir(make_dir(tmp_path, None, b"nope\n" * 250))
    assert result.wal_skipped == 250
    assert len(result.problems) == 101 and result.problems[-1] == "... and 150 more"


# ---------------------------------------------------------------- gob


@pytest.mark.parametrize(
    ("encoded", "value"),
    [
        (b"\x00", 0),
        (b"\x7f", 127),
        (b"\xff\x80", 128),
        (b"\xff\xff", 255),
        (b"\xfe\x01\x00", 256),
        (b"\xfe\x01\xaf", 431),
        (b"\xfd\x01\x00\x00", 65536),
        (b"\xf8" + b"\xff" * 8, 2**64 - 1),
    ],
)
def test_gob_uint(encoded: bytes, value: int) -> None:
    assert read_gob_uint(b"\x99" + encoded + b"\x99", 1) == (value, 1 + len(encoded))


@pytest.mark.parametrize("bad", [b"", b"\xfe\x01", b"\xf7" + b"\x00" * 9])
def test_bad_gob_uint(bad: bytes) -> None:
    with pytest.raises(ValueError, match="gob uint"):
        read_gob_uint(bad, 0)


def test_unwrap_gob_bytes() -> None:
    assert unwrap_gob_bytes(MQDATA) == SNAPSHOT_JSON
    assert unwrap_gob_bytes(b"\x05\x0a\x00\x02{}") == b"{}"  # short form: every length below 128
    with pytest.raises(ValueError, match="type id 6"):
        unwrap_gob_bytes(b"\x05\x0c\x00\x02{}")  # a string, not a []byte
    with pytest.raises(ValueError, match="field delta"):
        unwrap_gob_bytes(b"\x05\x0a\x01\x02{}")
    with pytest.raises(ValueError, match="says 3 bytes"):
        unwrap_gob_bytes(b"\x05\x0a\x00\x03{}")


# ---------------------------------------------------------------- records


def test_records_clamp_negative_delays_and_default_the_consumed_time() -> None:
    records = kapokmq_records(
        [message("b", CreateTime=200, DelayTime=-5, Status=1), message("a", CreateTime=200)],
        first_seq=1,
        default_group="legacy",
    )
    assert records == [
        ch.Published(1, "b", "t", b"x", "", 0, 200.0, 200.0, 0.0, "", "", None, ("legacy",)),
        ch.Settled("b", "t", "legacy", "consumed", "imported", 200.0),  # ConsumedTime 0
        ch.Published(2, "a", "t", b"x", "", 0, 200.0, 200.0, 0.0, "", "", None, ("legacy",)),
    ]  # equal CreateTime: input order


def test_records_refuse_invalid_or_repeated_messages() -> None:
    with pytest.raises(StorageError, match="empty MessageCode"):
        kapokmq_records([message("")], first_seq=1)
    with pytest.raises(StorageError, match="given twice"):
        kapokmq_records([message("a"), message("a")], first_seq=1)


def test_check_message_fills_go_zero_values() -> None:
    assert check_message({"MessageCode": "a", "Topic": "t"}) == {
        "MessageCode": "a", "MessageData": "", "Topic": "t", "CreateTime": 0,
        "ConsumedTime": 0, "DelayTime": 0, "Status": 0,
    }  # fmt: skip
    bad = {"MessageCode": "a", "Topic": "t", "MessageData": 5}
    assert check_message(bad) == "MessageData is not a string"
