"""KapokMQ's console JSON API and Serena's registry route, with their shapes.

All answer HTTP 200 with ``code`` 0 or -1, as KapokMQ does, and need the
``secretKey`` header. Fixed against KapokMQ: the message list is paged
(``page``, ``pageSize``; default the first 1,000), a date that does not
parse is an error instead of a silently different filter, and deleting a
message removes it everywhere (queues, timers, journal).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from aiohttp import web

from kapok.config import Config
from kapok.errors import AuthBlockedError, BadRequestError
from kapok.protocol.kapokmq import KEY_ERROR, message_object
from kapok.server.guard.auth import check_key
from kapok.server.keys import CLIENTS, SERVICE
from kapok.server.routes.cluster_view import compat_nodes
from kapok.server.routes.responses import int_field, json_response, read_form
from kapok.server.routes.search import MessageQuery, search_messages
from kapok.service import BrokerService

__all__ = ["routes"]

routes = web.RouteTableDef()

Handler = Callable[[web.Request, BrokerService], Awaitable[Any]]
MAX_PAGE = 1000
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def _console(path: str) -> Callable[[Handler], Handler]:
    """Register a POST route with the secretKey check and the KapokMQ envelope."""

    def wrap(handler: Handler) -> Handler:
        async def route(request: web.Request) -> web.Response:
            service = request.app[SERVICE]
            try:
                if not await check_key(request, request.headers.get("secretKey")):
                    return json_response({"code": -1, "msg": KEY_ERROR})
            except AuthBlockedError as exc:
                return json_response({"code": -1, "msg": exc.message})
            try:
                result = await handler(request, service)
            except BadRequestError as exc:
                request.app[CLIENTS].count_bad_input("console_form")
                return json_response({"code": -1, "msg": str(exc)})
            return json_response(result)

        routes.post(path)(route)
        return handler

    return wrap


@_console("/Console/Ping")
async def ping(request: web.Request, service: BrokerService) -> Any:
    return {"code": 0}


@_console("/Console/GetClients")
async def get_clients(request: web.Request, service: BrokerService) -> Any:
    consumers: list[dict[str, Any]] = []
    producers: list[dict[str, Any]] = []
    subscribed = service.broker.consumers
    for info in request.app[CLIENTS].open.values():
        joined = int(info.since)
        producers.extend(
            {"ProducerId": info.client_id, "Topic": topic, "ProducerIp": info.ip, "JoinTime": joined}
            for topic in sorted(info.published)
        )
        for cid in sorted(info.subscriptions):
            consumer = subscribed.get(cid)
            if consumer is not None:
                consumers.append(
                    {
                        "ConsumerId": info.client_id,
                        "Topic": consumer.group.topic.name,
                        "ConsumerIp": info.ip,
                        "JoinTime": joined,
                    }
                )
    return {"code": 0, "consumers": consumers, "producers": producers}


def compat_config(cfg: Config) -> dict[str, Any]:
    """The 23 keys KapokMQ's console shows, filled from Kapok's equivalents."""
    sync_on = cfg.replication.role == "slave" or bool(cfg.replication.master)
    master = cfg.replication.master.split("://", 1)[-1]
    master_addr, _, master_port = master.partition(":")
    registry_addr, _, registry_port = (cfg.cluster.seeds[0] if cfg.cluster.seeds else ":").partition(":")
    return {
        "pushType": cfg.mq.push_type,
        "messageChanBuffer": cfg.mq.max_length,
        "pushMessagesSpeed": 0,
        "pushCount": 0,
        "pushRetryTime": int(cfg.mq.ack_timeout_s),
        "persistentFile": cfg.storage.dir,
        "isPersistent": 0 if cfg.storage.fsync == "never" else 2,
        "recoveryStrategy": 1,
        "persistentTime": int(cfg.storage.snapshot_interval_s),
        "isCleanConsumed": int(cfg.mq.retain_consumed_s == 0),
        "isRePush": 1,
        "isClean": int(cfg.mq.ttl_s > 0),
        "checkSpeed": 0,
        "cleanTime": int(cfg.mq.retain_consumed_s),
        "isCluster": int(cfg.cluster.enabled),
        "gossipPort": int(cfg.cluster.bind.rpartition(":")[2] or 0),
        "registryAddr": registry_addr,
        "registryGossipPort": registry_port,
        "isSync": int(sync_on),
        "isSlave": int(cfg.replication.role == "slave"),
        "masterProtocol": "ws",
        "masterAddr": master_addr.split("/")[0],
        "masterPort": master_port.split("/")[0],
    }


@_console("/Console/GetConfig")
async def get_config(request: web.Request, service: BrokerService) -> Any:
    return {"code": 0, "data": compat_config(service.config)}


def _parse_date(text: str, name: str) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text.strip(), DATE_FORMAT).timestamp()
    except ValueError:
        raise BadRequestError(f"{name} must look like 2022-02-05 00:00:00") from None


@_console("/Console/GetMessageList")
async def get_message_list(request: web.Request, service: BrokerService) -> Any:
    form = await read_form(request)
    start = _parse_date(form.get("startTime", ""), "startTime")
    end = _parse_date(form.get("endTime", ""), "endTime")
    status = int_field(form, "status", 3, -1, 3)
    if status == 2:
        raise BadRequestError("status must be -1, 0, 1 or 3 (all)")
    page = int_field(form, "page", 1, 1, 1_000_000)
    size = int_field(form, "pageSize", MAX_PAGE, 1, MAX_PAGE)
    query = MessageQuery(topic=form.get("topic", ""), wire_status=None if status == 3 else status,
                         start=start, end=end)  # fmt: skip
    now = service.now()
    found = search_messages(service.broker.messages, query, now, page, size)
    rows = []
    for msg in found.messages:
        row = message_object(msg, now)
        row["MessageData"] = ""  # as in KapokMQ: the list carries no payloads
        rows.append(row)
    return {"code": 0, "data": rows, "total": found.total}


@_console("/Console/GetMessage")
async def get_message(request: web.Request, service: BrokerService) -> Any:
    form = await read_form(request)
    msg = service.broker.messages.get(form.get("messageCode", ""))
    if msg is None:
        return {"code": -1, "data": "error", "msg": "no message with that code"}
    return {"code": 0, "data": message_object(msg, service.now())}


@_console("/Console/DelMessage")
async def del_message(request: web.Request, service: BrokerService) -> Any:
    form = await read_form(request)
    if not service.delete(form.get("messageCode", "")):
        return {"code": -1, "msg": "no message with that code"}
    return {"code": 0}


@_console("/Console/CountMessage")
async def count_message(request: web.Request, service: BrokerService) -> Any:
    now = service.now()
    counts = {1: 0, 0: 0, -1: 0}
    for msg in service.broker.messages.held():
        counts[msg.wire_status(now)] += 1
    data = {"all": sum(counts.values()), "consumed": counts[1], "delay": counts[0], "unconsumed": counts[-1]}
    return {"code": 0, "data": data}


@_console("/Console/GetNodes")
async def get_nodes(request: web.Request, service: BrokerService) -> Any:
    return compat_nodes(request.app, masters_only=False)


@_console("/Registry/GetNodes")
async def registry_get_nodes(request: web.Request, service: BrokerService) -> Any:
    # The KapokMQ cluster producer sends to every node listed here: active masters only.
    return compat_nodes(request.app, masters_only=True)
