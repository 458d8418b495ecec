"""Typed access to a decoded JSON object's fields; a bad field is a ``BadRequestError``.

Each check names the field and what was wrong with it, which is the text a client sees
in its ``error`` frame or JSON reply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

from kapok.errors import BadRequestError

__all__ = [
    "MAX_CODES",
    "client_label",
    "decode_object",
    "get_bool",
    "get_codes",
    "get_int",
    "get_number",
    "get_str",
]

MAX_CODES = 10_000  # message codes in one ack, nack or touch


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
