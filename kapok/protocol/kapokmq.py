"""KapokMQ's protocol, byte for byte, so the clients written for it keep working.

A producer socket (``/Producers/Conn/{topic}/{id}``) sends one JSON object per message,
``{"MessageData": "<text>", "DelayTime": <seconds>}``, and is answered per frame, in
order: a raw ``ok``, or ``{"code": -1, "msg": "..."}``. A consumer socket
(``/Consumers/Conn/{topic}/{id}``) is pushed one PascalCase message object per frame and
acks with the raw message code. Both start with the secret-key handshake: the node asks
``ASK_KEY``, the client sends the key as text, the node answers ``KEY_OK`` or
``KEY_ERROR``. The KapokMQ console routes answer JSON with ``code`` 0 or -1.

Decoding is Go's: keys match case-insensitively when no key matches exactly.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson

from kapok.core.model import Draft
from kapok.errors import BadRequestError
from kapok.jsonlines import dumps_lines
from kapok.protocol.fields import decode_object
from kapok.protocol.native import MAX_DELAY_S

if TYPE_CHECKING:
    from kapok.core.model import Message

__all__ = [
    "ASK_KEY",
    "KEY_ERROR",
    "KEY_OK",
    "OK",
    "decode_produce",
    "decode_push",
    "decode_reply",
    "draft_from_fields",
    "encode_error",
    "encode_produce",
    "encode_pushes",
    "message_object",
]

ASK_KEY: Final = "Please enter the secret key"
KEY_OK: Final = "Secret key matching succeeded"
KEY_ERROR: Final = "Secret key matching error"
OK: Final = "ok"  # a producer frame stored


# ---------------------------------------------------------------- client side


def encode_produce(data: str, delay_s: int = 0) -> str:
    """A producer frame: one message."""
    return orjson.dumps({"MessageData": data, "DelayTime": delay_s}).decode()


def decode_reply(text: str) -> str | None:
    """A producer frame's answer: None when stored, else the node's reason."""
    if text == OK:
        return None
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    return str(obj.get("msg", text)) if isinstance(obj, dict) else text


def decode_push(text: str | bytes) -> dict[str, Any] | None:
    """A consumer push as a native message object; None for a reply that holds no message
    (``{"code": -1, ...}``); anything but a JSON object is a ``BadRequestError``."""
    push = decode_object(text, "push")
    if not isinstance(push.get("MessageCode"), str):
        return None
    return {
        "code": push["MessageCode"], "topic": push.get("Topic", ""), "data": push.get("MessageData", ""),
        "key": "", "priority": 0, "create_time": push.get("CreateTime", 0), "attempts": 0,
        "redelivered": False,
    }  # fmt: skip


# ---------------------------------------------------------------- node side


def encode_error(message: str) -> bytes:
    return orjson.dumps({"code": -1, "msg": message})


def _ci(obj: Mapping[str, Any], name: str) -> Any:
    """Look a key up the way Go's encoding/json does: exact first, then case-insensitively."""
    if name in obj:
        return obj[name]
    lower = name.lower()
    for key, value in obj.items():
        if key.lower() == lower:
            return value
    return None


def decode_produce(raw: str | bytes, topic: str, producer_id: str) -> Draft:
    """A producer frame ``{"MessageData": "...", "DelayTime": 0}`` -> ``Draft``."""
    obj = decode_object(raw, "message")
    # Fast path: both keys spelled as KapokMQ's own clients send them (an exact key
    # wins over other spellings, as in ``_ci``), with the right types.
    data = obj.get("MessageData")
    delay = obj.get("DelayTime")
    if type(data) is str and type(delay) is int:
        if delay == 0:
            return Draft(topic, data.encode(), producer_id=producer_id)
        return draft_from_fields(data, delay, topic, producer_id)
    data = _ci(obj, "MessageData")
    if data is None:  # KapokMQ stored an empty message; a frame without one is a mistake
        raise BadRequestError("MessageData is required: a producer frame carries one message")
    if not isinstance(data, str):
        raise BadRequestError("MessageData must be a string")
    delay = _ci(obj, "DelayTime")
    if delay is None:
        delay = 0
    if isinstance(delay, bool) or not isinstance(delay, int):
        raise BadRequestError("DelayTime must be an integer number of seconds")
    return draft_from_fields(data, delay, topic, producer_id)


def draft_from_fields(data: str, delay: int, topic: str, producer_id: str) -> Draft:
    """A message from its two fields (a producer frame's, or the HTTP form's)."""
    if not -(2**63) <= delay < 2**63:  # KapokMQ parses it as a Go int64
        raise BadRequestError("DelayTime is out of range")
    if delay > MAX_DELAY_S:
        raise BadRequestError(f"DelayTime must be at most {int(MAX_DELAY_S)} seconds")
    # KapokMQ delivers a negative delay at once but keeps it, and shows it: so does Kapok.
    return Draft(topic=topic, data=data.encode(), delay_s=float(delay), producer_id=producer_id)


def message_object(msg: Message, now: float) -> dict[str, Any]:
    """The PascalCase message object of KapokMQ (pushes and the console API)."""
    return _object(msg, int(msg.finished_at), msg.wire_status(now))


def _object(msg: Message, consumed_time: int, status: int) -> dict[str, Any]:
    try:
        text = msg.data.decode()
    except UnicodeDecodeError:
        text = base64.b64encode(msg.data).decode()
    created = msg.create_time
    return {
        "MessageCode": msg.code,
        "MessageData": text,
        "Topic": msg.topic,
        "CreateTime": int(created),
        "ConsumedTime": consumed_time,
        "DelayTime": round(msg.deliver_at - created),
        "Status": status,
    }


def encode_pushes(msgs: list[Message]) -> list[bytes]:
    """The push frames of pending messages, one ``message_object`` each (one
    ``orjson.dumps`` for them all: a consumer is pushed a batch at a time)."""
    objects = [_object(msg, 0, -1) for msg in msgs]  # pending: not consumed
    return dumps_lines(objects, "MessageCode").split(b"\n") if msgs else []
