"""Every private name of aiohttp the node uses, in one place, checked when the node starts.

The server leans on aiohttp 3.x internals in a few spots: to take a WebSocket's connection
over once aiohttp has answered its upgrade (the node reads and writes frames itself), to
accept connections through the connection guard, for speed (aiohttp's compiled unmasking)
and for memory (a chunked body read by the guard). Private names change without notice
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
import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Callable
from typing import Any, Final

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_protocol import RequestHandler

from kapok.errors import ConfigError

__all__ = [
    "HOOKS",
    "Hook",
    "ListeningSite",
    "TakeoverResponse",
    "can_keep_body",
    "check_hooks",
    "compiled_unmask",
    "hook_lost",
    "keep_body",
    "missing_hooks",
    "send_100_continue",
]

log = logging.getLogger("kapok.server")

TAKEOVER: Final = "websocket_takeover"
LISTENING_SITE: Final = "listening_site"
COMPILED_UNMASK: Final = "compiled_unmask"
CONTINUE_SIZE: Final = "continue_output_size"
KEPT_BODY: Final = "kept_body"


# ---------------------------------------------------------------- the hooks themselves


class TakeoverResponse(web.WebSocketResponse):
    """aiohttp's WebSocket response for the opening handshake only: it checks the upgrade
    request and writes the 101, and the connection is then the node's (``take_over``);
    aiohttp neither reads its frames nor writes a closing one when the route returns.

    Relies on ``WebSocketResponse._post_start`` (run by ``prepare`` once the 101 is written,
    to install aiohttp's frame reader: skipped here) and on the protocol's ``_message_tail``
    (the bytes read past the upgrade request; with no frame reader installed, also those
    that arrive until the transport is taken over).
    """

    def _post_start(self, request: Any, protocol: Any, writer: Any) -> None:
        return None  # no reader, no heartbeat: the node's own socket does both

    def take_over(self, request: web.BaseRequest) -> tuple[asyncio.Transport, bytes]:
        """The connection's transport and the bytes the client sent after its upgrade
        request, which nothing has read yet (call right after ``prepare``)."""
        transport = request.transport
        if transport is None:  # the peer left during the upgrade
            raise ConnectionResetError("the connection closed during the WebSocket upgrade")
        handler: Any = request.protocol
        tail: bytes = handler._message_tail
        handler._message_tail = b""
        return transport, tail

    async def write_eof(self) -> None:  # type: ignore[override]  # aiohttp's would close the socket again
        return None


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


def _probe_takeover() -> str | None:
    post_start = getattr(web.WebSocketResponse, "_post_start", None)
    if post_start is None:
        return "WebSocketResponse has no _post_start"
    if list(inspect.signature(post_start).parameters) != ["self", "request", "protocol", "writer"]:
        return f"WebSocketResponse._post_start{inspect.signature(post_start)} takes other arguments"
    return _missing_attrs(RequestHandler, "_message_tail")


def _probe_site() -> str | None:
    return _missing_attrs(web.BaseSite, "_runner", "_ssl_context", "_backlog", "_server") or _missing_attrs(
        web.SockSite, "_sock"
    )


def _probe_unmask() -> str | None:
    return None if compiled_unmask() is not None else "no aiohttp._websocket.helpers.websocket_mask"


def _probe_kept_body() -> str | None:
    return _missing_attrs(web.BaseRequest, "_read_bytes")


def _probe_continue() -> str | None:
    return _missing_attrs(AbstractStreamWriter, "output_size")


HOOKS: Final[tuple[Hook, ...]] = (
    Hook(TAKEOVER, True, "WebSocket connections could not be read by the node's own reader", _probe_takeover),
    Hook(LISTENING_SITE, True, "connections could not go through the connection guard", _probe_site),
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
