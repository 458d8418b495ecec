"""``/console/api/...``: the JSON the pages refresh from (401 without a session).

Each ``*_data`` function is also what the page of the same name renders first, so a page
and its refresh always agree. Anything that touches the disk runs in a thread.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from kapok.console import analytics, figures
from kapok.console.messages import history_events, message_detail, parse_search, search_page
from kapok.console.peers import PEER_SUMMARIES, SUMMARY_ROUTE, peer_targets
from kapok.errors import NotFoundError
from kapok.server.keys import SERVICE
from kapok.server.routes.cluster_view import member_rows
from kapok.server.routes.responses import json_response

__all__ = [
    "analytics_data",
    "message_data",
    "messages_data",
    "overview_data",
    "routes",
]

routes = web.RouteTableDef()


async def overview_data(app: web.Application) -> dict[str, Any]:
    data = figures.overview(app)
    disk = await asyncio.to_thread(figures.disk_usage, app[SERVICE].config.storage.dir)
    data["storage"].update(disk)
    return data


async def analytics_data(app: web.Application) -> dict[str, Any]:
    """The newest summary among this node's own and the other members' (see ``peers``),
    else this node's own messages."""
    service = app[SERVICE]
    path = analytics.summary_path(service.config)
    summary, problem = await asyncio.to_thread(analytics.read_summary, path)
    own = [] if summary is None else [analytics.Candidate(service.node_name, str(path), summary)]
    others = await app[PEER_SUMMARIES].get(peer_targets(member_rows(app)))
    chosen = analytics.newest(own + others)
    now = service.now()
    if chosen is not None:
        data = analytics.from_summary(chosen.summary, now)
    else:
        data = analytics.from_messages(service.broker.messages.newest_first(), now)
    data["path"] = str(path)  # where this node looks for its own
    data["problem"] = problem
    data["is_summary"] = chosen is not None
    data["summary_node"] = "" if chosen is None else chosen.node
    data["summary_path"] = "" if chosen is None else chosen.path
    data["from_peer"] = chosen is not None and chosen.node != service.node_name
    return data


def messages_data(request: web.Request) -> tuple[dict[str, str], dict[str, Any]]:
    form, query, page, size = parse_search(request.query)
    return form, search_page(request.app[SERVICE], query, page, size)


async def message_data(request: web.Request) -> dict[str, Any]:
    service = request.app[SERVICE]
    code = request.match_info["code"]
    msg = service.broker.messages.get(code)
    if msg is None:
        raise NotFoundError(f"no message with code {code[:40]!r} on this node")
    data = message_detail(service, msg)
    storage = service.config.storage
    if storage.archive:
        archive = Path(storage.dir) / "archive"
        data["history"] = await asyncio.to_thread(history_events, archive, msg.code, msg.create_time)
    else:
        data["history"] = {"events": [], "complete": True, "note": "the archive is off (storage.archive)"}
    return data


@routes.get("/console/api/overview")
async def overview(request: web.Request) -> web.Response:
    return json_response(await overview_data(request.app))


@routes.get("/console/api/cluster")
async def cluster(request: web.Request) -> web.Response:
    return json_response(figures.cluster(request.app))


@routes.get("/console/api/topics")
async def topics(request: web.Request) -> web.Response:
    return json_response(figures.topics(request.app))


@routes.get("/console/api/clients")
async def clients(request: web.Request) -> web.Response:
    return json_response(figures.clients(request.app))


@routes.get("/console/api/messages")
async def messages(request: web.Request) -> web.Response:
    return json_response(messages_data(request)[1])


@routes.get("/console/api/messages/{code}")
async def message(request: web.Request) -> web.Response:
    return json_response(await message_data(request))


@routes.get("/console/api/analytics")
async def analytics_view(request: web.Request) -> web.Response:
    return json_response(await analytics_data(request.app))


@routes.get(SUMMARY_ROUTE)
async def analytics_summary(request: web.Request) -> web.Response:
    """This node's own ``summary.json`` (never one fetched from a peer), for the other
    members: a session or the secret key as a bearer token (``session.console_guard``)."""
    service = request.app[SERVICE]
    path = analytics.summary_path(service.config)
    summary, _ = await asyncio.to_thread(analytics.read_summary, path)  # null: none, or unreadable
    return json_response({"node": service.node_name, "path": str(path), "summary": summary})
