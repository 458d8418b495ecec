"""The message objects a producer writes (pure): the payload as the wire carries it, the
options that differ from their defaults, and the size that counts against the limits.

A text payload goes as it is; bytes go as text when they are UTF-8, else as base64 with
``"enc": "base64"``. The size is the payload's in bytes (what the node checks against
``max_message_bytes``). In KapokMQ mode the object is checked against what KapokMQ's
routes can carry here, so a message they cannot carry fails at ``send``, not in a batch.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, TypedDict

from kapok.client.kapokmq import compat_frame
from kapok.errors import MessageTooLargeError

__all__ = ["SendOptions", "message_object", "too_large"]


class SendOptions(TypedDict, total=False):
    """The keywords of ``Producer.send`` and ``Producer.publish``."""

    topic: str | None
    key: str
    priority: int
    delay_s: float
    deliver_at: float
    ttl_s: float
    dedup_id: str | None
    headers: Mapping[str, str] | None


def too_large(size: int, limit: int) -> MessageTooLargeError:
    return MessageTooLargeError(f"message of {size} bytes is over max_message_bytes ({limit})")


def message_object(
    data: bytes | str, topic: str | None, key: str, priority: int, delay_s: float, deliver_at: float,
    ttl_s: float, dedup_id: str | None, headers: Mapping[str, str] | None, *, max_bytes: int, kapokmq: bool,
) -> tuple[dict[str, Any], int]:  # fmt: skip
    """The object for the wire (``topic`` None: the frame's), and its payload's size in bytes."""
    msg: dict[str, Any] = {} if topic is None else {"topic": topic}
    if isinstance(data, str):
        text = str(data)
        msg["data"] = text
        size = len(text) if text.isascii() else len(text.encode())
    else:
        size = len(data)
        try:
            msg["data"] = data.decode()
        except UnicodeDecodeError:
            msg["data"] = base64.b64encode(data).decode()
            msg["enc"] = "base64"
    if size > max_bytes:
        raise too_large(size, max_bytes)
    options = {"key": key, "priority": priority, "delay_s": delay_s, "deliver_at": deliver_at, "ttl_s": ttl_s,
               "headers": dict(headers) if headers else None, "dedup_id": dedup_id}  # fmt: skip
    msg.update((name, value) for name, value in options.items() if value)
    if kapokmq:
        compat_frame(msg)
    return msg, size
