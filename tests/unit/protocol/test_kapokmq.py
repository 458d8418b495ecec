"""KapokMQ's frames: pushes are one JSON object per message, whatever the messages hold,
though they are encoded together and cut apart; the client's side reads what the node writes."""

from __future__ import annotations

import base64

import orjson
import pytest

from kapok.config import MqConfig
from kapok.core.broker import Broker, Draft
from kapok.errors import BadRequestError
from kapok.protocol.kapokmq import (
    OK,
    decode_produce,
    decode_push,
    decode_reply,
    encode_error,
    encode_produce,
    encode_pushes,
)

TRICKY = [
    b"plain",
    b'},{"MessageCode":"forged","MessageData":"x"}',
    b"line\nbreak\r\n and a tab\t",
    "ünïcødé ✓".encode(),
    b"\xff\xfe not UTF-8",
    b"",
]


def test_each_message_gets_its_own_complete_push_object() -> None:
    broker = Broker(MqConfig().settings(), 1)
    broker.subscribe("t", now=1000.0, prefetch=100)
    broker.publish([Draft("t", data) for data in TRICKY], 1000.0)
    broker.publish([Draft("t", b"later", delay_s=5)], 1001.5)
    msgs = sorted(broker.iter_messages(), key=lambda m: m.create_time)

    frames = encode_pushes(msgs)

    assert len(frames) == len(msgs) == len(TRICKY) + 1
    for frame, msg, data in zip(frames, msgs, [*TRICKY, b"later"], strict=True):
        try:
            text = data.decode()
        except UnicodeDecodeError:
            text = base64.b64encode(data).decode()
        assert orjson.loads(frame) == {
            "MessageCode": msg.code,
            "MessageData": text,
            "Topic": "t",
            "CreateTime": int(msg.create_time),
            "ConsumedTime": 0,
            "DelayTime": 5 if data == b"later" else 0,
            "Status": -1,
        }
    assert encode_pushes([]) == []


def test_a_push_reads_back_as_the_native_message_object() -> None:
    broker = Broker(MqConfig().settings(), 1)
    broker.subscribe("t", now=1000.0, prefetch=100)
    broker.publish([Draft("t", b"hello")], 1000.0)
    (msg,) = broker.iter_messages()
    (frame,) = encode_pushes([msg])
    got = decode_push(frame)
    assert got is not None
    assert (got["code"], got["topic"], got["data"], got["create_time"]) == (msg.code, "t", "hello", 1000)
    assert decode_push(b'{"code": -1, "msg": "no"}') is None  # a refusal holds no message


def test_a_garbled_push_is_an_error_not_a_silent_skip() -> None:
    with pytest.raises(BadRequestError):
        decode_push(b"not json")


def test_producer_frames_round_trip_and_replies_read_back() -> None:
    draft = decode_produce(encode_produce("x", 5), "t", "p")
    assert (draft.topic, draft.data, draft.delay_s, draft.producer_id) == ("t", b"x", 5.0, "p")
    assert decode_reply(OK) is None
    assert decode_reply(encode_error("queue is full").decode()) == "queue is full"
    assert decode_reply("something else") == "something else"
