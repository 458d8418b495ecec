"""Each request under the connection guard, and its body within the node's limit.

``guard_middleware`` moves the request's connection between BODY, BUSY and IDLE as the
request comes and goes (``ConnectionGuard.set_state``). A body over ``client_max_size``
is answered 413 and its connection closed without reading it: by its Content-Length, at
``Expect: 100-continue`` (``expect_handler``), or, for a chunked body, as soon as it went
over.
"""

from __future__ import annotations

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from kapok.errors import MessageTooLargeError
from kapok.server.aiohttp_seam import can_keep_body, keep_body, send_100_continue
from kapok.server.guard.connections import GUARD
from kapok.server.guard.conntable import ConnState

__all__ = ["guard_middleware"]


@web.middleware
async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Track the connection's state; refuse a body over the limit by its Content-Length,
    and stop reading one of unknown length (chunked) once it went over."""
    guard = request.app.get(GUARD)
    too_large = body_too_large(request)
    if too_large is not None:
        return await _refuse_body(request, too_large)
    if guard is not None:
        guard.set_state(request, ConnState.BUSY if request.content.is_eof() else ConnState.BODY)
    try:
        if _unknown_length(request):
            # Read here, in the stream's own small steps: aiohttp's ``read`` would buffer up
            # to twice the limit first. Kept for the handler's ``read``/``post``/``json``.
            body = await _read_within(request)
            if body is None:
                return await _refuse_body(request, _over_the_limit(request))
            keep_body(request, body)
        response = await handler(request)
    finally:
        if guard is not None:
            guard.set_state(request, ConnState.IDLE)
    if response.status == 413 and not response.prepared and not request.content.is_eof():
        # The body went over the limit as the handler read it (aiohttp's ``post`` of a
        # multipart form stops at client_max_size); unanswered, aiohttp would then read the
        # rest, up to ten seconds of it, before the client heard of the 413. Never read.
        return await _refuse_body(request, _over_the_limit(request))
    return response


def _unknown_length(request: web.BaseRequest) -> bool:
    """A body without Content-Length (chunked) that the guard reads itself (not a multipart
    form: aiohttp's ``post`` reads those part by part, within the limit)."""
    return (
        request.content_length is None
        and request.body_exists
        and bool(request.client_max_size)
        and request.content_type != "multipart/form-data"
        and can_keep_body(request)
    )


async def _read_within(request: web.BaseRequest) -> bytes | None:
    """The whole body, or None as soon as it goes over the limit (the rest left unread)."""
    limit = request.client_max_size
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _over_the_limit(request: web.BaseRequest) -> MessageTooLargeError:
    return MessageTooLargeError(f"a request body is over this node's {request.client_max_size} bytes")


def body_too_large(request: web.BaseRequest) -> MessageTooLargeError | None:
    limit = request.client_max_size
    length = request.content_length
    if limit and length is not None and length > limit:
        return MessageTooLargeError(f"a request body of {length} bytes is over this node's {limit}")
    return None


async def _refuse_body(request: web.BaseRequest, exc: MessageTooLargeError) -> web.StreamResponse:
    """Answer 413 at once and close: the body is never read (not even to throw it away,
    which is what aiohttp would do for up to ten seconds after an answer)."""
    response = web.Response(
        body=orjson.dumps({"error": exc.code, "message": exc.message}),
        status=exc.http_status,
        content_type="application/json",
    )
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: say no before the client sends a body that is too large."""
    too_large = body_too_large(request)
    if too_large is not None:
        return await _refuse_body(request, too_large)
    if request.headers.get("Expect", "").lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"unknown Expect: {request.headers['Expect']}")
    if request.version >= (1, 1):
        await send_100_continue(request)
    return None
