"""Cross-cutting request handling: authentication of /v1 and the one error mapping."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from kapok.errors import AuthBlockedError, AuthError, KapokError
from kapok.server.guard.auth import bearer_token, check_key
from kapok.server.routes.responses import json_response

__all__ = ["auth_middleware", "error_middleware"]

log = logging.getLogger("kapok.server")


def error_json(code: str, message: str, status: int) -> web.Response:
    return json_response({"error": code, "message": message}, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every error into ``{"error": code, "message": text}``; never a traceback."""
    try:
        return await handler(request)
    except KapokError as exc:
        response = error_json(exc.code, exc.message, exc.http_status)
        if isinstance(exc, AuthBlockedError):
            response.headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = (exc.reason or "error").lower().replace(" ", "_")
        response = error_json(code, exc.text or exc.reason, exc.status)
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except ConnectionError as exc:
        # The client left mid-request, or the node closed it (a body time-out, counted and
        # logged by the guard): nobody is there to read an answer, and it is no bug.
        log.debug("%s %s: connection lost: %s", request.method, request.path, exc)
        return error_json("connection_lost", "the connection was lost", 400)
    except Exception:
        log.exception("unexpected error handling %s %s", request.method, request.path)
        return error_json("internal", "internal error; see the node's log", 500)


# Routes that carry messages or change the pair: they need the key (checked before a
# WebSocket upgrade, so a slave with a wrong key never sees a byte of the log).
_PROTECTED = ("/v1/", "/sync/", "/replication/unpair", "/replication/promote")


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Native and replication routes need ``Authorization: Bearer <mq.secret_key>``."""
    if request.path.startswith(_PROTECTED) and not await check_key(request, bearer_token(request)):
        raise AuthError("missing or wrong 'Authorization: Bearer <secret key>' header")
    return await handler(request)
