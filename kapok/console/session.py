"""Console logins: sessions, CSRF tokens and the guard middleware.

Theory of operation. The secret key is typed once into the login form (a POST body,
never a URL, so it reaches no access log) and compared in constant time. What the
browser holds afterwards is a random session id in a cookie (HttpOnly, SameSite=Strict,
Path=/), never the key: no page, script or browser storage ever sees it again. Every
console cookie (the login form's too) is also ``Secure`` when the node serves TLS
(``server.tls_cert``) or the request came over https (``cookie_flags``), so a browser
never sends it over plain HTTP.

Sessions live in this process's memory (a restart logs everyone out), at most
``MAX_SESSIONS`` of them, each ending after ``console.session_idle_s`` unused. Each has
its own CSRF token, which every state-changing form carries as a hidden ``csrf`` field
(scripts send it as ``X-CSRF-Token``). SameSite=Strict already keeps other sites' forms
from carrying the cookie; the token is the second lock. The login form, made before any
session exists, uses a double-submit token instead (the same random value in a short-lived
cookie and in the form).

The cookie's name carries a hash of the node's name: cookies do not tell ports apart, and
two nodes on one host would otherwise log each other's users out.

``console_guard`` is closed by default: every path under ``/console/`` (and ``/``) needs a
session except the login page and the static files, so a route added later is protected
without anyone having to remember it. Without a session a page redirects to the login
page and anything else answers 401; a POST without the right token answers 403. The few
``KEY_PATHS`` that other nodes read (``peers.SUMMARY_ROUTE``) also take the secret key as
a bearer token, as the nodes' other routes among themselves do (a wrong one counts toward
the address's back-off).
"""

from __future__ import annotations

import hmac
import secrets
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from aiohttp import web
from aiohttp.typedefs import Handler

from kapok.console.peers import SUMMARY_ROUTE
from kapok.errors import AuthError, CsrfError
from kapok.server.guard.auth import bearer_token, check_key
from kapok.server.keys import REPLICATION, SERVICE
from kapok.server.routes.responses import read_form

__all__ = [
    "CSRF_FIELD",
    "SESSIONS",
    "Session",
    "Sessions",
    "console_guard",
    "cookie_flags",
    "current_session",
    "safe_next",
]

MAX_SESSIONS: Final = 1000  # the oldest-used session is ended to make room
CSRF_FIELD: Final = "csrf"
CSRF_HEADER: Final = "X-CSRF-Token"
LOGIN_PATH: Final = "/console/login"
STATIC_PREFIX: Final = "/console/static/"
API_PREFIX: Final = "/console/api/"
KEY_PATHS: Final = frozenset({SUMMARY_ROUTE})  # GETs that a bearer key opens too (node to node)
_SAFE_METHODS: Final = ("GET", "HEAD", "OPTIONS")

# Pages are not framed, scripts and styles come from this node only (no inline script),
# and nothing is cached: a page can hold message payloads.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(slots=True)
class Session:
    sid: str
    csrf: str
    created: float
    last_seen: float


class Sessions:
    """The logged-in browsers of this node, by session id (bounded, with idle expiry)."""

    def __init__(self, node_name: str, idle_s: float, clock: Callable[[], float]) -> None:
        suffix = f"{zlib.crc32(node_name.encode()):08x}"
        self.cookie = f"kapok_console_{suffix}"
        self.login_cookie = f"kapok_login_{suffix}"
        self.idle_s = idle_s
        self._clock = clock
        self._by_id: OrderedDict[str, Session] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._by_id)

    def create(self) -> Session:
        now = self._clock()
        while len(self._by_id) >= MAX_SESSIONS:
            self._by_id.popitem(last=False)
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now, now)
        self._by_id[session.sid] = session
        return session

    def get(self, sid: str | None) -> Session | None:
        """The live session with this id (and mark it used), or None."""
        if not sid:
            return None
        session = self._by_id.get(sid)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_seen > self.idle_s:
            del self._by_id[sid]
            return None
        session.last_seen = now
        self._by_id.move_to_end(sid)
        return session

    def end(self, sid: str) -> None:
        self._by_id.pop(sid, None)


SESSIONS: Final = web.AppKey("console_sessions", Sessions)


def current_session(request: web.Request) -> Session | None:
    """The request's live session, if its cookie names one."""
    sessions = request.app[SESSIONS]
    return sessions.get(request.cookies.get(sessions.cookie))


def cookie_flags(request: web.Request) -> dict[str, Any]:
    """The flags of every cookie the console sets (or deletes): HttpOnly, SameSite=Strict,
    and Secure when the node serves TLS or this request came over https."""
    tls = bool(request.app[SERVICE].config.server.tls_cert)
    return {"httponly": True, "samesite": "Strict", "secure": request.secure or tls}


def safe_next(target: str | None) -> str:
    """Where to go after logging in: only a console path of this node (no open redirect)."""
    if target and target.startswith("/console/") and not target.startswith(("//", LOGIN_PATH)):
        return target
    return "/console/overview"


def _guarded(path: str) -> bool:
    if path == "/":
        return True
    if not path.startswith("/console"):
        return False
    return not (path == LOGIN_PATH or path.startswith(STATIC_PREFIX))


async def _csrf_ok(request: web.Request, session: Session) -> bool:
    given = request.headers.get(CSRF_HEADER)
    if given is None and request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        given = (await read_form(request)).get(CSRF_FIELD)
    return given is not None and hmac.compare_digest(given.encode(), session.csrf.encode())


@web.middleware
async def console_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = request.path
    if path.startswith("/console") or path == "/":
        response = await _guard(request, _mirrored(handler)) if _guarded(path) else await handler(request)
        response.headers.update(SECURITY_HEADERS)
        return response
    return await handler(request)


def _mirrored(handler: Handler) -> Handler:
    """On a slave, the page shows its master's whole log: what it journaled and has not
    applied yet is applied first (``kapok.replication.applier``), in slices."""

    async def caught_up(request: web.Request) -> web.StreamResponse:
        replication = request.app.get(REPLICATION)
        applier = replication.current_applier() if replication is not None else None
        if applier is not None:
            await applier.catch_up()
        return await handler(request)

    return caught_up


async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    session = current_session(request)
    if session is None and request.method == "GET" and request.path in KEY_PATHS:
        token = bearer_token(request)
        if token is not None:
            if not await check_key(request, token):
                raise AuthError("wrong secret key")
            return await handler(request)
    if session is None:
        if request.method in _SAFE_METHODS and not request.path.startswith(API_PREFIX):
            target = quote(request.path_qs, safe="/?=&")
            raise web.HTTPFound(f"{LOGIN_PATH}?next={target}")
        raise AuthError("log in to the console first")
    if request.method not in _SAFE_METHODS and not await _csrf_ok(request, session):
        raise CsrfError("missing or wrong CSRF token; reload the page and try again")
    return await handler(request)
