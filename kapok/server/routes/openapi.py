"""``GET /openapi.json``: an OpenAPI 3.1 document of every HTTP route of a node.

The document is written here, from the parts in ``openapi_parts``, next to nothing else,
and kept true by a test that compares it with the application's router (every route
documented, nothing documented that the router does not have). Limits that are
configuration (the longest long-poll ``wait``, the batch size) are taken from the node's
config, so a client generated from it, or a fuzzer such as schemathesis, stays within what
the node accepts.

WebSocket routes are listed as the ``GET`` that upgrades them; their frames are in
docs/protocol.md. The console's pages are listed as what they answer
without a session (a redirect to the login page, or 401 under ``/console/api/``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kapok import __version__
from kapok.config import Config
from kapok.protocol.native import MAX_HEADERS
from kapok.server.keys import CONFIG
from kapok.server.routes.openapi_parts import (
    CODES,
    COMPAT_ANSWER,
    OBJ,
    answer,
    compat_console,
    console_action,
    console_api,
    console_page,
    errors,
    form_body,
    in_path,
    json_body,
    op,
    query,
    upgrade,
)
from kapok.server.routes.responses import json_response

__all__ = ["document", "routes"]

routes = web.RouteTableDef()


def document(config: Config) -> dict[str, Any]:
    """The OpenAPI document of a node with this ``config``."""
    batch = config.server.max_batch
    message = {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {"type": "string"},
            "enc": {"enum": ["utf8", "base64"]},
            "key": {"type": "string", "maxLength": 255},
            "priority": {"type": "integer", "minimum": 0, "maximum": 9},
            "delay_s": {"type": "number", "minimum": 0},
            "deliver_at": {"type": "number", "minimum": 0},
            "ttl_s": {"type": "number", "minimum": 0},
            "dedup_id": {"type": "string", "maxLength": 255},
            "headers": {
                "type": "object",
                "maxProperties": MAX_HEADERS,
                "additionalProperties": {"type": "string", "maxLength": 4096},
            },
        },
    }
    publish_body = {
        "oneOf": [
            message,
            {
                "type": "object",
                "required": ["messages"],
                "properties": {
                    "messages": {"type": "array", "items": message, "minItems": 1, "maxItems": batch}
                },
            },
        ]
    }
    claim = {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,200}$"}
    settle = {
        "type": "object",
        "anyOf": [{"required": ["codes"]}, {"required": ["claim"]}],
        "properties": {
            "group": {"type": "string"},
            "codes": CODES,
            "claim": claim,
            "requeue": {"type": "boolean"},
        },
    }
    bearer: list[dict[str, list[str]]] = [{"bearer": []}]
    v1 = "native"
    topic = in_path("topic")
    code = in_path("code")
    code_query = query("code", {"type": "string"}, "a message code or its first digits")
    paths: dict[str, dict[str, Any]] = {
        "/openapi.json": {"get": op("This document", "operations", {"200": answer(OBJ)})},
        "/health": {"get": op("Liveness, role and version", "operations", {"200": answer(OBJ)})},
        "/metrics": {
            "get": op(
                "Prometheus metrics",
                "operations",
                {
                    "200": {"description": "Prometheus text format", "content": {"text/plain": {}}},
                    **errors(401, 429),
                },
                description="The key (a bearer token) is needed with metrics.require_key, else optional: "
                "scrapes without it share a pace (429 past it), scrapes with it do not wait for them.",
                security=bearer if config.metrics.require_key else [{}, *bearer],
            )
        },
        "/cluster/nodes": {
            "get": op("This node's gossip view", "operations", {"200": answer({"type": "array"})})
        },
        "/replication/state": {
            "get": op(
                "The pair as this node sees it",
                "replication",
                {"200": answer(OBJ), **errors(401, 429)},
                security=bearer,
            )
        },
        "/replication/unpair": {
            "post": op(
                "Forget this node's paired slave or master",
                "replication",
                {"200": answer(OBJ), **errors(401, 409, 429, 503)},
                security=bearer,
            )
        },
        "/replication/promote": {
            "post": op(
                "Make this slave lead its pair (an operator's decision)",
                "replication",
                {"200": answer(OBJ), **errors(401, 409, 429)},
                security=bearer,
                parameters=[
                    query("force", {"type": "string", "enum": ["true", "false"]}, "even if not in sync")
                ],
            )
        },
        "/sync/v1": {"get": upgrade("A slave's replication link", "replication", [], bearer)},
        "/v1/ws": {
            "get": upgrade(
                "The native protocol",
                v1,
                [
                    query(
                        "client",
                        {"type": "string", "maxLength": 255},
                        "a name for the console, and its subscriptions' consumer name unless `sub` gives one",
                    )
                ],
                bearer,
            )
        },
        "/v1/topics": {
            "get": op(
                "Every topic with its groups", v1, {"200": answer(OBJ), **errors(401, 429)}, security=bearer
            )
        },
        "/v1/topics/{topic}": {
            "get": op(
                "One topic",
                v1,
                {"200": answer(OBJ), **errors(401, 404, 429)},
                parameters=[topic],
                security=bearer,
            )
        },
        "/v1/topics/{topic}/messages": {
            "post": op(
                "Publish one message or a batch; answers once durable",
                v1,
                {
                    "200": answer({"type": "object", "properties": {"codes": CODES}}),
                    **errors(400, 401, 409, 413, 429, 503, 507),
                },
                parameters=[
                    topic,
                    {
                        "name": "X-Kapok-Producer",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string", "maxLength": 255},
                    },
                ],
                requestBody=json_body(publish_body),
                security=bearer,
            ),
            "get": op(
                "Pull (lease) messages, waiting up to `wait` seconds",
                v1,
                {
                    "200": answer({"type": "object", "properties": {"messages": {"type": "array"}}}),
                    **errors(400, 401, 404, 429, 503),
                },
                parameters=[
                    topic,
                    query("group", {"type": "string", "maxLength": 255}, "a durable group"),
                    query("max", {"type": "integer", "minimum": 1, "maximum": 1000}, "messages at most"),
                    query(
                        "wait",
                        {"type": "number", "minimum": 0, "maximum": config.server.long_poll_max_s},
                        "long-poll seconds",
                    ),
                    query("lease_s", {"type": "number", "minimum": 0.001, "maximum": 86400}, "lease length"),
                    query("claim", claim, "a name for the lease: fetches again what it holds in flight"),
                    query(
                        "start",
                        {"type": "string", "enum": ["latest", "earliest"]},
                        "where a group this pull makes begins",
                    ),
                    {
                        "name": "X-Kapok-Consumer",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string", "maxLength": 255},
                        "description": "who pulls (the archive's `consumer`); default `http:<address>`",
                    },
                ],
                security=bearer,
            ),
        },
        "/v1/topics/{topic}/ack": {
            "post": op(
                "Settle leased messages as consumed",
                v1,
                {"200": answer(OBJ), **errors(400, 401, 404, 429, 503)},
                parameters=[topic],
                requestBody=json_body(settle),
                security=bearer,
            )
        },
        "/v1/topics/{topic}/nack": {
            "post": op(
                "Give leased messages back (or dead-letter them)",
                v1,
                {"200": answer(OBJ), **errors(400, 401, 404, 429, 503)},
                parameters=[topic],
                requestBody=json_body(settle),
                security=bearer,
            )
        },
        "/v1/messages/{code}": {
            "get": op(
                "A message and its state per group",
                v1,
                {"200": answer(OBJ), **errors(401, 404, 429)},
                parameters=[code],
                security=bearer,
            ),
            "delete": op(
                "Delete a message everywhere",
                v1,
                {"200": answer(OBJ), **errors(400, 401, 404, 429, 503)},
                parameters=[code],
                security=bearer,
            ),
        },
        "/v1/messages/{code}/requeue": {
            "post": op(
                "Publish a dead letter again to its original topic",
                v1,
                {"200": answer(OBJ), **errors(400, 401, 404, 409, 429, 503, 507)},
                parameters=[code],
                security=bearer,
            )
        },
        "/Producers/Conn/{topic}/{producer_id}": {
            "get": upgrade("KapokMQ producer (key in-band)", "kapokmq", [topic, in_path("producer_id")], [])
        },
        "/Consumers/Conn/{topic}/{consumer_id}": {
            "get": upgrade("KapokMQ consumer (key in-band)", "kapokmq", [topic, in_path("consumer_id")], [])
        },
        "/Producer/Send": {
            "post": op(
                "KapokMQ HTTP publish",
                "kapokmq",
                {"200": answer(COMPAT_ANSWER, "KapokMQ's envelope")},
                security=[{"secretKey": []}],
                requestBody=form_body("messageData", "topic", "delayTime"),
            )
        },
        "/Registry/GetNodes": {
            "post": op(
                "Live masters, in the KapokMQ registry's shape", "kapokmq", {"200": answer({"type": "array"})}
            )
        },
        "/Console/Ping": {"post": compat_console("KapokMQ console: ping")},
        "/Console/GetClients": {"post": compat_console("KapokMQ console: connected clients")},
        "/Console/GetConfig": {"post": compat_console("KapokMQ console: configuration")},
        "/Console/GetNodes": {"post": compat_console("KapokMQ console: live members")},
        "/Console/GetMessageList": {
            "post": compat_console(
                "KapokMQ console: messages by filter, paged",
                *("topic", "status", "startTime", "endTime", "page", "pageSize"),
            )
        },
        "/Console/GetMessage": {"post": compat_console("KapokMQ console: one message", "messageCode")},
        "/Console/DelMessage": {"post": compat_console("KapokMQ console: delete", "messageCode")},
        "/Console/CountMessage": {"post": compat_console("KapokMQ console: counts by status")},
        "/": {"get": console_page("The console (to its overview, or the login page)")},
        "/console": {"get": console_page("The console")},
        "/console/": {"get": console_page("The console")},
        "/console/login": {
            "get": op(
                "The login form",
                "console",
                {"200": {"description": "The page (HTML)"}, "302": {"description": "Already logged in"}},
            ),
            "post": op(
                "Log in with the secret key",
                "console",
                {
                    "303": {"description": "Logged in"},
                    "401": {"description": "Wrong key"},
                    "403": {"description": "The form expired"},
                    "429": {"description": "Too many wrong keys"},
                },
                requestBody=form_body("key", "login_token", "next"),
            ),
        },
        "/console/logout": {
            "post": op(
                "Log out",
                "console",
                {"303": {"description": "Logged out"}, **errors(401, 403)},
                security=[{"console": []}],
            )
        },
        "/console/overview": {"get": console_page("Overview page")},
        "/console/cluster": {"get": console_page("Cluster page")},
        "/console/topics": {"get": console_page("Topics page")},
        "/console/clients": {"get": console_page("Clients page")},
        "/console/analytics": {"get": console_page("Analytics page")},
        "/console/messages": {"get": console_page("Message search page", [code_query])},
        "/console/messages/{code}": {"get": console_page("One message", [code])},
        "/console/messages/{code}/delete": {"post": console_action("Delete a message")},
        "/console/messages/{code}/requeue": {"post": console_action("Requeue a dead letter")},
        "/console/api/overview": {"get": console_api("The overview's figures")},
        "/console/api/cluster": {"get": console_api("The cluster's members")},
        "/console/api/topics": {"get": console_api("Topics and groups")},
        "/console/api/clients": {"get": console_api("Connections and subscriptions")},
        "/console/api/analytics": {"get": console_api("The analytics figures")},
        "/console/api/analytics/summary": {
            "get": op(
                "This node's own analytics summary (null without one), read by the other members",
                "console",
                {"200": answer(OBJ), **errors(401, 429)},
                security=[{"console": []}, {"bearer": []}],
            )
        },
        "/console/api/messages": {"get": console_api("Message search", [code_query])},
        "/console/api/messages/{code}": {"get": console_api("One message", [code])},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Kapok",
            "version": __version__,
            "description": "A Kapok node's HTTP routes. WebSocket frames: see docs/protocol.md.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "mq.secret_key"},
                "secretKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "secretKey",
                    "description": "mq.secret_key (KapokMQ routes)",
                },
                "console": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": "kapok_console_<node hash>",
                    "description": "a console session, from POST /console/login",
                },
            }
        },
    }


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return json_response(document(request.app[CONFIG]))
