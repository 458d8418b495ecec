"""JSON responses and request bodies, the same way on every route."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web
from multidict import MultiDictProxy

from kapok.errors import BadRequestError

__all__ = ["int_field", "json_response", "number_field", "read_form"]


def json_response(data: Any, status: int = 200) -> web.Response:
    """Compact JSON (like Go's encoder, which KapokMQ clients were written against)."""
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def read_form(request: web.Request) -> dict[str, str]:
    """The text fields of a urlencoded or multipart form; a body that does not parse is a 400."""
    try:
        form: MultiDictProxy[Any] = await request.post()
    except web.HTTPException:
        raise
    except Exception as exc:  # aiohttp raises assorted errors for mangled bodies
        raise BadRequestError(f"the form body could not be read: {exc.__class__.__name__}") from None
    return {k: v for k, v in form.items() if isinstance(v, str)}


def number_field(
    fields: Mapping[str, str], name: str, default: float, lo: float, hi: float, *, what: str = ""
) -> float:
    """A number from a form or query string (``default`` when absent or empty), in [lo, hi]."""
    label = what or name
    text = fields.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadRequestError(f"{label} must be a number, got {text[:20]!r}") from None
    if not lo <= value <= hi:
        raise BadRequestError(f"{label} must be between {lo:g} and {hi:g}")
    return value


def int_field(fields: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """A whole number from a form or query string: ``default`` when absent or empty."""
    text = fields.get(name, "").strip()
    if text and not text.lstrip("+-").isdigit():
        raise BadRequestError(f"{name} must be an integer, got {text[:20]!r}")
    return int(number_field(fields, name, default, lo, hi))
