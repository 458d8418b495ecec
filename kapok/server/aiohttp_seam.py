"""Every private name of aiohttp the node uses, in one place, checked when the node starts.

The server leans on aiohttp 3.x internals in a few spots: to fail unmasked client frames
(RFC 6455 §5.1), to accept connections through the connection guard, and for speed (the
KapokMQ frame reader, bursts read from aiohttp's queue, aiohttp's compiled unmasking) and
memory (a heartbeat timer that outlives its socket, a chunked body read by the guard).
Private names change without notice
between minor releases, and every use here falls back quietly when a name is gone, so a
new aiohttp could drop a safety check without anyone noticing. Hence:

* the rest of ``kapok`` touches none of these names: it calls the functions and classes
  below, each saying in its docstring what of aiohttp it relies on;
* ``check_hooks`` runs as the node starts (``guard.guard_ctx``, its first step). A *correctness*
  hook that cannot be installed stops the node with a one-line ``ConfigError`` naming the
  hook and the aiohttp version; an *optimisation* hook that is missing is said once, as a
  WARNING, and shows in the ``kapok_aiohttp_hooks_missing{hook}`` gauge.

pyproject.toml pins aiohttp below its next major for the same reason; the probes are
checked against the installed aiohttp by tests/integration/test_aiohttp_seam.py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import aiohttp
from aiohttp import WSMessage, web, web_ws
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_protocol import RequestHandler

from kapok.errors import ConfigError

__all__ = [
    "HOOKS",
    "Hook",
    "ListeningSite",
    "ParserSwapResponse",
    "can_keep_body",
    "cancel_heartbeat",
    "check_hooks",
    "compiled_unmask",
    "hook_lost",
    "keep_body",
    "missing_hooks",
    "queued_frames",
    "send_100_continue",
    "wrap_frame_parser",
]

log = logging.getLogger("kapok.server")

MASKING: Final = "rfc6455_masking"
LISTENING_SITE: Final = "listening_site"
FAST_READER: Final = "fast_reader"
QUEUED_BURSTS: Final = "queued_bursts"
HEARTBEAT_DISARM: Final = "heartbeat_disarm"
COMPILED_UNMASK: Final = "compiled_unmask"
CONTINUE_SIZE: Final = "continue_output_size"
KEPT_BODY: Final = "kept_body"


# ---------------------------------------------------------------- the hooks themselves


def wrap_frame_parser(
    request: web.BaseRequest, ws: web.WebSocketResponse, wrap: Callable[[Any, Any], Any]
) -> bool:
    """Put ``wrap(parser, queue)`` in front of the frame reader of ``ws``'s connection (after
    ``prepare``); False when this aiohttp does not let us.

    Relies on ``RequestHandler._payload_parser`` (what the protocol feeds every byte read
    after the upgrade, through ``feed_data``/``feed_eof``) and ``WebSocketResponse._reader``
    (the queue ``receive`` reads; its ``set_exception`` fails the socket with a close code).
    """
    protocol = request.protocol
    parser = getattr(protocol, "_payload_parser", None)
    queue = getattr(ws, "_reader", None)
    if parser is None or queue is None or not hasattr(parser, "feed_data"):
        return False
    protocol._payload_parser = wrap(parser, queue)
    return True


class ParserSwapResponse(web.WebSocketResponse):
    """aiohttp's WebSocket response whose frame reader a subclass may replace (``replacement_parser``)
    as soon as the upgrade is done, provided no byte came with the upgrade.

    Relies on ``WebSocketResponse._post_start`` (run by ``prepare`` once the 101 is written;
    it makes the queue ``_reader`` and the parser ``_parser`` and hands the parser to the
    protocol's ``set_parser``), ``_max_msg_size``, the protocol's ``_message_tail`` (bytes
    read past the upgrade request, fed to aiohttp's parser already) and ``_payload_parser``
    (replaced), and the queue's ``_buffer`` (a deque of parsed messages not yet read).
    When any is missing the response stays aiohttp's own.
    """

    def _post_start(self, request: Any, protocol: Any, writer: Any) -> None:
        handler = request.protocol
        tail = getattr(handler, "_message_tail", None)
        super()._post_start(request, protocol, writer)
        queue = getattr(self, "_reader", None)
        ours = getattr(self, "_parser", None)
        # Bytes that came with the upgrade (a client that did not wait for it) were fed
        # to aiohttp's reader already: it keeps the connection then.
        if tail != b"" or queue is None or getattr(handler, "_payload_parser", None) is not ours:
            return
        parsed = getattr(queue, "_buffer", None)
        if parsed is None or not hasattr(queue, "feed_data"):
            return
        reader = self.replacement_parser(handler, queue, parsed, int(getattr(self, "_max_msg_size", 0)))
        if reader is not None:
            handler._payload_parser = reader

    def replacement_parser(
        self, protocol: Any, queue: Any, parsed: collections.deque[Any], max_size: int
    ) -> Any:
        """The reader to feed this connection's bytes to instead of aiohttp's (None: keep
        aiohttp's). ``queue`` is what ``receive`` reads, ``parsed`` its unread messages."""
        return None


def queued_frames(
    ws: web.WebSocketResponse,
) -> tuple[Callable[[], Awaitable[WSMessage]], collections.deque[Any]] | None:
    """(the queue's ``read``, its parsed and unread messages as ``(message, size)`` pairs) of a
    prepared ``ws``; None when this aiohttp keeps them elsewhere.

    Relies on ``WebSocketResponse._reader`` and its ``_buffer`` deque, which ``read``
    pops from at once when it is not empty (the deque object lives as long as the queue).
    """
    queue: Any = getattr(ws, "_reader", None)
    parsed = getattr(queue, "_buffer", None)
    if parsed is None or not hasattr(queue, "read"):
        return None
    return queue.read, parsed


def cancel_heartbeat(ws: web.WebSocketResponse) -> None:
    """Cancel ``ws``'s heartbeat timers, if this aiohttp has ``_cancel_heartbeat``."""
    cancel = getattr(ws, "_cancel_heartbeat", None)
    if cancel is not None:
        cancel()


def compiled_unmask() -> Callable[[bytes, bytearray], None] | None:
    """aiohttp's unmasking routine (in place on a bytearray; compiled unless aiohttp runs
    without extensions), from ``aiohttp._websocket.helpers.websocket_mask``; None if gone."""
    try:
        from aiohttp._websocket.helpers import websocket_mask
    except ImportError:
        return None
    return websocket_mask if callable(websocket_mask) else None


async def send_100_continue(request: web.BaseRequest) -> None:
    """Write ``100 Continue`` and reset the writer's ``output_size``, as aiohttp's own
    expect handler does, so the interim answer does not count as the response's body."""
    writer = request.writer
    await writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if hasattr(writer, "output_size"):
        writer.output_size = 0


def can_keep_body(request: web.BaseRequest) -> bool:
    """May ``keep_body`` hand this request a body read by the node itself?"""
    return hasattr(request, "_read_bytes") and getattr(request, "_read_bytes", b"") is None


def keep_body(request: web.BaseRequest, body: bytes) -> None:
    """Make ``body`` (read already from ``request.content``) what ``request.read()`` returns,
    and so ``text``, ``json`` and ``post`` of a urlencoded form, as aiohttp keeps the body its
    own ``read`` read (call only when ``can_keep_body``).

    Relies on ``BaseRequest._read_bytes`` (None until ``read`` has read the body, then the body).
    """
    request._read_bytes = body


class ListeningSite(web.SockSite):
    """``SockSite`` that builds its connections' protocols with ``protocol_factory`` and
    passes ``listen_options`` to ``loop.create_server``.

    Relies on ``BaseSite``'s slots ``_runner``, ``_ssl_context``, ``_backlog`` and
    ``_server`` (what ``stop`` closes) and ``SockSite._sock``, as ``SockSite.start`` uses
    them; ``BaseSite.start`` registers the site with its runner.
    """

    __slots__ = ()

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        options = self.listen_options(self._ssl_context is not None)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.protocol_factory(server),
            sock=self._sock,
            ssl=self._ssl_context,
            backlog=self._backlog,
            **options,
        )

    def protocol_factory(self, server: web.Server) -> Callable[[], asyncio.Protocol]:
        return server

    def listen_options(self, tls: bool) -> dict[str, Any]:
        return {}


# ---------------------------------------------------------------- the start-up check


@dataclasses.dataclass(frozen=True)
class Hook:
    name: str
    required: bool  # correctness: the node refuses to start without it
    loss: str  # what the node loses without it
    probe: Callable[[], str | None]  # None when the hook can be installed, else what is missing


def _missing_attrs(owner: object, *names: str) -> str | None:
    gone = [name for name in names if not hasattr(owner, name)]
    return f"{getattr(owner, '__name__', owner)} has no {', '.join(gone)}" if gone else None


def _queue_class() -> Any:
    """The class of ``WebSocketResponse._reader`` (the queue ``_post_start`` makes)."""
    return getattr(web_ws, "WebSocketDataQueue", None)


def _queue() -> Any:
    """An aiohttp WebSocket queue, as ``_post_start`` makes one (its Python variant sets
    its attributes in ``__init__``, its compiled one on the class)."""
    return _queue_class()(None, 16, loop=None)


def _probe_masking() -> str | None:
    problem = _missing_attrs(RequestHandler, "_payload_parser") or _missing_attrs(
        web.WebSocketResponse, "_reader"
    )
    if problem:
        return problem
    reader = getattr(web_ws, "WebSocketReader", None)
    if reader is None or not hasattr(reader, "feed_data") or not hasattr(reader, "feed_eof"):
        return "aiohttp.web_ws.WebSocketReader has no feed_data/feed_eof"
    return _missing_attrs(_queue_class(), "set_exception")


def _probe_site() -> str | None:
    return _missing_attrs(web.BaseSite, "_runner", "_ssl_context", "_backlog", "_server") or _missing_attrs(
        web.SockSite, "_sock"
    )


def _probe_fast_reader() -> str | None:
    post_start = getattr(web.WebSocketResponse, "_post_start", None)
    if post_start is None:
        return "WebSocketResponse has no _post_start"
    if list(inspect.signature(post_start).parameters) != ["self", "request", "protocol", "writer"]:
        return f"WebSocketResponse._post_start{inspect.signature(post_start)} takes other arguments"
    return (
        _missing_attrs(RequestHandler, "_payload_parser", "_message_tail")
        or _missing_attrs(web.WebSocketResponse, "_reader", "_parser")
        or _missing_attrs(web.WebSocketResponse(), "_max_msg_size")
        or _probe_queue()
    )


def _probe_queue() -> str | None:
    queue = _queue()
    problem = _missing_attrs(queue, "feed_data", "read", "is_eof", "set_exception", "feed_eof")
    if problem is None and not isinstance(getattr(queue, "_buffer", None), collections.deque):
        problem = "WebSocketDataQueue has no _buffer deque"
    return problem


def _probe_bursts() -> str | None:
    return _missing_attrs(web.WebSocketResponse, "_reader") or _probe_queue()


def _probe_heartbeat() -> str | None:
    if callable(getattr(web.WebSocketResponse, "_cancel_heartbeat", None)):
        return None
    return "WebSocketResponse has no _cancel_heartbeat"


def _probe_unmask() -> str | None:
    return None if compiled_unmask() is not None else "no aiohttp._websocket.helpers.websocket_mask"


def _probe_kept_body() -> str | None:
    return _missing_attrs(web.BaseRequest, "_read_bytes")


def _probe_continue() -> str | None:
    return _missing_attrs(AbstractStreamWriter, "output_size")


HOOKS: Final[tuple[Hook, ...]] = (
    Hook(MASKING, True, "unmasked client frames (RFC 6455 5.1) would go unrefused", _probe_masking),
    Hook(LISTENING_SITE, True, "connections could not go through the connection guard", _probe_site),
    Hook(FAST_READER, False, "KapokMQ sockets are read by aiohttp's slower reader", _probe_fast_reader),
    Hook(QUEUED_BURSTS, False, "every WebSocket message costs one receive()", _probe_bursts),
    Hook(HEARTBEAT_DISARM, False, "closed sockets are held until their heartbeat fires", _probe_heartbeat),
    Hook(COMPILED_UNMASK, False, "client frames are unmasked in Python", _probe_unmask),
    Hook(CONTINUE_SIZE, False, "a 100 Continue counts toward the response's size", _probe_continue),
    Hook(KEPT_BODY, False, "a chunked body over the limit costs about twice the limit", _probe_kept_body),
)
_BY_NAME: Final = {hook.name: hook for hook in HOOKS}

_missing: frozenset[str] | None = None  # optimisation hooks found missing by the last check
_warned: set[str] = set()  # ... and said so, once per process


def hook_lost(name: str, problem: str = "") -> ConfigError:
    """The error that stops the node (or a connection) when a correctness hook is not there."""
    hook = _BY_NAME[name]
    why = f" ({problem})" if problem else ""
    return ConfigError(
        f"aiohttp {aiohttp.__version__}: the {name} hook cannot be installed{why}, so {hook.loss}; "
        "install an aiohttp this node supports (pyproject.toml: aiohttp>=3.9,<4)"
    )


def _probe(hook: Hook) -> str | None:
    try:
        return hook.probe()
    except Exception as exc:  # an aiohttp of another shape may fail the probe itself
        return f"{type(exc).__name__}: {exc}"


def check_hooks() -> frozenset[str]:
    """Check every hook against the installed aiohttp: raise ``hook_lost`` for a missing
    correctness hook, else warn once about each missing optimisation hook; the names of those."""
    global _missing
    problems = {hook.name: problem for hook in HOOKS if (problem := _probe(hook)) is not None}
    _missing = frozenset(name for name in problems if not _BY_NAME[name].required)
    for name, problem in problems.items():
        if _BY_NAME[name].required:
            raise hook_lost(name, problem)  # the node stops: the optimisations do not matter
    for name in sorted(_missing - _warned):
        _warned.add(name)
        log.warning(
            "aiohttp %s: the %s hook is missing (%s): %s; the node works, slower or with more memory",
            aiohttp.__version__, name, problems[name], _BY_NAME[name].loss,
        )  # fmt: skip
    return _missing


def missing_hooks() -> frozenset[str]:
    """The optimisation hooks missing on this aiohttp (checked now if the node did not yet)."""
    if _missing is None:
        with contextlib.suppress(ConfigError):  # a node that started anyway (tests: no site)
            check_hooks()
    return _missing or frozenset()
