"""Wire encoding of both protocols (pure: no I/O, no clock).

KapokMQ compatibility: producer frames are JSON objects whose keys Go would
have matched case-insensitively (``MessageData``, ``DelayTime``); pushes are
PascalCase JSON; control strings are raw text. The native protocol is JSON
with an ``op`` field; payloads travel as UTF-8 text, or base64 with
``"enc": "base64"`` when they are not valid UTF-8.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Any

import orjson

from kapok.core.broker import Draft
from kapok.core.model import Entry, Message
from kapok.errors import BadRequestError
from kapok.jsonlines import dumps_lines

__all__ = [
    "client_label",
    "compat_draft",
    "compat_fields_draft",
    "compat_pushes",
    "decode_object",
    "draft_from_json",
    "encode_data",
    "get_bool",
    "get_codes",
    "get_int",
    "get_number",
    "get_str",
    "message_json",
]

MAX_CODES = 10_000


def decode_object(raw: str | bytes, what: str = "frame") -> dict[str, Any]:
    """Parse one JSON object; anything else is a ``BadRequestError``."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequestError(f"{what} must be a JSON object, got {type(obj).__name__}")
    return obj


def get_str(obj: Mapping[str, Any], name: str, default: str | None = None, *, max_len: int = 255) -> str:
    value = obj.get(name, default)
    if value is None:
        raise BadRequestError(f"field {name!r} is required")
    if not isinstance(value, str):
        raise BadRequestError(f"field {name!r} must be a string, got {type(value).__name__}")
    if len(value) > max_len:
        raise BadRequestError(f"field {name!r} is longer than {max_len} characters")
    return value


def client_label(value: str, what: str) -> str:
    """A client-chosen name (producer id, client name) that is safe to journal and display."""
    if len(value) > 255 or not value.isprintable():
        raise BadRequestError(f"{what} must be at most 255 printable characters")
    return value


def get_int(obj: Mapping[str, Any], name: str, default: int | None = None, *, lo: int, hi: int) -> int:
    value = obj.get(name, default)
    if value is None:
        raise BadRequestError(f"field {name!r} is required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"field {name!r} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise BadRequestError(f"field {name!r} must be between {lo} and {hi}, got {value}")
    return value


def get_number(obj: Mapping[str, Any], name: str, default: float, *, lo: float, hi: float) -> float:
    value = obj.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequestError(f"field {name!r} must be a number, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise BadRequestError(f"field {name!r} must be between {lo:g} and {hi:g}, got {value}")
    return float(value)


def get_bool(obj: Mapping[str, Any], name: str, default: bool) -> bool:
    value = obj.get(name, default)
    if not isinstance(value, bool):
        raise BadRequestError(f"field {name!r} must be true or false, got {type(value).__name__}")
    return value


def get_codes(obj: Mapping[str, Any], name: str = "codes") -> list[str]:
    codes = obj.get(name)
    if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
        raise BadRequestError(f"field {name!r} must be a list of message codes (strings)")
    if len(codes) > MAX_CODES:
        raise BadRequestError(f"at most {MAX_CODES} codes per request")
    return codes


# ---------------------------------------------------------------- payloads


def decode_data(obj: Mapping[str, Any]) -> bytes:
    data = obj.get("data")
    if not isinstance(data, str):
        raise BadRequestError('field \'data\' must be a string (UTF-8 text, or base64 with "enc": "base64")')
    enc = obj.get("enc", "utf8")
    if enc == "utf8":
        return data.encode()
    if enc == "base64":
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequestError("field 'data' is not valid base64") from None
    raise BadRequestError(f'field \'enc\' must be "utf8" or "base64", got {enc!r}')


def encode_data(data: bytes, out: dict[str, Any]) -> None:
    try:
        out["data"] = data.decode()
    except UnicodeDecodeError:
        out["data"] = base64.b64encode(data).decode()
        out["enc"] = "base64"


MAX_DELAY_S = 10 * 365 * 86400.0


def draft_from_json(
    obj: Any, producer_id: str, *, default_topic: str | None = None, route_topic: str | None = None
) -> Draft:
    """A native message object -> ``Draft``.

    ``route_topic`` (HTTP: the topic in the URL) is the only topic allowed;
    ``default_topic`` (a ``pub`` frame's ``topic``) applies when the message names none.
    """
    if not isinstance(obj, dict):
        raise BadRequestError("each message must be a JSON object")
    # Fast path for the common messages, {"data": "<text>"} and (what the client library
    # sends) {"data": "<text>", "dedup_id": "<id>"}: nothing else to check.
    size = len(obj)
    if size <= 2 and type(obj.get("data")) is str and (route_topic or default_topic):
        topic = route_topic or default_topic
        assert topic is not None
        dedup = obj.get("dedup_id", "") if size == 2 else ""
        if len(topic) <= 255 and type(dedup) is str and (size == 1 or 0 < len(dedup) <= 255):
            return Draft(topic, obj["data"].encode(), producer_id=producer_id, dedup_id=dedup)
    topic = get_str(obj, "topic", route_topic or default_topic)
    if route_topic is not None and topic != route_topic:
        raise BadRequestError(f"message names topic {topic!r} but was posted to {route_topic!r}")
    return Draft(
        topic=topic,
        data=decode_data(obj),
        key=get_str(obj, "key", ""),
        priority=get_int(obj, "priority", 0, lo=0, hi=9),
        delay_s=get_number(obj, "delay_s", 0.0, lo=0.0, hi=MAX_DELAY_S),
        deliver_at=get_number(obj, "deliver_at", 0.0, lo=0.0, hi=1e11),
        ttl_s=get_number(obj, "ttl_s", 0.0, lo=0.0, hi=MAX_DELAY_S),
        producer_id=producer_id,
        dedup_id=get_str(obj, "dedup_id", ""),
    )


def message_json(msg: Message, entry: Entry | None = None) -> dict[str, Any]:
    """The native view of a message (pushes, pull replies, console)."""
    # Built for one push per delivery: the common shape (UTF-8 data, no delay, no
    # headers) as one literal, with the same key order as the other shapes.
    try:
        out: dict[str, Any] = {"code": msg.code, "topic": msg.topic, "data": msg.data.decode()}
    except UnicodeDecodeError:
        out = {"code": msg.code, "topic": msg.topic}
        encode_data(msg.data, out)
    out["key"] = msg.key
    out["priority"] = msg.priority
    out["create_time"] = msg.create_time
    if msg.deliver_at > msg.create_time:
        out["deliver_at"] = msg.deliver_at
    if entry is not None:
        attempts = entry.attempts
        out["attempts"] = attempts
        out["redelivered"] = attempts > 1
    if msg.headers:
        out["headers"] = msg.headers
    return out


# ---------------------------------------------------------------- KapokMQ compatibility


def _ci(obj: Mapping[str, Any], name: str) -> Any:
    """Look a key up the way Go's encoding/json does: exact first, then case-insensitively."""
    if name in obj:
        return obj[name]
    lower = name.lower()
    for key, value in obj.items():
        if key.lower() == lower:
            return value
    return None


def compat_draft(raw: str | bytes, topic: str, producer_id: str) -> Draft:
    """A KapokMQ producer frame ``{"MessageData": "...", "DelayTime": 0}`` -> ``Draft``."""
    obj = decode_object(raw, "message")
    # Fast path: both keys spelled as KapokMQ's own clients send them (an exact key
    # wins over other spellings, as in ``_ci``), with the right types.
    data = obj.get("MessageData")
    delay = obj.get("DelayTime")
    if type(data) is str and type(delay) is int:
        if delay == 0:
            return Draft(topic, data.encode(), producer_id=producer_id)
        return compat_fields_draft(data, delay, topic, producer_id)
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
    return compat_fields_draft(data, delay, topic, producer_id)


def compat_fields_draft(data: str, delay: int, topic: str, producer_id: str) -> Draft:
    if not -(2**63) <= delay < 2**63:  # KapokMQ parses it as a Go int64
        raise BadRequestError("DelayTime is out of range")
    if delay > MAX_DELAY_S:
        raise BadRequestError(f"DelayTime must be at most {int(MAX_DELAY_S)} seconds")
    # KapokMQ delivers a negative delay at once but keeps it, and shows it: so does Kapok.
    return Draft(topic=topic, data=data.encode(), delay_s=float(delay), producer_id=producer_id)


def compat_message(msg: Message, now: float) -> dict[str, Any]:
    """The PascalCase message object of KapokMQ (pushes and the console API)."""
    return _compat_object(msg, int(msg.finished_at), msg.wire_status(now))


def _compat_object(msg: Message, consumed_time: int, status: int) -> dict[str, Any]:
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


def compat_pushes(msgs: list[Message]) -> list[bytes]:
    """The push frames of pending messages, one ``compat_message`` object each (one
    ``orjson.dumps`` for them all: a consumer is pushed a batch at a time)."""
    objects = [_compat_object(msg, 0, -1) for msg in msgs]  # pending: not consumed
    return dumps_lines(objects, "MessageCode").split(b"\n") if msgs else []
