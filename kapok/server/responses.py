"""JSON responses and request bodies, the same way on every route."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from multidict import MultiDictProxy

from kapok.errors import BadRequestError

__all__ = ["json_response", "read_form"]


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
