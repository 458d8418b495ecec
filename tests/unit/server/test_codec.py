"""KapokMQ push frames (``kapok.server.codec.compat_pushes``): one JSON object per message,
whatever the messages hold, though they are encoded together and cut apart."""

from __future__ import annotations

import base64

import orjson

from kapok.config import MqConfig
from kapok.core.broker import Broker, Draft
from kapok.server.codec import compat_pushes

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

    frames = compat_pushes(msgs)

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
    assert compat_pushes([]) == []
