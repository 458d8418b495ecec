"""``/openapi.json`` documents every HTTP route of a node, and only those."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from kapok.server.routes.openapi import document

# Served by prefix (any file under it), which OpenAPI cannot list route by route.
UNDOCUMENTED_PREFIXES = ("/console/static",)
# aiohttp answers HEAD for the GET routes added with add_get; HEAD is GET without a body.
IGNORED_METHODS = ("HEAD", "OPTIONS")


def router_routes(app: web.Application) -> set[tuple[str, str]]:
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter") or info.get("prefix")
        if route.method in IGNORED_METHODS or not path or path.startswith(UNDOCUMENTED_PREFIXES):
            continue
        out.add((route.method, path))
    return out


def documented_routes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}


async def test_the_document_lists_exactly_the_routers_routes(node: Any) -> None:
    in_router = router_routes(node.app)
    in_document = documented_routes(document(node.service.config))
    assert in_router - in_document == set(), "routes without documentation"
    assert in_document - in_router == set(), "documented routes the node does not have"
    assert len(in_router) > 50


async def test_every_operation_says_what_it_answers(node: Any) -> None:
    doc = document(node.service.config)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["summary"] and op["responses"], (method, path)
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    assert "{" + param["name"] + "}" in path, (method, path, param)
            templated = {part[1:-1] for part in path.split("/") if part.startswith("{")}
            assert templated <= {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}, path


async def test_served_without_a_key_with_the_nodes_own_limits(make_node: Any) -> None:
    node = await make_node("server.long_poll_max_s=2.5", "server.max_batch=7")
    async with aiohttp.ClientSession() as session, session.get(node.url + "/openapi.json") as resp:
        assert resp.status == 200
        doc = await resp.json()
    assert doc["openapi"].startswith("3.")
    pull = doc["paths"]["/v1/topics/{topic}/messages"]["get"]
    wait = next(p for p in pull["parameters"] if p["name"] == "wait")
    assert wait["schema"]["maximum"] == 2.5
    body = doc["paths"]["/v1/topics/{topic}/messages"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["oneOf"][1]["properties"]["messages"]["maxItems"] == 7
