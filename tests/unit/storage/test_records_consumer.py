"""The consumer of a ``Delivered`` record on disk (``kapok.storage.records``) and in the
archive (``kapok.storage.events``), in every shape a record has had.

Rows grow by trailing fields: 6 items before claims, 8 for a claimed delivery, 9 for one
that names its consumer. Old rows still decode (consumer ""); a delivery without a
consumer is still written as before, byte for byte; one with a consumer round-trips
through a WAL batch and a snapshot file; the archive's ``delivered`` event carries
``consumer`` exactly when the record names one.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import orjson
import pytest

from kapok.core import changes as ch
from kapok.storage.events import archive_events, encode_events
from kapok.storage.records import (
    FrameReader,
    batch_rows,
    decode_frames,
    encode_batch,
    encode_end,
    encode_payload,
)
from kapok.storage.snapshot import SnapshotWriter, find_newest

T0 = 1_700_000_000.0
CODE = "018bcfe5680000000000000000000001"


def hand_made_payload(rows: list[list[object]]) -> bytes:
    """A batch payload built by hand, as an older codec wrote it (not by this codec)."""
    meta = orjson.dumps(rows)
    return bytes((9,)) + struct.pack("<I", len(meta)) + meta


def hand_made_frame(rows: list[list[object]]) -> bytes:
    payload = hand_made_payload(rows)
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


# ---------------------------------------------------------------- old records


@pytest.mark.parametrize(
    ("row", "claim", "lease_s"),
    [
        ([3, CODE, "t", "g", 2, T0], "", 0.0),  # before claims
        ([3, CODE, "t", "g", 2, T0, "spark:q1:b7:p0", 30.0], "spark:q1:b7:p0", 30.0),  # claimed
    ],
    ids=["6 fields", "8 fields"],
)
def test_an_old_record_decodes_with_no_consumer(row: list[object], claim: str, lease_s: float) -> None:
    decoded = decode_frames(hand_made_frame([row]))
    assert decoded.problem is None
    assert decoded.records == [ch.Delivered(CODE, "t", "g", 2, T0, claim, lease_s)]
    (record,) = decoded.records
    assert isinstance(record, ch.Delivered) and record.consumer == ""


@pytest.mark.parametrize(
    ("record", "row"),
    [
        (ch.Delivered(CODE, "t", "g", 2, T0), [3, CODE, "t", "g", 2, T0]),
        (ch.Delivered(CODE, "t", "g", 2, T0, "c", 30.0), [3, CODE, "t", "g", 2, T0, "c", 30.0]),
    ],
    ids=["unclaimed", "claimed"],
)
def test_a_delivery_without_a_consumer_is_written_as_before(record: ch.Delivered, row: list[object]) -> None:
    assert encode_batch([record]) == hand_made_frame([row])


# ---------------------------------------------------------------- new records


def test_a_delivery_naming_its_consumer_round_trips_claimed_or_not() -> None:
    records: list[ch.Change] = [
        ch.Delivered(CODE, "t", "g", 1, T0, consumer="alice"),
        ch.Delivered(CODE, "t", "h", 3, T0 + 1, "spark:q1:b7:p0", 30.0, "conn-7@127.0.0.1:50312"),
        ch.Delivered(CODE, "t", "k", 1, T0 + 2),  # none: an old row in the same batch
    ]
    frame = encode_batch(records)
    assert list(FrameReader(frame)) == records
    rows = batch_rows(encode_payload(records))
    assert rows == [
        [3, CODE, "t", "g", 1, T0, "", 0.0, "alice"],
        [3, CODE, "t", "h", 3, T0 + 1, "spark:q1:b7:p0", 30.0, "conn-7@127.0.0.1:50312"],
        [3, CODE, "t", "k", 1, T0 + 2],
    ]


def test_a_consumer_name_of_any_text_round_trips() -> None:
    names = ["ünïcødé 消费者", 'quote " and \\ backslash', "x" * 255]
    records: list[ch.Change] = [ch.Delivered(CODE, "t", "g", 1, T0, consumer=name) for name in names]
    assert decode_frames(encode_batch(records)).records == records


def test_a_snapshot_file_keeps_the_consumer(tmp_path: Path) -> None:
    records: list[ch.Change] = [
        ch.Published(1, CODE, "t", b"d", "", 0, T0, T0, 0.0, "p", "", None, ("g", "h")),
        ch.Delivered(CODE, "t", "g", 1, T0, consumer="alice"),
        ch.Delivered(CODE, "t", "h", 2, T0, "c", 30.0, "bob"),
    ]
    writer = SnapshotWriter(tmp_path, 5, fsync=lambda fd: None)
    writer.write(encode_batch(records) + encode_end())
    writer.commit()
    found = find_newest(tmp_path)
    assert found.lsn == 5 and not found.skipped
    reader = found.reader()
    assert list(reader) == records
    assert reader.ended and reader.problem is None


# ---------------------------------------------------------------- the archive


def delivered_events(records: list[ch.Change]) -> list[dict[str, object]]:
    return archive_events(batch_rows(encode_payload(records)))


def test_the_archive_names_the_consumer_when_the_record_does() -> None:
    events = delivered_events(
        [
            ch.Delivered(CODE, "t", "g", 1, T0, consumer="alice"),
            ch.Delivered(CODE, "t", "g", 2, T0 + 1, "c", 30.0, "bob"),
            ch.Delivered(CODE, "t", "h", 1, T0 + 2),
            ch.Delivered(CODE, "t", "k", 1, T0 + 3, "c", 30.0),
        ]
    )
    base = {"ev": "delivered", "code": CODE, "topic": "t"}
    assert events == [
        {**base, "group": "g", "t": T0, "attempt": 1, "consumer": "alice"},
        {**base, "group": "g", "t": T0 + 1, "attempt": 2, "consumer": "bob"},
        {**base, "group": "h", "t": T0 + 2, "attempt": 1},
        {**base, "group": "k", "t": T0 + 3, "attempt": 1},
    ]


def test_the_archive_reads_every_row_shape_and_an_empty_name_as_none() -> None:
    rows: list[list[object]] = [
        [3, CODE, "t", "g", 1, T0],
        [3, CODE, "t", "g", 2, T0, "c", 30.0],
        [3, CODE, "t", "g", 3, T0, "", 0.0, ""],  # never written so; read as no consumer
        [3, CODE, "t", "g", 4, T0, "", 0.0, "alice"],
    ]
    events = archive_events(batch_rows(hand_made_payload(rows)))
    named = [(e["attempt"], e.get("consumer")) for e in events]
    assert named == [(1, None), (2, None), (3, None), (4, "alice")]


def test_archive_lines_carry_the_consumer_after_the_attempt_and_before_run_and_lsn() -> None:
    rows = batch_rows(encode_payload([ch.Delivered(CODE, "t", "g", 1, T0, consumer="alice")]))
    chunk, count = encode_events(rows, "00112233aabbccdd", 40)
    assert count == 1
    line = orjson.loads(chunk)
    assert list(line) == ["ev", "code", "topic", "group", "t", "attempt", "consumer", "run", "lsn"]
    assert line["consumer"] == "alice"
