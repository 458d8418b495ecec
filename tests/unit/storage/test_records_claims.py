"""The claim of a ``Delivered`` record on disk (``kapok.storage.records``), old and new.

A record written before claims existed (a 6-item row) still decodes, unclaimed; an
unclaimed delivery is still written as that row, byte for byte; a claimed one carries
its claim and lease length, and the archive reads both kinds as ``delivered`` events.
"""

from __future__ import annotations

import struct
import zlib

import orjson

from kapok.core import changes as ch
from kapok.storage.events import archive_events
from kapok.storage.records import FrameReader, batch_rows, decode_frames, encode_batch, encode_payload

T0 = 1_700_000_000.0
CODE = "018bcfe5680000000000000000000001"


def old_frame(rows: list[list[object]]) -> bytes:
    """A batch frame as written before claims existed (built by hand, not by the codec)."""
    meta = orjson.dumps(rows)
    payload = bytes((9,)) + struct.pack("<I", len(meta)) + meta
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def test_an_old_delivered_record_decodes_unclaimed() -> None:
    frame = old_frame([[3, CODE, "t", "g", 2, T0]])
    decoded = decode_frames(frame)
    assert decoded.problem is None
    assert decoded.records == [ch.Delivered(CODE, "t", "g", 2, T0)]
    (record,) = decoded.records
    assert isinstance(record, ch.Delivered) and (record.claim, record.lease_s) == ("", 0.0)


def test_an_unclaimed_delivery_is_written_as_before() -> None:
    record = ch.Delivered(CODE, "t", "g", 2, T0)
    assert encode_batch([record]) == old_frame([[3, CODE, "t", "g", 2, T0]])


def test_a_claimed_delivery_round_trips() -> None:
    records: list[ch.Change] = [
        ch.Delivered(CODE, "t", "g", 1, T0, "spark:q1:b7:p0", 30.0),
        ch.Delivered(CODE, "t", "h", 1, T0),
    ]
    frame = encode_batch(records)
    assert list(FrameReader(frame)) == records
    assert batch_rows(encode_payload(records))[0] == [3, CODE, "t", "g", 1, T0, "spark:q1:b7:p0", 30.0]


def test_the_archive_reads_claimed_and_unclaimed_deliveries_alike() -> None:
    records: list[ch.Change] = [
        ch.Delivered(CODE, "t", "g", 1, T0, "c", 30.0),
        ch.Delivered(CODE, "t", "h", 3, T0),
    ]
    events = archive_events(batch_rows(encode_payload(records)))
    keys = ("ev", "code", "topic", "group", "t", "attempt")
    assert [{k: e.get(k) for k in keys} for e in events] == [
        {"ev": "delivered", "code": CODE, "topic": "t", "group": "g", "t": T0, "attempt": 1},
        {"ev": "delivered", "code": CODE, "topic": "t", "group": "h", "t": T0, "attempt": 3},
    ]
