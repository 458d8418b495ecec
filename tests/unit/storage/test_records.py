"""Property tests of the frame codec (``kapok.storage.records``).

Every change record type survives ``encode`` → ``decode_frames`` unchanged
(binary payloads, any unicode, headers or none, group tuples, floats). A
stream cut at *every* byte offset yields exactly the records wholly before
the cut, ``good_end`` on the last frame boundary, and a ``problem`` unless
the cut is on a boundary. A single flipped bit anywhere stops decoding at
the damaged frame: never an exception, never a wrong record. An END frame
closes a snapshot (``ended``) and nothing after it is read. ``FrameReader``
(what recovery streams with, over mapped files) agrees with ``decode_frames``.
"""

from __future__ import annotations

import itertools
import struct
import tempfile
import zlib
from pathlib import Path

import hypothesis.strategies as st
import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from kapok.core import changes as ch
from kapok.storage.records import (
    HEADER,
    MAX_PAYLOAD,
    FrameReader,
    decode_frames,
    encode,
    encode_all,
    encode_batch,
    encode_end,
)
from kapok.storage.snapshot import map_file

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- strategies

# orjson writes JSON integers up to 64 bits; the broker's sequence numbers and
# attempt counts live far below that.
ints = st.integers(min_value=0, max_value=2**63 - 1)
small_ints = st.integers(min_value=-(2**31), max_value=2**31)
floats = st.floats(allow_nan=False, allow_infinity=False)
texts = st.text(max_size=30)  # hypothesis' text never holds lone surrogates (not UTF-8)
headers = st.none() | st.dictionaries(texts, texts, max_size=4)

published = st.builds(
    ch.Published,
    seq=ints,
    code=texts,
    topic=texts,
    data=st.binary(max_size=200),
    key=texts,
    priority=small_ints,
    create_time=floats,
    deliver_at=floats,
    expire_at=floats,
    producer_id=texts,
    dedup_id=texts,
    headers=headers,
    groups=st.lists(texts, max_size=4).map(tuple),
)
group_created = st.builds(ch.GroupCreated, topic=texts, group=texts, at=floats)
# A delivery's trailing fields: no claim and no lease, or a claim with its lease; and a
# consumer or none (each combination is a row shape of its own).
claims = st.just(("", 0.0)) | st.tuples(texts.filter(bool), floats)


def _delivered(
    code: str, topic: str, group: str, attempts: int, at: float, claim: tuple[str, float], consumer: str
) -> ch.Delivered:
    return ch.Delivered(code, topic, group, attempts, at, claim[0], claim[1], consumer)


delivered = st.builds(
    _delivered,
    code=texts,
    topic=texts,
    group=texts,
    attempts=ints,
    at=floats,
    claim=claims,
    consumer=texts,
)
requeued = st.builds(ch.Requeued, code=texts, topic=texts, group=texts, reason=texts, at=floats)
settled = st.builds(ch.Settled, code=texts, topic=texts, group=texts, status=texts, reason=texts, at=floats)
deleted = st.builds(ch.MessageDeleted, code=texts, at=floats)
deduped = st.builds(ch.Deduped, topic=texts, dedup_id=texts, code=texts, at=floats)
checkpoint = st.builds(ch.Checkpoint, next_seq=ints, at=floats)

any_record = st.one_of(published, group_created, delivered, requeued, settled, deleted, deduped, checkpoint)
record_lists = st.lists(any_record, min_size=1, max_size=6)

ALL_TYPES = (
    ch.Published,
    ch.GroupCreated,
    ch.Delivered,
    ch.Requeued,
    ch.Settled,
    ch.MessageDeleted,
    ch.Deduped,
    ch.Checkpoint,
)


def boundaries(records: list[ch.Change]) -> list[int]:
    """Offsets of every frame boundary of ``encode_all(records)``, 0 included."""
    return [0, *itertools.accumulate(len(encode(r)) for r in records)]


# ---------------------------------------------------------------- round trips


@SETTINGS
@given(record=any_record)
def test_every_record_round_trips(record: ch.Change) -> None:
    frame = encode(record)
    decoded = decode_frames(frame)
    assert decoded.records == [record]
    assert type(decoded.records[0]) is type(record)
    assert decoded.good_end == len(frame)
    assert decoded.problem is None
    assert not decoded.ended


@SETTINGS
@given(record=published)
def test_published_keeps_binary_data_and_types(record: ch.Published) -> None:
    (out,) = decode_frames(encode(record)).records
    assert isinstance(out, ch.Published)
    assert isinstance(out.data, bytes) and out.data == record.data
    assert isinstance(out.groups, tuple) and out.groups == record.groups
    assert out.headers == record.headers
    assert (out.headers is None) == (record.headers is None)
    for name in ("create_time", "deliver_at", "expire_at"):
        assert getattr(out, name) == getattr(record, name)


@pytest.mark.parametrize("cls", ALL_TYPES)
def test_each_type_round_trips_alone_and_in_a_mixed_batch(cls: type) -> None:
    examples: dict[type, ch.Change] = {
        ch.Published: ch.Published(
            1, "c", "t", b"\x00\xff", "k", 3, 1.5, 2.5, 0.0, "p", "d", {"h": "v"}, ("g",)
        ),
        ch.GroupCreated: ch.GroupCreated("t", "g", 1.0),
        ch.Delivered: ch.Delivered("c", "t", "g", 2, 1.0),
        ch.Requeued: ch.Requeued("c", "t", "g", "nack", 1.0),
        ch.Settled: ch.Settled("c", "t", "g", "consumed", "ack", 1.0),
        ch.MessageDeleted: ch.MessageDeleted("c", 1.0),
        ch.Deduped: ch.Deduped("t", "d", "c", 1.0),
        ch.Checkpoint: ch.Checkpoint(7, 1.0),
    }
    assert decode_frames(encode(examples[cls])).records == [examples[cls]]
    mixed = [*examples.values(), examples[cls]]
    assert decode_frames(encode_batch(mixed)).records == mixed


@SETTINGS
@given(records=record_lists)
def test_a_stream_round_trips_in_order(records: list[ch.Change]) -> None:
    buf = encode_all(records)
    decoded = decode_frames(buf)
    assert decoded.records == records
    assert decoded.good_end == len(buf)
    assert decoded.problem is None
    # ``start`` skips whole frames.
    marks = boundaries(records)
    for i, mark in enumerate(marks):
        assert decode_frames(buf, mark).records == records[i:]
    # A memoryview reads the same as bytes.
    assert decode_frames(memoryview(buf)).records == records


def test_empty_buffer() -> None:
    decoded = decode_frames(b"")
    assert decoded.records == [] and decoded.good_end == 0
    assert decoded.problem is None and not decoded.ended


# ---------------------------------------------------------------- torn tails


@SETTINGS
@given(records=record_lists)
def test_a_cut_at_every_offset_keeps_exactly_the_whole_frames(records: list[ch.Change]) -> None:
    buf = encode_all(records)
    marks = boundaries(records)
    for cut in range(len(buf) + 1):
        decoded = decode_frames(buf[:cut])
        whole = sum(1 for m in marks[1:] if m <= cut)
        assert decoded.records == records[:whole], cut
        assert decoded.good_end == marks[whole], cut
        if cut in marks:
            assert decoded.problem is None, (cut, decoded.problem)
        else:
            assert decoded.problem is not None, cut
            assert "torn" in decoded.problem
        assert not decoded.ended


@SETTINGS
@given(records=record_lists, garbage=st.binary(min_size=1, max_size=40))
def test_garbage_after_the_last_frame_is_a_problem_not_a_record(
    records: list[ch.Change], garbage: bytes
) -> None:
    buf = encode_all(records)
    decoded = decode_frames(buf + garbage)
    # Garbage could by a 2**-32 chance be a valid frame; hypothesis never builds one.
    assert decoded.records == records
    assert decoded.good_end == len(buf)
    assert decoded.problem is not None


@SETTINGS
@given(records=record_lists, zeros=st.integers(1, 64))
def test_zero_fill_after_the_last_frame(records: list[ch.Change], zeros: int) -> None:
    # What a crashed file system may leave at the end of a preallocated file.
    buf = encode_all(records)
    decoded = decode_frames(buf + bytes(zeros))
    assert decoded.records == records
    assert decoded.good_end == len(buf)
    assert decoded.problem is not None


# ---------------------------------------------------------------- bit flips


@SETTINGS
@given(records=record_lists, data=st.data())
def test_a_single_bit_flip_stops_at_the_damaged_frame(records: list[ch.Change], data: st.DataObject) -> None:
    buf = bytearray(encode_all(records))
    offset = data.draw(st.integers(0, len(buf) - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    buf[offset] ^= 1 << bit
    marks = boundaries(records)
    damaged = max(i for i, m in enumerate(marks[:-1]) if m <= offset)
    decoded = decode_frames(bytes(buf))  # never raises
    # CRC-32 catches every single-bit error in the payload; a flipped length or
    # CRC field cannot describe a frame whose CRC matches either.
    assert decoded.records == records[:damaged]
    assert decoded.good_end == marks[damaged]
    assert decoded.problem is not None
    assert not decoded.ended


@SETTINGS
@given(records=record_lists, data=st.data())
def test_random_damage_never_raises_and_keeps_a_true_prefix(
    records: list[ch.Change], data: st.DataObject
) -> None:
    buf = bytearray(encode_all(records))
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        offset = data.draw(st.integers(0, len(buf) - 1))
        buf[offset] = data.draw(st.integers(0, 255))
    decoded = decode_frames(bytes(buf))
    n = len(decoded.records)
    assert decoded.records == records[:n]
    assert decoded.good_end == boundaries(records)[n]


def _frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"\x07[]", "unknown frame kind"),  # a kind byte nobody writes
        (b"\x09" + struct.pack("<I", 8) + b"not json", "undecodable"),
        (b"\x09" + struct.pack("<I", 7) + b"[[2,1]]", "undecodable"),  # wrong field count: TypeError
        (b"\x09" + struct.pack("<I", 1) + b"7", "undecodable"),  # not a list
        (b"\x09" + struct.pack("<I", 6) + b"[[42]]", "unknown record type"),
        (b"\x09\x00", "undecodable"),  # too short for its meta length
        (b"\x09" + struct.pack("<I", 500) + b"[]", "undecodable"),  # meta length past the end
        (b"\x09" + struct.pack("<I", 5) + b"[[1]]", "undecodable"),  # Published with too few fields
    ],
)
def test_a_crc_valid_but_malformed_body_is_a_problem_not_an_exception(payload: bytes, why: str) -> None:
    good = encode(ch.Checkpoint(3, 1.0))
    decoded = decode_frames(good + _frame(payload) + good)
    assert decoded.records == [ch.Checkpoint(3, 1.0)]
    assert decoded.good_end == len(good)
    assert decoded.problem is not None and why in decoded.problem


@pytest.mark.parametrize("length", [0, MAX_PAYLOAD + 1, 2**32 - 1])
def test_impossible_lengths(length: int) -> None:
    good = encode(ch.MessageDeleted("c", 1.0))
    decoded = decode_frames(good + HEADER.pack(length, 0) + b"x" * 16)
    assert decoded.records == [ch.MessageDeleted("c", 1.0)]
    assert decoded.good_end == len(good)
    assert decoded.problem is not None and "length" in decoded.problem


def test_unknown_kind_with_valid_json_body() -> None:
    body = orjson.dumps(["c", 1.0])
    decoded = decode_frames(_frame(b"\x63" + body))
    assert decoded.records == [] and decoded.good_end == 0
    assert decoded.problem is not None


# ---------------------------------------------------------------- END frames


@SETTINGS
@given(records=st.lists(any_record, max_size=5), after=st.lists(any_record, max_size=3))
def test_end_closes_the_stream(records: list[ch.Change], after: list[ch.Change]) -> None:
    head = encode_all(records) + encode_end()
    decoded = decode_frames(head + encode_all(after) + b"trailing garbage")
    assert decoded.records == records
    assert decoded.ended
    assert decoded.problem is None
    assert decoded.good_end == len(head)


@SETTINGS
@given(records=st.lists(any_record, max_size=5))
def test_a_snapshot_cut_before_its_end_is_not_ended(records: list[ch.Change]) -> None:
    full = encode_all(records) + encode_end()
    for cut in range(len(full)):
        decoded = decode_frames(full[:cut])
        assert not decoded.ended, cut
        # Either a torn frame, or a clean boundary without END: never a complete snapshot.
        assert decoded.problem is not None or decoded.good_end == cut


def test_end_frame_alone() -> None:
    end = encode_end()
    decoded = decode_frames(end)
    assert decoded.records == [] and decoded.ended
    assert decoded.problem is None and decoded.good_end == len(end)
    # A flipped bit in the END frame is not an END.
    for offset in range(len(end)):
        for bit in range(8):
            damaged = bytearray(end)
            damaged[offset] ^= 1 << bit
            out = decode_frames(bytes(damaged))
            assert not out.ended and out.records == [] and out.problem is not None


# ---------------------------------------------------------------- FrameReader (streaming recovery)


def _damage(buf: bytes, data: st.DataObject) -> bytes:
    out = bytearray(buf)
    how = data.draw(st.sampled_from(["none", "flip", "cut", "garbage"]), label="damage")
    if how == "flip":
        out[data.draw(st.integers(0, len(out) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    elif how == "cut":
        del out[data.draw(st.integers(0, len(out))) :]
    elif how == "garbage":
        out += data.draw(st.binary(min_size=1, max_size=20))
    return bytes(out)


@SETTINGS
@given(records=record_lists, end=st.booleans(), data=st.data())
def test_frame_reader_agrees_with_decode_frames(
    records: list[ch.Change], end: bool, data: st.DataObject
) -> None:
    buf = _damage(encode_all(records) + (encode_end() if end else b""), data)
    decoded = decode_frames(buf)
    reader = FrameReader(buf)
    assert list(reader) == decoded.records
    assert (reader.good_end, reader.problem, reader.ended) == (
        decoded.good_end,
        decoded.problem,
        decoded.ended,
    )
    assert reader.count == len(decoded.records)
    # check() walks lengths and CRCs only; damage of that kind it sees the same way.
    checked = FrameReader(buf).check()
    assert (checked.good_end, checked.ended) == (decoded.good_end, decoded.ended)
    assert (checked.problem is None) == (decoded.problem is None)


@SETTINGS
@given(records=record_lists, data=st.data())
def test_frame_reader_over_a_mapped_file(records: list[ch.Change], data: st.DataObject) -> None:
    buf = _damage(encode_all(records), data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "wal-00000000000000000000.log"
        path.write_bytes(buf)
        mapped = map_file(path)
        reader = FrameReader(mapped)
        got = list(reader)
        del reader
        if hasattr(mapped, "close"):
            mapped.close()
    decoded = decode_frames(buf)
    assert got == decoded.records


def test_frame_reader_stops_at_end_without_reading_on() -> None:
    first = ch.Checkpoint(1, 2.0)
    buf = encode(first) + encode_end() + b"\xff" * 7
    reader = FrameReader(buf)
    assert list(reader) == [first]
    assert reader.ended and reader.problem is None
    assert reader.good_end == len(encode(first)) + len(encode_end())
