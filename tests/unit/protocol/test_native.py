"""The native protocol's frames: what the client's encoders write is what the node's
decoders read, and the other way round."""

from __future__ import annotations

import orjson
import pytest

from kapok.config import MqConfig
from kapok.core.broker import Broker, Draft
from kapok.errors import BadRequestError, QueueFullError, UnknownCodeError
from kapok.protocol.native import (
    decode_frame,
    draft_from_json,
    encode_error,
    encode_msg,
    encode_ok,
    encode_pub,
    encode_puback,
    encode_settle,
    encode_sub,
    encode_subok,
    message_json,
)


def test_a_pub_frame_decodes_into_drafts() -> None:
    msgs = [
        {"data": "a"},
        {"data": "b", "dedup_id": "d1"},
        {"data": "/w==", "enc": "base64", "topic": "u", "key": "k"},
    ]
    frame = decode_frame(encode_pub(7, msgs, topic="t"))
    assert (frame["op"], frame["id"]) == ("pub", 7)
    drafts = [draft_from_json(m, "p", default_topic=frame["topic"]) for m in frame["msgs"]]
    assert [(d.topic, d.data, d.dedup_id, d.key) for d in drafts] == [
        ("t", b"a", "", ""),
        ("t", b"b", "d1", ""),
        ("u", b"\xff", "", "k"),
    ]
    assert "topic" not in decode_frame(encode_pub(8, msgs))


def test_sub_leaves_out_what_the_node_decides() -> None:
    frame = decode_frame(encode_sub(1, "t", "auto", group="g", key=None, prefetch=50, weight=None))
    assert frame == {"op": "sub", "id": 1, "topic": "t", "ack": "auto", "group": "g", "prefetch": 50}


def test_settles() -> None:
    assert decode_frame(encode_settle("ack", 3, ["c"])) == {"op": "ack", "sub": 3, "codes": ["c"]}
    assert decode_frame(encode_settle("nack", 3, ["c"], False))["requeue"] is False
    assert "requeue" not in decode_frame(encode_settle("touch", 3, ["c"]))


def test_replies_and_errors() -> None:
    assert decode_frame(encode_puback(2, ["x"])) == {"op": "puback", "id": 2, "codes": ["x"]}
    assert decode_frame(encode_subok(2, 9, "g", 10)) == {
        "op": "subok",
        "id": 2,
        "sub": 9,
        "group": "g",
        "prefetch": 10,
    }
    assert decode_frame(encode_ok(4, prefetch=3)) == {"op": "ok", "id": 4, "prefetch": 3}
    unknown = decode_frame(encode_error(UnknownCodeError("not held", ["c1"]), 5))
    assert (unknown["op"], unknown["id"], unknown["codes"]) == ("error", 5, ["c1"])
    full = decode_frame(encode_error(QueueFullError("full"), None))
    assert (full["code"], full["message"], "codes" in full) == (QueueFullError.code, "full", False)


def test_a_pushed_message_carries_its_payload_whatever_the_bytes() -> None:
    broker = Broker(MqConfig().settings(), 1)
    broker.subscribe("t", now=1000.0, prefetch=10)
    broker.publish([Draft("t", b"text"), Draft("t", b"\xff\x00", key="k", delay_s=5)], 1000.0)
    msgs = sorted(broker.iter_messages(), key=lambda m: m.deliver_at)
    frame = decode_frame(encode_msg(1, [message_json(m) for m in msgs]))
    again = [draft_from_json(m, "p") for m in frame["msgs"]]
    assert [(d.topic, d.data, d.key) for d in again] == [("t", b"text", ""), ("t", b"\xff\x00", "k")]
    assert frame["msgs"][1]["deliver_at"] == 1005.0


@pytest.mark.parametrize("raw", [b"", b"nope", b"[1]", b'"op"'])
def test_a_frame_that_is_not_a_json_object_is_a_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequestError):
        decode_frame(raw)


def test_frames_are_compact_json() -> None:
    # One frame per request: orjson's compact form, no whitespace to pay for on the wire.
    assert b" " not in encode_pub(1, [{"data": "x"}], "t")
    assert orjson.loads(encode_pub(1, [{"data": "x"}], "t"))["msgs"] == [{"data": "x"}]
