"""The console's pages (Jinja2 templates in ``view/templates``) and its form actions.

Pages render the same dicts as ``/console/api/...`` serves (see ``api.py``); a bad search
form is shown on the page, not as raw JSON. Actions (logout, delete, requeue) are POST
forms, checked for the session's CSRF token by ``session.console_guard`` before they get
here, and answer with a redirect (post/redirect/get) carrying a notice from a fixed list,
so no request text is ever reflected into a page.
"""

from __future__ import annotations

import secrets
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp_jinja2
from aiohttp import web

from kapok import __version__
from kapok.console import figures
from kapok.console.api import analytics_data, message_data, messages_data, overview_data
from kapok.console.session import SESSIONS, cookie_flags, current_session, safe_next
from kapok.errors import AuthBlockedError, BadRequestError, KapokError
from kapok.server.guard.auth import check_key, key_matches
from kapok.server.keys import SERVICE
from kapok.server.routes.responses import read_form
from kapok.server.routes.search import STATUSES

__all__ = ["routes"]

routes = web.RouteTableDef()

NOTICES: Final = {
    "deleted": "The message was deleted.",
    "requeued": "The dead letter was published again to its topic (this is the new message) and "
    "settled in its DLQ.",
    "logged_out": "You are logged out.",
    "expired": "Log in to continue.",
}


def _render(request: web.Request, template: str, context: dict[str, Any], status: int = 200) -> web.Response:
    service = request.app[SERVICE]
    session = current_session(request)
    base = {
        "node": service.node_name,
        "version": __version__,
        "csrf": session.csrf if session is not None else "",
        "refresh_s": service.config.console.refresh_s,
        "notice": NOTICES.get(request.query.get("notice", ""), ""),
        "path": request.path,
        "error": "",
    }
    return aiohttp_jinja2.render_template(template, request, {**base, **context}, status=status)


# ------------------------------------------------------------------ login


def _login_page(request: web.Request, error: str = "", status: int = 200) -> web.Response:
    sessions = request.app[SESSIONS]
    token = secrets.token_urlsafe(24)
    context = {"login_token": token, "error": error, "next": safe_next(request.query.get("next"))}
    response = _render(request, "login.html", context, status)
    response.set_cookie(
        sessions.login_cookie, token, max_age=3600, path="/console/login", **cookie_flags(request)
    )
    return response


@routes.get("/console/login")
async def login_form(request: web.Request) -> web.Response:
    if current_session(request) is not None:
        raise web.HTTPFound(safe_next(request.query.get("next")))
    return _login_page(request)


@routes.post("/console/login")
async def login(request: web.Request) -> web.StreamResponse:
    sessions = request.app[SESSIONS]
    form = await read_form(request)
    expected = request.cookies.get(sessions.login_cookie, "")
    if not expected or not key_matches(form.get("login_token"), expected):
        return _login_page(request, "The login form expired; please try again.", 403)
    try:
        if not await check_key(request, form.get("key")):
            return _login_page(request, "Wrong secret key.", 401)
    except AuthBlockedError:
        return _login_page(request, "Too many wrong keys from this address; wait and try again.", 429)
    session = sessions.create()
    response = web.HTTPSeeOther(safe_next(form.get("next")))
    response.set_cookie(sessions.cookie, session.sid, path="/", **cookie_flags(request))
    response.del_cookie(sessions.login_cookie, path="/console/login", **cookie_flags(request))
    raise response


@routes.post("/console/logout")
async def logout(request: web.Request) -> web.StreamResponse:
    sessions = request.app[SESSIONS]
    session = current_session(request)
    if session is not None:
        sessions.end(session.sid)
    response = web.HTTPSeeOther("/console/login?notice=logged_out")
    response.del_cookie(sessions.cookie, path="/", **cookie_flags(request))
    raise response


# ------------------------------------------------------------------ pages


@routes.get("/")
@routes.get("/console")
@routes.get("/console/")
async def home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/console/overview")


@routes.get("/console/overview")
async def overview(request: web.Request) -> web.Response:
    data = await overview_data(request.app)
    return _render(request, "overview.html", {"data": data, "config": figures.config_rows(request.app)})


@routes.get("/console/cluster")
async def cluster(request: web.Request) -> web.Response:
    return _render(request, "cluster.html", {"data": figures.cluster(request.app)})


@routes.get("/console/topics")
async def topics(request: web.Request) -> web.Response:
    return _render(request, "topics.html", {"data": figures.topics(request.app)})


@routes.get("/console/clients")
async def clients(request: web.Request) -> web.Response:
    return _render(request, "clients.html", {"data": figures.clients(request.app)})


@routes.get("/console/messages")
async def messages(request: web.Request) -> web.Response:
    context: dict[str, Any] = {"statuses": STATUSES}
    try:
        form, data = messages_data(request)
        context["form"], context["data"] = form, data
        context["page_query"] = lambda n: urlencode({**form, "size": data["size"], "page": n})
    except BadRequestError as exc:
        context["form"] = {
            k: request.query.get(k, "")[:255] for k in ("start", "end", "topic", "group", "status", "code")
        }
        context["data"], context["error"] = None, exc.message
        return _render(request, "messages.html", context, status=400)
    return _render(request, "messages.html", context)


@routes.get("/console/messages/{code}")
async def message(request: web.Request) -> web.Response:
    try:
        data = await message_data(request)
    except KapokError as exc:
        return _render(request, "message.html", {"data": None, "error": exc.message}, exc.http_status)
    return _render(request, "message.html", {"data": data})


@routes.post("/console/messages/{code}/delete")
async def delete(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    if not service.delete(request.match_info["code"]):
        return _render(request, "message.html", {"data": None, "error": "No message with that code."}, 404)
    raise web.HTTPSeeOther("/console/messages?notice=deleted")


@routes.post("/console/messages/{code}/requeue")
async def requeue(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    try:
        new_code, durable = service.requeue_dead_letter(request.match_info["code"])
    except KapokError as exc:
        return _render(request, "message.html", {"data": None, "error": exc.message}, exc.http_status)
    if durable is not None:
        await durable
    raise web.HTTPSeeOther(f"/console/messages/{new_code}?notice=requeued")


@routes.get("/console/analytics")
async def analytics(request: web.Request) -> web.Response:
    return _render(request, "analytics.html", {"data": await analytics_data(request.app)})
