"""Operational routes: health and Prometheus metrics (the cluster view is in cluster_view.py).

These carry no message data, so they need no key (load balancers and
scrapers call them); everything that does carry data is authenticated.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kapok import __version__
from kapok.server.keys import REGISTRY, SERVICE
from kapok.server.responses import json_response

__all__ = ["routes"]

routes = web.RouteTableDef()


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    cfg = service.config
    return json_response(
        {
            "status": "ok",
            "node": service.node_name,
            "role": cfg.replication.role,
            "active": cfg.replication.role == "master",
            "version": __version__,
            "uptime_s": round(service.now() - service.started_at, 3),
            "clients": len(service.clients),
        }
    )


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
