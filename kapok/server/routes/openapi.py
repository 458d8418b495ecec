"""``GET /openapi.json``: an OpenAPI 3.1 document of every HTTP route of a node.

The document is written here, next to nothing else, and kept true by a test that
compares it with the application's router (every route documented, nothing documented
that the router does not have). Limits that are configuration (the longest long-poll
``wait``, the batch size) are taken from the node's config, so a client generated
from it, or a fuzzer such as schemathesis, stays within what the node accepts.

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
from kapok.server.routes.responses import json_response

__all__ = ["document", "routes"]

routes = web.RouteTableDef()

_OBJ: dict[str, Any] = {"type": "object"}
_ERROR = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
}
_COMPAT_ANSWER = {
    "type": "object",
    "required": ["code", "msg"],
    "properties": {"code": {"type": "integer"}, "msg": {}},
}
_CODES = {"type": "array", "items": {"type": "string"}, "maxItems": 10_000}
_NAME = {"type": "string", "minLength": 1, "maxLength": 255}


def _json(schema: dict[str, Any], text: str = "OK") -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): _json(_ERROR, "An error: its machine code and a readable message") for s in statuses}


def _form_body(*names: str, required: bool = True) -> dict[str, Any]:
    """A urlencoded form of string fields (KapokMQ's routes, the console's login)."""
    schema = {"type": "object", "properties": {name: {"type": "string"} for name in names}}
    return {"required": required, "content": {"application/x-www-form-urlencoded": {"schema": schema}}}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _path(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema or _NAME}


def _query(name: str, schema: dict[str, Any], text: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": text}


def _op(summary: str, tag: str, responses: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"summary": summary, "tags": [tag], "responses": responses, **extra}


def _upgrade(summary: str, tag: str, params: list[dict[str, Any]], security: list[Any]) -> dict[str, Any]:
    return _op(
        summary + " (WebSocket: this GET upgrades; frames in docs/protocol.md)",
        tag,
        {"101": {"description": "Switching Protocols"}, **_errors(400, 401, 429, 503)},
        parameters=params,
        security=security,
    )


def _compat_console(summary: str, *fields: str) -> dict[str, Any]:
    return _op(
        summary,
        "kapokmq-console",
        {"200": _json(_COMPAT_ANSWER, "KapokMQ's envelope")},
        security=[{"secretKey": []}],
        requestBody=_form_body(*fields, required=False),
    )


def _console_page(summary: str, params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return _op(
        summary,
        "console",
        {"200": {"description": "The page (HTML)"}, "302": {"description": "To the login page"}},
        security=[{"console": []}],
        parameters=params or [],
    )


def _console_api(summary: str, params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return _op(
        summary,
        "console",
        {"200": _json(_OBJ), **_errors(400, 401, 404)},
        security=[{"console": []}],
        parameters=params or [],
    )


def _console_action(summary: str) -> dict[str, Any]:
    return _op(
        summary,
        "console",
        {"303": {"description": "Done; to the page that shows it"}, **_errors(401, 403, 404)},
        security=[{"console": []}],
        parameters=[_path("code")],
    )


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
            "codes": _CODES,
            "claim": claim,
            "requeue": {"type": "boolean"},
        },
    }
    bearer: list[dict[str, list[str]]] = [{"bearer": []}]
    v1 = "native"
    topic = _path("topic")
    code = _path("code")
    code_query = _query("code", {"type": "string"}, "a message code or its first digits")
    paths: dict[str, dict[str, Any]] = {
        "/openapi.json": {"get": _op("This document", "operations", {"200": _json(_OBJ)})},
        "/health": {"get": _op("Liveness, role and version", "operations", {"200": _json(_OBJ)})},
        "/metrics": {
            "get": _op(
                "Prometheus metrics",
                "operations",
                {
                    "200": {"description": "Prometheus text format", "content": {"text/plain": {}}},
                    **_errors(401, 429),
                },
                description="The key (a bearer token) is needed with metrics.require_key, else optional: "
                "scrapes without it share a pace (429 past it), scrapes with it do not wait for them.",
                security=bearer if config.metrics.require_key else [{}, *bearer],
            )
        },
        "/cluster/nodes": {
            "get": _op("This node's gossip view", "operations", {"200": _json({"type": "array"})})
        },
        "/replication/state": {
            "get": _op(
                "The pair as this node sees it",
                "replication",
                {"200": _json(_OBJ), **_errors(401, 429)},
                security=bearer,
            )
        },
        "/replication/unpair": {
            "post": _op(
                "Forget this node's paired slave or master",
                "replication",
                {"200": _json(_OBJ), **_errors(401, 409, 429, 503)},
                security=bearer,
            )
        },
        "/replication/promote": {
            "post": _op(
                "Make this slave lead its pair (an operator's decision)",
                "replication",
                {"200": _json(_OBJ), **_errors(401, 409, 429)},
                security=bearer,
                parameters=[
                    _query("force", {"type": "string", "enum": ["true", "false"]}, "even if not in sync")
                ],
            )
        },
        "/sync/v1": {"get": _upgrade("A slave's replication link", "replication", [], bearer)},
        "/v1/ws": {
            "get": _upgrade(
                "The native protocol",
                v1,
                [
                    _query(
                        "client",
                        {"type": "string", "maxLength": 255},
                        "a name for the console, and its subscriptions' consumer name unless `sub` gives one",
                    )
                ],
                bearer,
            )
        },
        "/v1/topics": {
            "get": _op(
                "Every topic with its groups", v1, {"200": _json(_OBJ), **_errors(401, 429)}, security=bearer
            )
        },
        "/v1/topics/{topic}": {
            "get": _op(
                "One topic",
                v1,
                {"200": _json(_OBJ), **_errors(401, 404, 429)},
                parameters=[topic],
                security=bearer,
            )
        },
        "/v1/topics/{topic}/messages": {
            "post": _op(
                "Publish one message or a batch; answers once durable",
                v1,
                {
                    "200": _json({"type": "object", "properties": {"codes": _CODES}}),
                    **_errors(400, 401, 409, 413, 429, 503, 507),
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
                requestBody=_json_body(publish_body),
                security=bearer,
            ),
            "get": _op(
                "Pull (lease) messages, waiting up to `wait` seconds",
                v1,
                {
                    "200": _json({"type": "object", "properties": {"messages": {"type": "array"}}}),
                    **_errors(400, 401, 404, 429, 503),
                },
                parameters=[
                    topic,
                    _query("group", {"type": "string", "maxLength": 255}, "a durable group"),
                    _query("max", {"type": "integer", "minimum": 1, "maximum": 1000}, "messages at most"),
                    _query(
                        "wait",
                        {"type": "number", "minimum": 0, "maximum": config.server.long_poll_max_s},
                        "long-poll seconds",
                    ),
                    _query("lease_s", {"type": "number", "minimum": 0.001, "maximum": 86400}, "lease length"),
                    _query("claim", claim, "a name for the lease: fetches again what it holds in flight"),
                    _query(
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
            "post": _op(
                "Settle leased messages as consumed",
                v1,
                {"200": _json(_OBJ), **_errors(400, 401, 404, 429, 503)},
                parameters=[topic],
                requestBody=_json_body(settle),
                security=bearer,
            )
        },
        "/v1/topics/{topic}/nack": {
            "post": _op(
                "Give leased messages back (or dead-letter them)",
                v1,
                {"200": _json(_OBJ), **_errors(400, 401, 404, 429, 503)},
                parameters=[topic],
                requestBody=_json_body(settle),
                security=bearer,
            )
        },
        "/v1/messages/{code}": {
            "get": _op(
                "A message and its state per group",
                v1,
                {"200": _json(_OBJ), **_errors(401, 404, 429)},
                parameters=[code],
                security=bearer,
            ),
            "delete": _op(
                "Delete a message everywhere",
                v1,
                {"200": _json(_OBJ), **_errors(400, 401, 404, 429, 503)},
                parameters=[code],
                security=bearer,
            ),
        },
        "/v1/messages/{code}/requeue": {
            "post": _op(
                "Publish a dead letter again to its original topic",
                v1,
                {"200": _json(_OBJ), **_errors(400, 401, 404, 409, 429, 503, 507)},
                parameters=[code],
                security=bearer,
            )
        },
        "/Producers/Conn/{topic}/{producer_id}": {
            "get": _upgrade("KapokMQ producer (key in-band)", "kapokmq", [topic, _path("producer_id")], [])
        },
        "/Consumers/Conn/{topic}/{consumer_id}": {
            "get": _upgrade("KapokMQ consumer (key in-band)", "kapokmq", [topic, _path("consumer_id")], [])
        },
        "/Producer/Send": {
            "post": _op(
                "KapokMQ HTTP publish",
                "kapokmq",
                {"200": _json(_COMPAT_ANSWER, "KapokMQ's envelope")},
                security=[{"secretKey": []}],
                requestBody=_form_body("messageData", "topic", "delayTime"),
            )
        },
        "/Registry/GetNodes": {
            "post": _op(
                "Live masters, in the KapokMQ registry's shape", "kapokmq", {"200": _json({"type": "array"})}
            )
        },
        "/Console/Ping": {"post": _compat_console("KapokMQ console: ping")},
        "/Console/GetClients": {"post": _compat_console("KapokMQ console: connected clients")},
        "/Console/GetConfig": {"post": _compat_console("KapokMQ console: configuration")},
        "/Console/GetNodes": {"post": _compat_console("KapokMQ console: live members")},
        "/Console/GetMessageList": {
            "post": _compat_console(
                "KapokMQ console: messages by filter, paged",
                *("topic", "status", "startTime", "endTime", "page", "pageSize"),
            )
        },
        "/Console/GetMessage": {"post": _compat_console("KapokMQ console: one message", "messageCode")},
        "/Console/DelMessage": {"post": _compat_console("KapokMQ console: delete", "messageCode")},
        "/Console/CountMessage": {"post": _compat_console("KapokMQ console: counts by status")},
        "/": {"get": _console_page("The console (to its overview, or the login page)")},
        "/console": {"get": _console_page("The console")},
        "/console/": {"get": _console_page("The console")},
        "/console/login": {
            "get": _op(
                "The login form",
                "console",
                {"200": {"description": "The page (HTML)"}, "302": {"description": "Already logged in"}},
            ),
            "post": _op(
                "Log in with the secret key",
                "console",
                {
                    "303": {"description": "Logged in"},
                    "401": {"description": "Wrong key"},
                    "403": {"description": "The form expired"},
                    "429": {"description": "Too many wrong keys"},
                },
                requestBody=_form_body("key", "login_token", "next"),
            ),
        },
        "/console/logout": {
            "post": _op(
                "Log out",
                "console",
                {"303": {"description": "Logged out"}, **_errors(401, 403)},
                security=[{"console": []}],
            )
        },
        "/console/overview": {"get": _console_page("Overview page")},
        "/console/cluster": {"get": _console_page("Cluster page")},
        "/console/topics": {"get": _console_page("Topics page")},
        "/console/clients": {"get": _console_page("Clients page")},
        "/console/analytics": {"get": _console_page("Analytics page")},
        "/console/messages": {"get": _console_page("Message search page", [code_query])},
        "/console/messages/{code}": {"get": _console_page("One message", [code])},
        "/console/messages/{code}/delete": {"post": _console_action("Delete a message")},
        "/console/messages/{code}/requeue": {"post": _console_action("Requeue a dead letter")},
        "/console/api/overview": {"get": _console_api("The overview's figures")},
        "/console/api/cluster": {"get": _console_api("The cluster's members")},
        "/console/api/topics": {"get": _console_api("Topics and groups")},
        "/console/api/clients": {"get": _console_api("Connections and subscriptions")},
        "/console/api/analytics": {"get": _console_api("The analytics figures")},
        "/console/api/analytics/summary": {
            "get": _op(
                "This node's own analytics summary (null without one), read by the other members",
                "console",
                {"200": _json(_OBJ), **_errors(401, 429)},
                security=[{"console": []}, {"bearer": []}],
            )
        },
        "/console/api/messages": {"get": _console_api("Message search", [code_query])},
        "/console/api/messages/{code}": {"get": _console_api("One message", [code])},
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
