"""The native protocol: JSON frames with an ``op`` over one WebSocket (``/v1/ws``).

Every request may carry an ``id``; replies and errors echo it.

    client -> server   pub, sub, unsub, ack, nack, touch, credit, ping, pong
    server -> client   puback, subok, ok, msg, error, ping, pong

A message travels as a JSON object (``{"data": ..., "key": ..., ...}``) inside ``pub``
frames, ``msg`` pushes and the HTTP v1 API alike. Payloads are UTF-8 text, or base64
with ``"enc": "base64"`` when they are not valid UTF-8.
"""

from __future__ import annotations

import base64
import binascii
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

import orjson

from kapok.core.model import Draft
from kapok.errors import BadRequestError, KapokError, UnknownCodeError
from kapok.protocol.fields import decode_object, get_int, get_number, get_str

if TYPE_CHECKING:
    from kapok.core.model import Entry, Message

__all__ = [
    "CLIENT_OPS",
    "MAX_DELAY_S",
    "MAX_HEADERS",
    "SERVER_OPS",
    "ClientOp",
    "ServerOp",
    "Settle",
    "decode_data",
    "decode_frame",
    "draft_from_json",
    "encode_data",
    "encode_error",
    "encode_msg",
    "encode_ok",
    "encode_pong",
    "encode_pub",
    "encode_puback",
    "encode_settle",
    "encode_sub",
    "encode_subok",
    "encode_unsub",
    "message_json",
]

ClientOp = Literal["pub", "sub", "unsub", "ack", "nack", "touch", "credit", "ping", "pong"]
ServerOp = Literal["puback", "subok", "ok", "msg", "error", "ping", "pong"]
CLIENT_OPS: Final[tuple[ClientOp, ...]] = typing.get_args(ClientOp)
SERVER_OPS: Final[tuple[ServerOp, ...]] = typing.get_args(ServerOp)

MAX_DELAY_S: Final = 10 * 365 * 86400.0


def decode_frame(raw: str | bytes) -> dict[str, Any]:
    """One frame, either direction: a JSON object (its ``op`` is the reader's to check)."""
    return decode_object(raw)


# ---------------------------------------------------------------- client -> server


def encode_pub(rid: int, msgs: list[dict[str, Any]], topic: str | None = None) -> bytes:
    """Publish ``msgs`` (message objects); ``topic`` applies to those that name none."""
    if topic is None:
        return orjson.dumps({"op": "pub", "id": rid, "msgs": msgs})
    return orjson.dumps({"op": "pub", "id": rid, "topic": topic, "msgs": msgs})


def encode_sub(rid: int, topic: str, ack: str = "manual", **options: str | int | None) -> bytes:
    """Subscribe; ``options`` are ``group``, ``key``, ``prefetch``, ``weight`` (None: the node's)
    and ``consumer`` (None: the connection's name)."""
    frame: dict[str, Any] = {"op": "sub", "id": rid, "topic": topic, "ack": ack}
    frame.update((name, value) for name, value in options.items() if value is not None)
    return orjson.dumps(frame)


Settle = Literal["ack", "nack", "touch"]


def encode_settle(op: Settle, sub: int, codes: list[str], requeue: bool = True) -> bytes:
    """Settle held messages of a subscription; ``requeue`` only means something to ``nack``."""
    if op == "nack":
        return orjson.dumps({"op": op, "sub": sub, "codes": codes, "requeue": requeue})
    return orjson.dumps({"op": op, "sub": sub, "codes": codes})


def encode_unsub(sub: int) -> bytes:
    return orjson.dumps({"op": "unsub", "sub": sub})


def encode_pong(rid: Any) -> bytes:
    return orjson.dumps({"op": "pong", "id": rid})


# ---------------------------------------------------------------- server -> client


def encode_puback(rid: Any, codes: list[str]) -> bytes:
    return orjson.dumps({"op": "puback", "id": rid, "codes": codes})


def encode_subok(rid: Any, sub: int, group: str, prefetch: int) -> bytes:
    return orjson.dumps({"op": "subok", "id": rid, "sub": sub, "group": group, "prefetch": prefetch})


def encode_ok(rid: Any, **fields: Any) -> bytes:
    return orjson.dumps({"op": "ok", "id": rid, **fields})


def encode_msg(sub: int, msgs: list[dict[str, Any]]) -> bytes:
    """A push of ``message_json`` objects to subscription ``sub``."""
    return orjson.dumps({"op": "msg", "sub": sub, "msgs": msgs})


def encode_error(exc: KapokError, rid: Any) -> bytes:
    frame: dict[str, Any] = {"op": "error", "id": rid, "code": exc.code, "message": exc.message}
    if isinstance(exc, UnknownCodeError):
        frame["codes"] = exc.codes
    return orjson.dumps(frame)


# ---------------------------------------------------------------- messages


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


def draft_from_json(
    obj: Any, producer_id: str, *, default_topic: str | None = None, route_topic: str | None = None
) -> Draft:
    """A message object -> ``Draft``.

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
        headers=get_headers(obj),
    )


MAX_HEADERS = 32
MAX_HEADER_NAME = 128
MAX_HEADER_VALUE = 4096


def get_headers(obj: dict[str, Any]) -> dict[str, str] | None:
    """A message's ``headers``: at most ``MAX_HEADERS`` string names and values."""
    headers = obj.get("headers")
    if headers is None or headers == {}:
        return None
    if not isinstance(headers, dict) or len(headers) > MAX_HEADERS:
        raise BadRequestError(f"field 'headers' must be an object of at most {MAX_HEADERS} entries")
    for name, value in headers.items():
        good_value = isinstance(value, str) and len(value) <= MAX_HEADER_VALUE
        if not 0 < len(name) <= MAX_HEADER_NAME or not good_value:
            raise BadRequestError(
                f"each header is a name of 1 to {MAX_HEADER_NAME} characters with a string value of at "
                f"most {MAX_HEADER_VALUE}; {name[:40]!r} is not"
            )
    return headers


def message_json(msg: Message, entry: Entry | None = None) -> dict[str, Any]:
    """The message object of a stored message (pushes, pull replies, console)."""
    # Built for one push per delivery: the common shape (UTF-8 data, no delay, no
    # headers) as one literal, with the same key order as the other shapes.
    code = msg.code
    try:
        out: dict[str, Any] = {"code": code, "topic": msg.topic, "data": msg.data.decode()}
    except UnicodeDecodeError:
        out = {"code": code, "topic": msg.topic}
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
