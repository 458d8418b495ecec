"""Fuzzing every parser of outside input: nothing escapes but the documented errors.

* KapokMQ producer frames (``decode_produce``): a ``Draft`` or ``BadRequestError``.
* Native frames, through ``NativeConnection.handle`` on a real broker: every frame gets a
  reply or an ``error`` frame with a documented code, never ``internal`` (a bug's answer).
* WAL batches (``decode_payload``, ``FrameReader``): records or ``StorageError`` / a
  ``problem``; flipped bytes inside a frame with a good CRC reach the JSON decoder too.
* Gossip packets: ``Codec.decode`` returns a ``DecodeError``, never raises (also in
  ``tests/unit/cluster/test_codec.py``); here with authentic bodies of random shape.
* Replication frames: ``decode_control``, ``decode_records``, ``history_from_json`` give
  values or ``ReplicationError``.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kapok.cluster.codec import DECODE_REASONS, PLAIN_HEADER, Codec, DecodeError
from kapok.config import Config
from kapok.core import changes as ch
from kapok.core.model import Draft
from kapok.errors import BadRequestError, KapokError, ReplicationError, StorageError
from kapok.protocol.kapokmq import decode_produce
from kapok.protocol.native import draft_from_json
from kapok.protocol.sync import decode_control, decode_records, encode_records
from kapok.replication.protocol import history_from_json
from kapok.server.guard.clients import ClientInfo, Clients
from kapok.server.routes.v1_ws import NativeConnection
from kapok.service import BrokerService
from kapok.storage import records
from kapok.testing.clock import ManualClock

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _json_bytes(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS) if _dumpable(value) else b"null"


def _dumpable(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return False
    return True


# ---------------------------------------------------------------- KapokMQ producer frames

compat_objects = st.dictionaries(
    st.sampled_from(["MessageData", "messagedata", "DelayTime", "delaytime", "DELAYTIME", "other"]),
    scalars | st.lists(scalars, max_size=2),
    max_size=4,
)


@FUZZ
@given(st.binary(max_size=200) | compat_objects.map(orjson.dumps) | json_values.map(_json_bytes))
def test_compat_frames_are_a_draft_or_a_bad_request(raw: bytes) -> None:
    try:
        draft = decode_produce(raw, "t", "p")
    except BadRequestError as exc:
        assert exc.message
        return
    assert isinstance(draft, Draft) and draft.topic == "t" and isinstance(draft.data, bytes)


@FUZZ
@given(json_values)
def test_native_messages_are_a_draft_or_a_bad_request(obj: Any) -> None:
    try:
        draft = draft_from_json(obj, "p", default_topic="t")
    except BadRequestError:
        return
    assert isinstance(draft, Draft)


# ---------------------------------------------------------------- native frames


class _Outbox:
    """Collects what a connection sends (the frames are JSON payloads)."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.on_room: Any = None
        self.free_bytes = 1 << 20

    def send(self, frame: bytes, **_: Any) -> None:
        self.frames.append(orjson.loads(frame))


ops = st.sampled_from(
    ["pub", "sub", "unsub", "ack", "nack", "touch", "credit", "ping", "pong", "nope", 5, None]
)
native_frames = st.fixed_dictionaries(
    {"op": ops},
    optional={
        "id": scalars,
        "msgs": st.lists(json_values | st.fixed_dictionaries({"data": st.text(max_size=10)}), max_size=3)
        | scalars,
        "topic": st.sampled_from(["t", "", "x" * 300, "a.dlq"]) | scalars,
        "sub": st.integers(-1, 3) | scalars,
        "codes": st.lists(st.text(max_size=32), max_size=3) | scalars,
        "prefetch": st.integers(-5, 2_000_000) | scalars,
        "group": st.sampled_from(["g", "~x", ""]) | scalars,
        "key": st.sampled_from(["a.*", "#", "a..b", ""]) | scalars,
        "ack": st.sampled_from(["manual", "auto", "x"]) | scalars,
        "weight": st.integers(-1, 2000) | scalars,
        "requeue": scalars,
    },
)
DOCUMENTED_CODES = {
    "bad_request", "unknown_op", "message_too_large", "queue_full", "rate_limited",
    "unknown_code", "not_found", "bad_subscription",
}  # fmt: skip


@FUZZ
@given(st.lists(native_frames.map(orjson.dumps) | st.binary(max_size=60), min_size=1, max_size=8))
def test_native_frames_get_documented_answers_only(frames: list[bytes]) -> None:
    cfg = Config.default()
    service = BrokerService(cfg, clock=ManualClock())
    outbox = _Outbox()
    conn = NativeConnection(service, Clients(cfg.server), outbox, ClientInfo("fuzz", "", 0.0, "v1"))  # type: ignore[arg-type]
    for raw in frames:
        conn.handle(raw)
    conn.close()
    for frame in outbox.frames:
        if frame["op"] == "error":
            assert frame["code"] in DOCUMENTED_CODES, frame
            assert frame["message"]


# ---------------------------------------------------------------- WAL records


def _valid_payload() -> bytes:
    published = ch.Published(1, "0" * 32, "t", b"data", "", 0, 1.0, 1.0, 0.0, "p", "", None, ("default",))
    settled = ch.Settled("0" * 32, "t", "default", "consumed", "ack", 2.0)
    return records.encode_payload([published, settled])


@FUZZ
@given(st.binary(max_size=300))
def test_random_wal_payloads_are_records_or_a_storage_error(payload: bytes) -> None:
    try:
        out = records.decode_payload(payload) if payload else []
    except StorageError:
        return
    assert all(isinstance(r, ch.Change) for r in out)


@FUZZ
@given(st.data())
def test_damaged_wal_batches_with_a_good_crc_are_caught_by_the_decoder(data: st.DataObject) -> None:
    payload = bytearray(_valid_payload())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(payload) - 1))
        payload[i] = data.draw(st.integers(0, 255))
    # Re-framed with its own CRC, so the damage gets past the checksum to the decoder.
    framed = records.frame(bytes(payload))
    reader = records.FrameReader(framed)
    out = list(reader)
    assert all(isinstance(r, ch.Change) for r in out)
    assert reader.problem is None or isinstance(reader.problem, str)
    assert 0 <= reader.good_end <= len(framed)


@FUZZ
@given(st.binary(max_size=400))
def test_random_wal_files_end_in_a_problem_never_an_exception(buf: bytes) -> None:
    decoded = records.decode_frames(buf)
    assert 0 <= decoded.good_end <= len(buf)
    assert decoded.records == [] or decoded.good_end > 0


# ---------------------------------------------------------------- gossip packets


@FUZZ
@given(json_values)
def test_authentic_gossip_bodies_of_any_shape_decode_or_are_dropped(value: Any) -> None:
    result = Codec().decode(bytes([PLAIN_HEADER]) + _json_bytes([value, value]))
    if isinstance(result, DecodeError):
        assert result.reason in DECODE_REASONS
    else:
        assert isinstance(result, tuple)


# ---------------------------------------------------------------- replication frames


@FUZZ
@given(st.binary(max_size=200) | json_values.map(_json_bytes) | st.text(max_size=50))
def test_control_frames_are_a_dict_with_a_known_op_or_a_replication_error(raw: bytes | str) -> None:
    try:
        frame = decode_control(raw)
    except ReplicationError:
        return
    assert isinstance(frame, dict) and isinstance(frame["op"], str)


@FUZZ
@given(st.binary(max_size=64))
def test_records_frames_are_parsed_or_refused(raw: bytes) -> None:
    try:
        first, count, payload = decode_records(raw)
    except ReplicationError:
        return
    assert first >= 0 and count >= 1 and isinstance(payload, memoryview)


@FUZZ
@given(st.integers(0, 2**64 - 1), st.integers(1, 2**32 - 1), st.binary(max_size=30))
def test_records_frames_round_trip(first: int, count: int, payload: bytes) -> None:
    assert decode_records(encode_records(first, count, payload))[:2] == (first, count)


@FUZZ
@given(json_values)
def test_histories_are_valid_or_a_replication_error(value: Any) -> None:
    try:
        history = history_from_json(value)
    except ReplicationError:
        return
    assert history and all(isinstance(e, int) and isinstance(lsn, int) for e, lsn in history)


def test_the_fuzzed_errors_are_kapok_errors() -> None:
    for cls in (BadRequestError, StorageError, ReplicationError):
        assert issubclass(cls, KapokError)
